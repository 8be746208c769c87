"""vLLM (V1, OpenAI server): every speculative setting in one ``--speculative-config`` JSON.

``num_speculative_tokens_per_batch_size`` is a list of inclusive ``[start, end, K]`` ranges, the
first starting at 1; batches above the last range keep its K (no implicit 0), so a K = 0 tail is
written out. ``num_speculative_tokens`` is the largest K and sizes the buffers.
"""

from __future__ import annotations

import json
from typing import Any

from specops.domain.engines.base import (
    DRAFT_PATH,
    MAX_BATCH,
    TARGET_PATH,
    ContainerPlan,
    MetricNames,
    Port,
    ServingInputs,
)
from specops.domain.engines.schedule import Method, Revision, Schedule

METHODS: dict[str, str] = {"draftModel": "draft_model", "eagle3": "eagle3", "mtp": "mtp", "ngram": "ngram"}


def per_batch_size(schedule: Schedule) -> list[list[int]]:
    """The canonical schedule as vLLM's inclusive ranges."""
    ranges: list[list[int]] = []
    start = 1
    for edge, k in schedule.bands:
        end = max(start, MAX_BATCH) if edge is None else edge
        ranges.append([start, end, k])
        start = end + 1
    return ranges


def speculative_config(revision: Revision) -> dict[str, Any] | None:
    if revision.mode == "plain" or revision.schedule is None or revision.method is None:
        return None
    config: dict[str, Any] = {
        "method": METHODS[revision.method],
        "num_speculative_tokens": revision.schedule.max_k,
    }
    if revision.method in ("draftModel", "eagle3"):
        config["model"] = DRAFT_PATH
    if revision.method == "ngram":
        config["prompt_lookup_max"] = 4
    if len(revision.schedule.bands) > 1:
        config["num_speculative_tokens_per_batch_size"] = per_batch_size(revision.schedule)
    return config


class Vllm:
    name = "vllm"
    default_image = "vllm/vllm-openai:v0.27.1"
    methods: frozenset[Method] = frozenset({"draftModel", "eagle3", "mtp", "ngram"})
    scheduled_methods: frozenset[Method] = frozenset({"draftModel", "eagle3", "mtp", "ngram"})
    max_draft_len = 16
    ports: tuple[Port, ...] = (Port("http", 8000),)
    http_port = "http"
    metrics_port = "http"
    metrics_path = "/metrics"
    ready_path = "/health"
    live_path = "/health"
    generate_path = "/v1/completions"
    metrics = MetricNames(
        running="vllm:num_requests_running",
        tpot_histogram="vllm:inter_token_latency_seconds",
        requests="vllm:e2e_request_latency_seconds_count",
        drafted_tokens="vllm:spec_decode_num_draft_tokens_total",
        accepted_tokens="vllm:spec_decode_num_accepted_tokens_total",
        draft_steps="vllm:spec_decode_num_drafts_total",
        output_tokens="vllm:generation_tokens_total",
    )

    def container(self, revision: Revision, serving: ServingInputs) -> ContainerPlan:
        args = [
            TARGET_PATH,
            "--served-model-name",
            serving.served_model_name,
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--tensor-parallel-size",
            str(serving.tensor_parallel),
        ]
        config = speculative_config(revision)
        if config is not None:
            args += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
        return ContainerPlan(command=("vllm", "serve"), args=tuple(args))
