"""A simulated Triton server running specops's LLM API model (``tensorrt_llm``).

KServe v2 on the HTTP port (health, model metadata and readiness, the generate extension),
Prometheus on the metrics port (``--metrics-port``): Triton's core ``nv_inference_*`` counters
and the model's own ``specops_*`` metrics. Triton starts its endpoints only after its startup
models have loaded, so connections are refused until the engine is ready.
"""

from __future__ import annotations

from aiohttp import web

from specops_local.sim.engines.base import BadRequest, SimEngine, float_field, int_field, json_body
from specops_local.sim.engines.config import TRITON_MODEL
from specops_local.sim.metrics import Exposition

MODEL_VERSION = "1"


class TritonEngine(SimEngine):
    backend = "triton"
    listen_fraction = 1.0

    @property
    def separate_metrics_port(self) -> bool:
        return True

    def add_routes(self, app: web.Application) -> None:
        get, post = app.router.add_get, app.router.add_post
        get("/v2/health/live", self._handle_ok)
        get("/v2/health/ready", self._handle_ready)
        get("/v2", self._handle_server_metadata)
        for prefix in (f"/v2/models/{TRITON_MODEL}", f"/v2/models/{TRITON_MODEL}/versions/{MODEL_VERSION}"):
            get(prefix, self._handle_model_metadata)
            get(prefix + "/ready", self._handle_ready)
            post(prefix + "/generate", self._handle_generate)

    def error_response(self, status: int, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status)

    async def _handle_ok(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _handle_ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def _handle_server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"name": "triton", "version": "2.61.0", "extensions": ["generate", "statistics"]}
        )

    async def _handle_model_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": TRITON_MODEL,
                "versions": [MODEL_VERSION],
                "platform": "python",
                "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [-1, 1]}],
                "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [-1, -1]}],
            }
        )

    async def _handle_generate(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        prompt = body.get("text_input")
        if not isinstance(prompt, str):
            raise BadRequest("missing or non-string input 'text_input'")
        max_tokens = int_field(body, "sampling_param_max_tokens", 16)
        temperature = float_field(body, "sampling_param_temperature", 1.0)
        text = await self.complete(prompt, max_tokens, temperature)
        return web.json_response(
            {"model_name": TRITON_MODEL, "model_version": MODEL_VERSION, "text_output": text}
        )

    def render_metrics(self, out: Exposition) -> None:
        t = self.totals
        labels = {"model": TRITON_MODEL, "version": MODEL_VERSION}
        out.metric("nv_inference_request_success", "counter", labels, t.requests)
        out.metric("nv_inference_request_failure", "counter", labels, t.failures)
        out.metric("nv_inference_count", "counter", labels, t.requests)
        out.metric("nv_inference_exec_count", "counter", labels, t.requests)
        out.metric("nv_inference_request_duration_us", "counter", labels, round(t.requests * 150.0))
        out.metric("nv_inference_queue_duration_us", "counter", labels, round(t.requests * 20.0))
        out.metric("nv_inference_pending_request_count", "gauge", labels, 0)
        out.metric("specops_num_requests_running", "gauge", labels, self.batch if self.ready else 0)
        out.histogram("specops_time_per_output_token_seconds", labels, t.request_tpot)
        out.metric("specops_spec_decode_draft_tokens_total", "counter", labels, t.draft_tokens)
        out.metric("specops_spec_decode_accepted_tokens_total", "counter", labels, t.accepted_tokens)
        out.metric("specops_generation_tokens_total", "counter", labels, t.generation_tokens)
        out.metric("specops_request_success_total", "counter", labels, t.requests)
