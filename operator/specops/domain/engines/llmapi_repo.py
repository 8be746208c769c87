"""The Triton model repository of the ``triton`` backend: one python-backend model, ``tensorrt_llm``.

Layout (mounted from the ``engine-config`` ConfigMap at the server's ``--model-repository``)::

    tensorrt_llm/config.pbtxt    this module's model config
    tensorrt_llm/1/model.py      specops's own LLM API model (assets/llmapi_model/model.py)
    tensorrt_llm/1/model.yaml    LLM(...) arguments, plus ``triton_config``

The model's inputs and outputs carry the names of TensorRT-LLM's ``llmapi`` template
(``text_input``, ``sampling_param_*``, ``streaming``, ``stop`` in; ``text_output`` and the
per-request speculation counts out), so clients of the upstream model work unchanged.

The server runs with ``--disable-auto-complete-config``, so the model's ``auto_complete_config``
hook is never called: everything Triton needs (``max_batch_size``, the transaction policy)
is written here rather than taken from ``model.yaml``'s ``triton_config``.

Configs are built as dicts in Triton's JSON model-config form (protobuf field names) and
rendered to protobuf text format. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MODEL_NAME = "tensorrt_llm"
MODEL_VERSION = "1"
CONFIG_PATH = f"{MODEL_NAME}/config.pbtxt"
MODEL_SOURCE_PATH = f"{MODEL_NAME}/{MODEL_VERSION}/model.py"
MODEL_YAML_PATH = f"{MODEL_NAME}/{MODEL_VERSION}/model.yaml"

_MAP_FIELDS = frozenset({"parameters", "input_map", "output_map"})
_ENUM_FIELDS = frozenset({"data_type", "kind"})


def _tensor(name: str, data_type: str, dims: list[int], optional: bool = False) -> dict[str, Any]:
    tensor: dict[str, Any] = {"name": name, "data_type": data_type, "dims": dims}
    if optional:
        tensor["optional"] = True
    return tensor


def model_inputs() -> list[dict[str, Any]]:
    """What the model reads: the prompt and the sampling parameters that matter for serving."""
    return [
        _tensor("text_input", "TYPE_STRING", [-1]),
        _tensor("streaming", "TYPE_BOOL", [1], optional=True),
        _tensor("sampling_param_temperature", "TYPE_FP32", [1], optional=True),
        _tensor("sampling_param_top_k", "TYPE_INT32", [1], optional=True),
        _tensor("sampling_param_top_p", "TYPE_FP32", [1], optional=True),
        _tensor("sampling_param_max_tokens", "TYPE_INT32", [1], optional=True),
        _tensor("sampling_param_stop", "TYPE_STRING", [-1], optional=True),
        _tensor("sampling_param_seed", "TYPE_UINT64", [1], optional=True),
        _tensor("sampling_param_return_perf_metrics", "TYPE_BOOL", [1], optional=True),
        _tensor("stop", "TYPE_BOOL", [1], optional=True),
    ]


def model_outputs() -> list[dict[str, Any]]:
    """What the model writes: the generated text and the request's speculation counts."""
    return [
        _tensor("text_output", "TYPE_STRING", [-1]),
        _tensor("acceptance_rate", "TYPE_FP32", [1]),
        _tensor("total_accepted_draft_tokens", "TYPE_INT32", [1]),
        _tensor("total_draft_tokens", "TYPE_INT32", [1]),
    ]


def model_config() -> dict[str, Any]:
    """The ``tensorrt_llm`` model in JSON model-config form.

    ``max_batch_size`` 0: Triton does not batch; the model hands each request to the LLM API,
    which batches in flight. One CPU instance: each instance would build its own engine.
    Not decoupled: one response per request (sent when the request finishes).
    """
    return {
        "name": MODEL_NAME,
        "backend": "python",
        "max_batch_size": 0,
        "model_transaction_policy": {"decoupled": False},
        "input": model_inputs(),
        "output": model_outputs(),
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
    }


def config_pbtxt() -> str:
    """``tensorrt_llm/config.pbtxt``."""
    return to_pbtxt(model_config())


def repository_files(model_yaml: str, model_source: str) -> dict[str, str]:
    """Relative path -> text of every file of the repository, sorted by path."""
    files = {CONFIG_PATH: config_pbtxt(), MODEL_SOURCE_PATH: model_source, MODEL_YAML_PATH: model_yaml}
    return dict(sorted(files.items()))


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
