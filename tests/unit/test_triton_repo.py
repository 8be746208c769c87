"""The Triton model repository: every config.pbtxt is a valid ModelConfig with the parameters the models read."""

from __future__ import annotations

import dataclasses
import json

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from specops.domain import triton_repo
from specops.domain.triton_repo import RepositorySettings

SETTINGS = RepositorySettings(
    deployment="llama-70b-chat",
    variant="stable",
    draft_version="v3",
    default_num_draft_tokens=4,
    max_draft_len=8,
    tensor_parallel=4,
)


def parsed(name: str, settings: RepositorySettings = SETTINGS) -> model_config_pb2.ModelConfig:
    text = triton_repo.repository_files(settings, "")[f"{name}/config.pbtxt"]
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


@pytest.mark.parametrize("name", triton_repo.MODEL_NAMES)
def test_every_config_parses_as_a_triton_model_config(name: str) -> None:
    config = parsed(name)
    assert config.name == name
    # the text file and the JSON form (the load API's config override) say the same thing
    as_json = triton_repo.model_configs(SETTINGS)[name]
    assert json_format.ParseDict(json.loads(json.dumps(as_json)), model_config_pb2.ModelConfig()) == config


def test_engines_point_at_their_mounts_with_inflight_batching() -> None:
    for name, path in (("tensorrt_llm", "/engines/target"), ("tensorrt_llm_draft", "/engines/draft")):
        config = parsed(name)
        params = parameters(config)
        assert config.backend == "tensorrtllm"
        assert config.model_transaction_policy.decoupled is False
        assert params["gpt_model_path"] == path
        assert params["gpt_model_type"] == "inflight_fused_batching"
        assert params["gpu_device_ids"] == "0,1,2,3"
        # the BLS reads the whole sequence back after every step
        assert params["exclude_input_in_output"] == "false"
        assert params["enable_kv_cache_reuse"] == "true"
        inputs = {tensor.name for tensor in config.input}
        assert {"input_ids", "input_lengths", "request_output_len", "draft_input_ids", "end_id"} <= inputs
    target = float(parameters(parsed("tensorrt_llm"))["kv_cache_free_gpu_mem_fraction"])
    draft = float(parameters(parsed("tensorrt_llm_draft"))["kv_cache_free_gpu_mem_fraction"])
    assert 0 < draft < target < 1


def test_bls_parameters_are_present() -> None:
    config = parsed("tensorrt_llm_bls")
    assert config.backend == "python"
    assert parameters(config) == {
        "tensorrt_llm_model_name": "tensorrt_llm",
        "tensorrt_llm_draft_model_name": "tensorrt_llm_draft",
        "specops_default_num_draft_tokens": "4",
        "specops_max_draft_len": "8",
        "specops_deployment": "llama-70b-chat",
        "specops_variant": "stable",
        "specops_draft_version": "v3",
        "tokenizer_dir": "/engines/target/tokenizer",
    }
    assert {tensor.name for tensor in config.input} >= {"text_input", "max_tokens", "num_draft_tokens"}
    assert [tensor.name for tensor in config.output] == ["text_output"]


def test_bls_config_override_names_a_new_draft_and_length() -> None:
    override = triton_repo.bls_config(
        dataclasses.replace(SETTINGS, draft_model_name="tensorrt_llm_draft_v4", default_num_draft_tokens=0)
    )
    config = json_format.ParseDict(json.loads(json.dumps(override)), model_config_pb2.ModelConfig())
    assert parameters(config)["tensorrt_llm_draft_model_name"] == "tensorrt_llm_draft_v4"
    assert parameters(config)["specops_default_num_draft_tokens"] == "0"


def test_ensemble_forwards_every_input_and_output_of_the_bls() -> None:
    ensemble, bls = parsed("ensemble"), parsed("tensorrt_llm_bls")
    assert ensemble.platform == "ensemble"
    [step] = ensemble.ensemble_scheduling.step
    assert step.model_name == "tensorrt_llm_bls"
    assert dict(step.input_map) == {t.name: t.name for t in bls.input}
    assert dict(step.output_map) == {t.name: t.name for t in bls.output}
    for mine, theirs in zip(ensemble.input, bls.input, strict=True):
        assert (mine.name, mine.data_type, list(mine.dims), mine.optional) == (
            theirs.name,
            theirs.data_type,
            list(theirs.dims),
            theirs.optional,
        )
    assert ensemble.max_batch_size == bls.max_batch_size


def test_repository_has_a_version_directory_for_every_model() -> None:
    files = triton_repo.repository_files(SETTINGS, "print('bls')\n")
    assert files["tensorrt_llm_bls/1/model.py"] == "print('bls')\n"
    for name in triton_repo.MODEL_NAMES:
        assert f"{name}/config.pbtxt" in files
        assert any(path.startswith(f"{name}/1/") for path in files)
    assert list(files) == sorted(files)


def test_text_format_strings_are_escaped() -> None:
    tricky = 'team "ml" \\ größe'
    text = triton_repo.to_pbtxt({"name": "m", "parameters": {"k": {"string_value": tricky}}})
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.parameters["k"].string_value == tricky


@pytest.mark.parametrize("default", [-1, 9])
def test_default_draft_length_must_fit_the_engine(default: int) -> None:
    with pytest.raises(ValueError, match="default_num_draft_tokens"):
        dataclasses.replace(SETTINGS, default_num_draft_tokens=default)
