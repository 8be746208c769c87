"""A simulated trtllm-serve: answers 503 "starting" while loading; /prometheus/metrics on the API port."""

from __future__ import annotations

from aiohttp import web

from specops_local.sim.engines.openai import OpenAIEngine
from specops_local.sim.metrics import Exposition

STATE_HEADER = "x-trtllm-server-state"


class TrtllmServeEngine(OpenAIEngine):
    backend = "trtllm-serve"
    listen_fraction = 0.0
    metrics_path = "/prometheus/metrics"

    def add_routes(self, app: web.Application) -> None:
        super().add_routes(app)
        app.router.add_get("/health_generate", self._handle_health)

    @property
    def metrics_mounted(self) -> bool:
        return bool(self.config.options.get("return_perf_metrics"))

    def starting_response(self) -> web.Response:
        return web.json_response({"detail": "starting"}, status=503, headers={STATE_HEADER: "starting"})

    def render_metrics(self, out: Exposition) -> None:
        t = self.totals
        labels = {"model_name": self.config.served_model_name, "engine_type": "llm"}
        spec = self.spec
        out.metric(
            "trtllm_speculative_config_info",
            "gauge",
            {
                **labels,
                "spec_enabled": "true" if spec else "false",
                "spec_method": spec.method if spec else "",
                "spec_num_tokens": str(spec.max_k if spec else 0),
                "spec_draft_model": (spec.draft_model or "") if spec else "",
            },
            1,
        )
        out.histogram("trtllm_time_per_output_token_seconds", labels, t.request_tpot)
        out.histogram("trtllm_e2e_request_latency_seconds", labels, t.e2e)
        out.metric("trtllm_generation_tokens_total", "counter", labels, t.generation_tokens)
        out.metric("trtllm_prompt_tokens_total", "counter", labels, t.prompt_tokens)
        out.family("trtllm_request_success_total", "counter", "finished requests")
        out.sample("trtllm_request_success_total", {**labels, "finished_reason": "length"}, t.requests)
        if not self.config.options.get("enable_iter_perf_stats"):
            return  # iteration-level gauges and counters need enable_iter_perf_stats
        out.metric("trtllm_num_requests_running", "gauge", labels, self.batch if self.ready else 0)
        out.metric("trtllm_num_requests_waiting", "gauge", labels, self.waiting if self.ready else 0)
        if spec is not None:
            out.metric("trtllm_spec_decode_num_draft_tokens_total", "counter", labels, t.draft_tokens)
            out.metric("trtllm_spec_decode_num_accepted_tokens_total", "counter", labels, t.accepted_tokens)
            out.metric("trtllm_spec_decode_acceptance_length", "gauge", labels, t.last_accept_length)
