"""A simulated ``vllm serve``: refuses connections while loading, metrics on /metrics of the API port."""

from __future__ import annotations

from specops_local.sim.engines.openai import OpenAIEngine
from specops_local.sim.metrics import Exposition


class VllmEngine(OpenAIEngine):
    backend = "vllm"
    listen_fraction = 1.0
    check_model_name = True

    def render_metrics(self, out: Exposition) -> None:
        t = self.totals
        labels = {"model_name": self.config.served_model_name, "engine": "0"}
        out.metric("vllm:num_requests_running", "gauge", labels, self.batch if self.ready else 0)
        out.metric("vllm:num_requests_waiting", "gauge", labels, self.waiting if self.ready else 0)
        out.metric("vllm:generation_tokens_total", "counter", labels, t.generation_tokens)
        out.metric("vllm:prompt_tokens_total", "counter", labels, t.prompt_tokens)
        out.family("vllm:request_success_total", "counter", "finished requests")
        out.sample("vllm:request_success_total", {**labels, "finished_reason": "length"}, t.requests)
        if self.spec is not None:
            out.metric("vllm:spec_decode_num_drafts_total", "counter", labels, t.spec_steps)
            out.metric("vllm:spec_decode_num_draft_tokens_total", "counter", labels, t.draft_tokens)
            out.metric("vllm:spec_decode_num_accepted_tokens_total", "counter", labels, t.accepted_tokens)
        out.histogram("vllm:inter_token_latency_seconds", labels, t.token_tpot)
        out.histogram("vllm:request_time_per_output_token_seconds", labels, t.request_tpot)
        out.histogram("vllm:e2e_request_latency_seconds", labels, t.e2e)
