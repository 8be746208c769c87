"""TensorRT-LLM's PyTorch backend: trtllm-serve, and Triton's LLM API model (same LLM arguments).

The speculative config is YAML: trtllm-serve reads it through ``--config``; Triton's LLM API
model reads ``model.yaml`` from its repository and passes every key but ``triton_config`` to
``LLM(...)``. ``draft_len_schedule`` keys are upper batch edges: a batch b drafts the K of the
first key >= b, K = 0 above the last key; the smallest key's K must equal ``max_draft_len``.
"""

from __future__ import annotations

from typing import Any

import yaml

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

DECODING_TYPES: dict[str, str] = {
    "draftModel": "Draft_Target",
    "eagle3": "Eagle3",
    "mtp": "MTP",
    "ngram": "NGram",
}
ALL_METHODS: frozenset[Method] = frozenset({"draftModel", "eagle3", "mtp", "ngram"})
TRITON_MODEL = "tensorrt_llm"
TRITON_REPOSITORY = "/models/llmapi_repo"


def draft_len_schedule(schedule: Schedule) -> dict[int, int]:
    """The canonical schedule as ``draft_len_schedule``: upper edges, K = 0 implied above the last.

    A trailing K = 0 band is left out (the engine drafts nothing above the last key); an
    unbounded band with K > 0 ends at MAX_BATCH.
    """
    result: dict[int, int] = {}
    for edge, k in schedule.bands:
        if k == 0:
            break
        result[MAX_BATCH if edge is None else edge] = k
    return result


def llm_arguments(revision: Revision) -> dict[str, Any]:
    """The LLM arguments both NVIDIA paths share: perf metrics on, and the speculative config."""
    args: dict[str, Any] = {"return_perf_metrics": True, "enable_iter_perf_stats": True}
    if revision.mode == "plain" or revision.schedule is None or revision.method is None:
        return args
    if revision.method in ("draftModel", "ngram"):
        args["disable_overlap_scheduler"] = True  # as the docs' DraftTarget and NGram examples
    speculative: dict[str, Any] = {
        "decoding_type": DECODING_TYPES[revision.method],
        "max_draft_len": revision.schedule.max_k,
    }
    if revision.method in ("draftModel", "eagle3"):
        speculative["speculative_model"] = DRAFT_PATH
    if revision.method == "ngram":
        speculative["max_matching_ngram_size"] = 4
        speculative["is_public_pool"] = True
    if len(revision.schedule.bands) > 1 or revision.schedule.bands[0][0] is not None:
        speculative["draft_len_schedule"] = draft_len_schedule(revision.schedule)
    args["speculative_config"] = speculative
    return args


_METRICS = MetricNames(
    running="trtllm_num_requests_running",
    tpot_histogram="trtllm_time_per_output_token_seconds",
    requests="trtllm_e2e_request_latency_seconds_count",
    drafted_tokens="trtllm_spec_decode_num_draft_tokens_total",
    accepted_tokens="trtllm_spec_decode_num_accepted_tokens_total",
    output_tokens="trtllm_generation_tokens_total",
)


class TrtllmServe:
    name = "trtllm-serve"
    default_image = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc13"
    methods = ALL_METHODS
    scheduled_methods = ALL_METHODS
    max_draft_len = 16
    ports: tuple[Port, ...] = (Port("http", 8000),)
    http_port = "http"
    metrics_port = "http"
    metrics_path = "/prometheus/metrics"
    ready_path = "/health"
    live_path = "/health"
    generate_path = "/v1/completions"
    metrics = _METRICS

    def container(self, revision: Revision, serving: ServingInputs) -> ContainerPlan:
        return ContainerPlan(
            command=("trtllm-serve",),
            args=(
                TARGET_PATH,
                "--host",
                "0.0.0.0",
                "--port",
                "8000",
                "--tp_size",
                str(serving.tensor_parallel),
                "--config",
                "/etc/specops/engine/config.yaml",
            ),
            files={"config.yaml": _yaml(llm_arguments(revision))},
        )


_TRITON_METRICS = MetricNames(
    running="specops_num_requests_running",
    tpot_histogram="specops_time_per_output_token_seconds",
    requests="specops_request_success_total",
    drafted_tokens="specops_spec_decode_draft_tokens_total",
    accepted_tokens="specops_spec_decode_accepted_tokens_total",
    output_tokens="specops_generation_tokens_total",
)


class Triton:
    """Triton with specops's own LLM API python model (assets/llmapi_model): the upstream model
    exports no speculation metrics, ours exports the ones above through Triton's custom metrics."""

    name = "triton"
    default_image = "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    methods = ALL_METHODS
    scheduled_methods = ALL_METHODS
    max_draft_len = 16
    ports: tuple[Port, ...] = (Port("http", 8000), Port("grpc", 8001), Port("metrics", 8002))
    http_port = "http"
    metrics_port = "metrics"
    metrics_path = "/metrics"
    ready_path = f"/v2/models/{TRITON_MODEL}/ready"
    live_path = "/v2/health/live"
    generate_path = f"/v2/models/{TRITON_MODEL}/generate"
    metrics = _TRITON_METRICS

    def __init__(self, model_source: str = "") -> None:
        self.model_source = model_source

    def model_yaml(self, revision: Revision, serving: ServingInputs) -> dict[str, Any]:
        return {
            "model": TARGET_PATH,
            "backend": "pytorch",
            "tensor_parallel_size": serving.tensor_parallel,
            "pipeline_parallel_size": 1,
            **llm_arguments(revision),
            "triton_config": {"max_batch_size": 0, "decoupled": False},
        }

    def container(self, revision: Revision, serving: ServingInputs) -> ContainerPlan:
        from specops.domain.engines.llmapi_repo import repository_files

        files = repository_files(_yaml(self.model_yaml(revision, serving)), self.model_source)
        return ContainerPlan(
            command=("mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"),
            args=(
                f"--model-repository={TRITON_REPOSITORY}",
                "--http-port=8000",
                "--grpc-port=8001",
                "--metrics-port=8002",
                "--disable-auto-complete-config",
                "--backend-config=python,shm-region-prefix-name=prefix0_",
            ),
            files=files,
            config_dir=TRITON_REPOSITORY,
        )


def _yaml(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
