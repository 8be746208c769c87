"""The ``triton`` backend's model repository (domain/engines/llmapi_repo.py).

The config must parse as Triton's ModelConfig, carry the upstream llmapi template's names and
types for every input and output it declares, and declare exactly what specops's model
(assets/llmapi_model/model.py) reads and writes.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from specops.assets import llmapi_model_source
from specops.domain.engines import llmapi_repo
from tests.unit import triton_stub as pb

MODEL_PATH = Path(__file__).parents[2] / "operator" / "specops" / "assets" / "llmapi_model" / "model.py"

UPSTREAM_INPUTS = {
    # name: (data_type, dims), as TensorRT-LLM's all_models/llmapi/tensorrt_llm/config.pbtxt declares them
    "text_input": ("TYPE_STRING", [-1]),
    "streaming": ("TYPE_BOOL", [1]),
    "sampling_param_best_of": ("TYPE_INT32", [1]),
    "sampling_param_temperature": ("TYPE_FP32", [1]),
    "sampling_param_top_k": ("TYPE_INT32", [1]),
    "sampling_param_top_p": ("TYPE_FP32", [1]),
    "sampling_param_frequency_penalty": ("TYPE_FP32", [1]),
    "sampling_param_presence_penalty": ("TYPE_FP32", [1]),
    "sampling_param_max_tokens": ("TYPE_INT32", [1]),
    "sampling_param_stop": ("TYPE_STRING", [-1]),
    "sampling_param_seed": ("TYPE_UINT64", [1]),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", [1]),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", [1]),
    "return_finish_reason": ("TYPE_BOOL", [1]),
    "stop": ("TYPE_BOOL", [1]),
}
UPSTREAM_OUTPUTS = {
    "text_output": ("TYPE_STRING", [-1]),
    "finish_reason": ("TYPE_STRING", [-1]),
    "acceptance_rate": ("TYPE_FP32", [1]),
    "total_accepted_draft_tokens": ("TYPE_INT32", [1]),
    "total_draft_tokens": ("TYPE_INT32", [1]),
}


def parsed() -> model_config_pb2.ModelConfig:
    return text_format.Parse(llmapi_repo.config_pbtxt(), model_config_pb2.ModelConfig())


def type_name(data_type: int) -> str:
    return model_config_pb2.DataType.Name(data_type)


@pytest.fixture
def model_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    pb.reset()
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    spec = importlib.util.spec_from_file_location("specops_llmapi_model_for_repo_test", MODEL_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    yield module
    pb.reset()


def test_the_config_is_a_python_model_triton_does_not_batch_with_one_cpu_instance() -> None:
    config = parsed()
    assert config.name == "tensorrt_llm"
    assert config.backend == "python"
    assert not config.platform
    assert config.max_batch_size == 0
    assert config.model_transaction_policy.decoupled is False
    assert [
        (g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in config.instance_group
    ] == [(1, "KIND_CPU")]
    assert not config.HasField("dynamic_batching")


def test_every_input_and_output_has_the_upstream_name_type_and_dims() -> None:
    config = parsed()
    for tensor in config.input:
        assert tensor.name in UPSTREAM_INPUTS, tensor.name
        assert (type_name(tensor.data_type), list(tensor.dims)) == UPSTREAM_INPUTS[tensor.name]
        assert tensor.optional is (tensor.name != "text_input")
    for tensor in config.output:
        assert tensor.name in UPSTREAM_OUTPUTS, tensor.name
        assert (type_name(tensor.data_type), list(tensor.dims)) == UPSTREAM_OUTPUTS[tensor.name]


def test_the_config_declares_what_the_model_reads(model_module: types.ModuleType) -> None:
    declared = {tensor.name for tensor in parsed().input}
    read = {
        "text_input",
        "streaming",
        "stop",
        "sampling_param_stop",
        "sampling_param_return_perf_metrics",  # accepted, and always on
        *model_module.SAMPLING_INPUTS,
    }
    assert declared == read


def test_the_config_declares_what_the_model_writes(model_module: types.ModuleType) -> None:
    outcome = model_module.Outcome(
        text="héllo", output_tokens=3, draft_tokens=4, accepted_tokens=3, time_per_output_token=0.01
    )
    response = model_module.success_response(outcome)
    outputs = {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}
    declared = {tensor.name: tensor for tensor in parsed().output}
    assert set(outputs) == set(declared)
    numpy_types = {"TYPE_STRING": np.object_, "TYPE_FP32": np.float32, "TYPE_INT32": np.int32}
    for name, array in outputs.items():
        assert array.dtype == numpy_types[type_name(declared[name].data_type)], name
        assert array.shape == (1,), name
    assert outputs["text_output"][0].decode() == "héllo"


def test_repository_files_are_the_config_the_source_and_the_yaml() -> None:
    files = llmapi_repo.repository_files("model: /models/target\n", "print('model')\n")
    assert files == {
        "tensorrt_llm/1/model.py": "print('model')\n",
        "tensorrt_llm/1/model.yaml": "model: /models/target\n",
        "tensorrt_llm/config.pbtxt": llmapi_repo.config_pbtxt(),
    }
    assert list(files) == sorted(files)


def test_the_shipped_model_source_is_the_asset() -> None:
    source = llmapi_model_source()
    assert source == MODEL_PATH.read_text(encoding="utf-8")
    assert "class TritonPythonModel" in source
    files = llmapi_repo.repository_files("{}\n", source)
    assert files[llmapi_repo.MODEL_SOURCE_PATH] == source


def test_text_format_strings_are_escaped() -> None:
    tricky = 'team "ml" \\ größe'
    text = llmapi_repo.to_pbtxt({"name": "m", "parameters": {"k": {"string_value": tricky}}})
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.parameters["k"].string_value == tricky


def test_values_text_format_cannot_hold_are_refused() -> None:
    with pytest.raises(TypeError, match="cannot render"):
        llmapi_repo.to_pbtxt({"name": None})
