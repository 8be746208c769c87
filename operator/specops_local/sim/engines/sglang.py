"""A simulated SGLang server: refused, then 503 through warm-up; /generate and metrics on the API port."""

from __future__ import annotations

from aiohttp import web

from specops_local.sim.engines.base import BadRequest, float_field, int_field, json_body
from specops_local.sim.engines.openai import OpenAIEngine
from specops_local.sim.metrics import Exposition


class SglangEngine(OpenAIEngine):
    backend = "sglang"
    listen_fraction = 0.8
    """The HTTP server starts once the model processes are up; warm-up (503) is the rest."""

    def add_routes(self, app: web.Application) -> None:
        super().add_routes(app)
        app.router.add_get("/health_generate", self._handle_health)
        app.router.add_post("/generate", self._handle_generate)
        app.router.add_get("/server_info", self._handle_server_info)

    def health_paths(self) -> frozenset[str]:
        return frozenset({"/health", "/health_generate"})

    def render_metrics(self, out: Exposition) -> None:
        if not self.config.options.get("enable_metrics"):
            return  # without --enable-metrics the route answers with nothing to scrape
        t = self.totals
        labels = {"model_name": self.config.served_model_name}
        out.metric("sglang:num_running_reqs", "gauge", labels, self.batch if self.ready else 0)
        out.metric("sglang:num_queue_reqs", "gauge", labels, self.waiting if self.ready else 0)
        out.metric("sglang:generation_tokens_total", "counter", labels, t.generation_tokens)
        out.metric("sglang:prompt_tokens_total", "counter", labels, t.prompt_tokens)
        out.metric("sglang:num_requests_total", "counter", labels, t.requests)
        if self.spec is not None:
            out.metric("sglang:spec_verify_calls_total", "counter", labels, t.verify_calls)
            out.metric("sglang:spec_accept_length", "gauge", labels, t.last_accept_length)
            out.metric("sglang:spec_accept_rate", "gauge", labels, t.last_accept_rate)
            out.metric("sglang:spec_num_steps", "gauge", labels, self.k)
            out.metric("sglang:spec_num_draft_tokens", "gauge", labels, self.k + 1 if self.k else 0)
        out.histogram("sglang:inter_token_latency_seconds", labels, t.token_tpot)
        out.histogram("sglang:e2e_request_latency_seconds", labels, t.e2e)

    async def _handle_generate(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        text = body.get("text")
        if not isinstance(text, str):
            raise BadRequest("text must be a string")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        max_tokens = int_field(params, "max_new_tokens", 128)
        temperature = float_field(params, "temperature", 1.0)
        output = await self.complete(text, max_tokens, temperature)
        meta: dict[str, object] = {"prompt_tokens": len(text.split()), "completion_tokens": max_tokens}
        if self.spec is not None:
            meta["spec_verify_ct"] = max(1, round(max_tokens / max(1.0, self.totals.last_accept_length)))
        return web.json_response({"text": output, "meta_info": meta})

    async def _handle_server_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": self.config.model,
                "speculative_algorithm": self.spec.method if self.spec else None,
                "internal_states": [{"speculative_num_steps": self.k}],
            }
        )
