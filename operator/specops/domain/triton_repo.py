"""The Triton model repository a serving pod loads: four model configurations.

Models (names are what the BLS and the operator's model-control calls use):

- ``tensorrt_llm``: the target engine (backend ``tensorrtllm``) at /engines/target;
- ``tensorrt_llm_draft``: the draft engine at /engines/draft, same backend;
- ``tensorrt_llm_bls``: specops's own python-backend BLS, which tokenizes, runs the
  draft-target loop with a per-request ``num_draft_tokens`` and counts drafted and
  accepted tokens with Triton's custom-metrics API;
- ``ensemble``: a one-step ensemble in front of the BLS, so clients that speak to
  ``ensemble`` (genai-perf, the usual TensorRT-LLM client examples) keep working and
  Triton's per-model request counters for ``ensemble`` count user requests only.

The BLS tokenizes itself (``tokenizer_dir``), so there are no separate
preprocessing/postprocessing models: a speculative loop re-submits the sequence
as token ids at every step, and a tokenizer round trip per step would only add
latency. Both engines run with ``exclude_input_in_output=false`` because the BLS
reads the whole sequence back after every step, as the backend's own BLS does.

Each configuration is built once as a dict in Triton's JSON model-config form
(protobuf field names), which is what the repository load API takes as a config
override, and rendered to protobuf text format for ``config.pbtxt``. Pure: no I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

TARGET_MODEL = "tensorrt_llm"
DRAFT_MODEL = "tensorrt_llm_draft"
BLS_MODEL = "tensorrt_llm_bls"
ENSEMBLE_MODEL = "ensemble"
MODEL_NAMES = (TARGET_MODEL, DRAFT_MODEL, BLS_MODEL, ENSEMBLE_MODEL)
"""Every model of the repository, in the order the server loads them."""

MODEL_REPOSITORY_PATH = "/models"
TARGET_ENGINE_PATH = "/engines/target"
DRAFT_ENGINE_PATH = "/engines/draft"
TOKENIZER_SUBDIR = "tokenizer"
"""The target engine directory must hold the Hugging Face tokenizer files in this subdirectory."""

BLS_SOURCE_PATH = f"{BLS_MODEL}/1/model.py"
EXECUTOR_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"

# BLS parameter names (read by assets/tensorrt_llm_bls/model.py).
P_TARGET_MODEL_NAME = "tensorrt_llm_model_name"
P_DRAFT_MODEL_NAME = "tensorrt_llm_draft_model_name"
P_DEFAULT_NUM_DRAFT_TOKENS = "specops_default_num_draft_tokens"
P_MAX_DRAFT_LEN = "specops_max_draft_len"
P_DEPLOYMENT = "specops_deployment"
P_VARIANT = "specops_variant"
P_DRAFT_VERSION = "specops_draft_version"
P_TOKENIZER_DIR = "tokenizer_dir"

_MAP_FIELDS = frozenset({"parameters", "input_map", "output_map"})
_ENUM_FIELDS = frozenset({"data_type", "kind"})


@dataclass(frozen=True)
class RepositorySettings:
    """Everything the four configurations depend on.

    The KV-cache fractions are fractions of the GPU memory still free when each
    engine loads; the target's is the larger share because it serves every
    accepted token. ``bls_instance_count`` bounds the requests a pod decodes at
    once: a python-backend instance is busy for a request's whole decode loop.
    """

    deployment: str
    variant: str
    draft_version: str
    default_num_draft_tokens: int
    max_draft_len: int
    tensor_parallel: int = 1
    draft_model_name: str = DRAFT_MODEL
    max_batch_size: int = 64
    bls_instance_count: int = 64
    target_kv_cache_free_gpu_mem_fraction: float = 0.5
    draft_kv_cache_free_gpu_mem_fraction: float = 0.2

    def __post_init__(self) -> None:
        if not 0 <= self.default_num_draft_tokens <= self.max_draft_len:
            raise ValueError("default_num_draft_tokens must be between 0 and max_draft_len")
        if self.tensor_parallel < 1 or self.max_batch_size < 1 or self.bls_instance_count < 1:
            raise ValueError("tensor_parallel, max_batch_size and bls_instance_count must be positive")


def _tensor(
    name: str,
    data_type: str,
    dims: list[int],
    *,
    optional: bool = False,
    scalar: bool = False,
    ragged: bool = False,
) -> dict[str, Any]:
    tensor: dict[str, Any] = {"name": name, "data_type": data_type, "dims": dims}
    if scalar:
        tensor["reshape"] = {"shape": []}
    if optional:
        tensor["optional"] = True
    if ragged:
        tensor["allow_ragged_batch"] = True
    return tensor


def _parameters(values: Mapping[str, str]) -> dict[str, dict[str, str]]:
    return {key: {"string_value": values[key]} for key in sorted(values)}


def engine_config(
    name: str, engine_path: str, kv_cache_free_gpu_mem_fraction: float, settings: RepositorySettings
) -> dict[str, Any]:
    """A tensorrtllm-backend model (target or draft) in JSON model-config form.

    Both engines share the pod's GPUs (``gpu_device_ids`` 0..TP-1); the pod runs the
    backend in orchestrator mode so two engines can live in one server process.
    """
    devices = ",".join(str(i) for i in range(settings.tensor_parallel))
    return {
        "name": name,
        "backend": "tensorrtllm",
        "max_batch_size": settings.max_batch_size,
        "model_transaction_policy": {"decoupled": False},
        "dynamic_batching": {
            "preferred_batch_size": [settings.max_batch_size],
            "max_queue_delay_microseconds": 0,
        },
        "input": [
            _tensor("input_ids", "TYPE_INT32", [-1], ragged=True),
            _tensor("input_lengths", "TYPE_INT32", [1], scalar=True),
            _tensor("request_output_len", "TYPE_INT32", [1]),
            _tensor("draft_input_ids", "TYPE_INT32", [-1], optional=True, ragged=True),
            _tensor("end_id", "TYPE_INT32", [1], optional=True, scalar=True),
            _tensor("pad_id", "TYPE_INT32", [1], optional=True, scalar=True),
            _tensor("temperature", "TYPE_FP32", [1], optional=True, scalar=True),
            _tensor("runtime_top_k", "TYPE_INT32", [1], optional=True, scalar=True),
            _tensor("runtime_top_p", "TYPE_FP32", [1], optional=True, scalar=True),
            _tensor("random_seed", "TYPE_UINT64", [1], optional=True, scalar=True),
            _tensor("streaming", "TYPE_BOOL", [1], optional=True),
        ],
        "output": [
            _tensor("output_ids", "TYPE_INT32", [-1, -1]),
            _tensor("sequence_length", "TYPE_INT32", [-1]),
            _tensor("cum_log_probs", "TYPE_FP32", [-1]),
            _tensor("output_log_probs", "TYPE_FP32", [-1, -1]),
            _tensor("context_logits", "TYPE_FP32", [-1, -1]),
            _tensor("generation_logits", "TYPE_FP32", [-1, -1, -1]),
        ],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": _parameters(
            {
                "gpt_model_type": "inflight_fused_batching",
                "gpt_model_path": engine_path,
                "max_beam_width": "1",
                "batch_scheduler_policy": "guaranteed_no_evict",
                "kv_cache_free_gpu_mem_fraction": f"{kv_cache_free_gpu_mem_fraction:g}",
                "enable_kv_cache_reuse": "true",
                "exclude_input_in_output": "false",
                "gpu_device_ids": devices,
                "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
                "executor_worker_path": EXECUTOR_WORKER_PATH,
            }
        ),
    }


def _request_inputs() -> list[dict[str, Any]]:
    """Inputs of the BLS and of the ensemble in front of it."""
    return [
        _tensor("text_input", "TYPE_STRING", [1]),
        _tensor("max_tokens", "TYPE_INT32", [1]),
        _tensor("num_draft_tokens", "TYPE_INT32", [1], optional=True),
        _tensor("end_id", "TYPE_INT32", [1], optional=True),
        _tensor("pad_id", "TYPE_INT32", [1], optional=True),
        _tensor("temperature", "TYPE_FP32", [1], optional=True),
        _tensor("top_k", "TYPE_INT32", [1], optional=True),
        _tensor("top_p", "TYPE_FP32", [1], optional=True),
        _tensor("random_seed", "TYPE_UINT64", [1], optional=True),
        _tensor("stream", "TYPE_BOOL", [1], optional=True),
    ]


def _request_outputs() -> list[dict[str, Any]]:
    return [_tensor("text_output", "TYPE_STRING", [-1])]


def bls_parameters(settings: RepositorySettings) -> dict[str, str]:
    """The BLS's parameters: model names, the default draft length, its clamp, and metric labels."""
    return {
        P_TARGET_MODEL_NAME: TARGET_MODEL,
        P_DRAFT_MODEL_NAME: settings.draft_model_name,
        P_DEFAULT_NUM_DRAFT_TOKENS: str(settings.default_num_draft_tokens),
        P_MAX_DRAFT_LEN: str(settings.max_draft_len),
        P_DEPLOYMENT: settings.deployment,
        P_VARIANT: settings.variant,
        P_DRAFT_VERSION: settings.draft_version,
        P_TOKENIZER_DIR: f"{TARGET_ENGINE_PATH}/{TOKENIZER_SUBDIR}",
    }


def bls_config(settings: RepositorySettings) -> dict[str, Any]:
    """The BLS model in JSON model-config form.

    This is also the config override the operator sends to Triton's load API to
    change the default draft length or the draft model at run time: build it with
    ``dataclasses.replace(settings, default_num_draft_tokens=..., draft_model_name=...)``.
    """
    return {
        "name": BLS_MODEL,
        "backend": "python",
        "max_batch_size": settings.max_batch_size,
        "model_transaction_policy": {"decoupled": False},
        "input": _request_inputs(),
        "output": _request_outputs(),
        "instance_group": [{"count": settings.bls_instance_count, "kind": "KIND_CPU"}],
        "parameters": _parameters(bls_parameters(settings)),
    }


def ensemble_config(settings: RepositorySettings) -> dict[str, Any]:
    """A single-step ensemble forwarding every input to the BLS."""
    inputs = _request_inputs()
    outputs = _request_outputs()
    return {
        "name": ENSEMBLE_MODEL,
        "platform": "ensemble",
        "max_batch_size": settings.max_batch_size,
        "input": inputs,
        "output": outputs,
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": BLS_MODEL,
                    "model_version": -1,
                    "input_map": {t["name"]: t["name"] for t in inputs},
                    "output_map": {t["name"]: t["name"] for t in outputs},
                }
            ]
        },
    }


def model_configs(settings: RepositorySettings) -> dict[str, dict[str, Any]]:
    """Model name -> JSON model config, for every model of the repository."""
    return {
        TARGET_MODEL: engine_config(
            TARGET_MODEL, TARGET_ENGINE_PATH, settings.target_kv_cache_free_gpu_mem_fraction, settings
        ),
        DRAFT_MODEL: engine_config(
            DRAFT_MODEL, DRAFT_ENGINE_PATH, settings.draft_kv_cache_free_gpu_mem_fraction, settings
        ),
        BLS_MODEL: bls_config(settings),
        ENSEMBLE_MODEL: ensemble_config(settings),
    }


_VERSION_PLACEHOLDER = (
    "Version directory of a model whose weights live outside the repository "
    "(engines under /engines, the ensemble has none). Triton needs the directory to exist.\n"
)


def repository_files(settings: RepositorySettings, bls_source: str) -> dict[str, str]:
    """Relative path -> text of every file of the model repository, sorted by path.

    Every model needs a version directory ``1/``; a ConfigMap cannot project an
    empty directory, so models without files of their own get a placeholder.
    """
    files = dict(_configs_shared_by_every_resource(_unnamed(settings)))
    files[f"{BLS_MODEL}/config.pbtxt"] = to_pbtxt(bls_config(settings))
    files[BLS_SOURCE_PATH] = bls_source
    for name in (TARGET_MODEL, DRAFT_MODEL, ENSEMBLE_MODEL):
        files[f"{name}/1/README"] = _VERSION_PLACEHOLDER
    return dict(sorted(files.items()))


def _unnamed(settings: RepositorySettings) -> RepositorySettings:
    """The settings without what only the BLS's metric labels carry (whose resource, variant, draft)."""
    return replace(settings, deployment="", variant="", draft_version="")


@functools.lru_cache(maxsize=64)
def _configs_shared_by_every_resource(settings: RepositorySettings) -> tuple[tuple[str, str], ...]:
    """The target's, the draft's and the ensemble's config.pbtxt: they name no resource, so
    thousands of resources of one shape render them once (a tenth of a reconcile's CPU)."""
    return tuple(
        (f"{name}/config.pbtxt", to_pbtxt(config))
        for name, config in model_configs(settings).items()
        if name != BLS_MODEL
    )


# ---------------------------------------------------------------- protobuf text format


def _quote(text: str) -> str:
    """A protobuf text-format string literal (non-ASCII bytes as octal escapes)."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in {'"', "\\"}:
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _scalar(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return value if key in _ENUM_FIELDS else _quote(value)
    raise TypeError(f"cannot render {key}={value!r} in protobuf text format")


def _message_lines(message: Mapping[str, Any], indent: int) -> list[str]:
    pad = "  " * indent
    lines: list[str] = []
    for key, value in message.items():
        if key in _MAP_FIELDS:
            for map_key, map_value in value.items():
                lines.append(f"{pad}{key} {{")
                lines.append(f"{pad}  key: {_quote(map_key)}")
                if isinstance(map_value, Mapping):
                    lines.append(f"{pad}  value {{")
                    lines.extend(_message_lines(map_value, indent + 2))
                    lines.append(f"{pad}  }}")
                else:
                    lines.append(f"{pad}  value: {_scalar('value', map_value)}")
                lines.append(f"{pad}}}")
        elif isinstance(value, Mapping):
            lines.append(f"{pad}{key} {{")
            lines.extend(_message_lines(value, indent + 1))
            lines.append(f"{pad}}}")
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            for item in value:
                lines.append(f"{pad}{key} {{")
                lines.extend(_message_lines(item, indent + 1))
                lines.append(f"{pad}}}")
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [{', '.join(_scalar(key, v) for v in value)}]")
        else:
            lines.append(f"{pad}{key}: {_scalar(key, value)}")
    return lines


def to_pbtxt(config: Mapping[str, Any]) -> str:
    """Render a JSON-form model config as the protobuf text format of ``config.pbtxt``."""
    return "\n".join(_message_lines(config, 0)) + "\n"
