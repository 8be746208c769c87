"""specops's Triton model (assets/llmapi_model/model.py) against a stub of TensorRT-LLM's LLM API.

The stub ``tensorrt_llm`` records the arguments ``LLM(...)`` and ``SamplingParams(...)`` get and
answers ``generate_async`` with a RequestOutput whose per-request perf metrics the test sets
(tokens, drafted and accepted tokens, first and last token times), so every metric the model
exports is known in advance. A gate holds generations back to show requests run concurrently.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tests.unit import triton_stub as pb

MODEL_PATH = Path(__file__).parents[2] / "operator" / "specops" / "assets" / "llmapi_model" / "model.py"
LABELS = {"model": "tensorrt_llm", "version": "1"}
SPEC_CONFIG = {
    "model": "/models/target",
    "backend": "pytorch",
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 1,
    "return_perf_metrics": True,
    "speculative_config": {
        "decoding_type": "Eagle3",
        "max_draft_len": 4,
        "speculative_model": "/models/draft",
        "draft_len_schedule": {4: 4, 16: 2, 64: 1},
    },
    "triton_config": {"max_batch_size": 0, "decoupled": False},
}
PLAIN_CONFIG = {
    "model": "/models/target",
    "backend": "pytorch",
    "tensor_parallel_size": 1,
    "triton_config": {"max_batch_size": 0, "decoupled": False},
}
SAMPLING_FIELDS = {"max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "return_perf_metrics"}


# ------------------------------------------------------------------ the LLM API stub


@dataclass
class Script:
    """How the fake engine answers: tokens per request (max_tokens when given), speculation
    counts, seconds per token after the first, and whether it reports perf metrics at all."""

    tokens: int = 8
    drafted: int | None = 6
    accepted: int | None = 4
    tpot_s: float = 0.02
    perf_metrics: bool = True
    fail: str | None = None
    gate: threading.Event | None = None


@dataclass
class FakeEngine:
    script: Script = field(default_factory=Script)
    llms: list[Any] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0


class SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"SamplingParams got unexpected arguments {sorted(unknown)}")
        self.kwargs = kwargs


def make_tensorrt_llm(engine: FakeEngine, converter: Callable[..., dict[str, Any]] | None) -> dict[str, Any]:
    """Modules to put in sys.modules: tensorrt_llm and, with a converter, tensorrt_llm.llmapi.llm_utils."""

    class FakeResult:
        def __init__(self, prompt: str, params: SamplingParams) -> None:
            self.prompt = prompt
            self.params = params

        async def aresult(self) -> Any:
            import asyncio

            script = engine.script
            engine.in_flight += 1
            engine.peak_in_flight = max(engine.peak_in_flight, engine.in_flight)
            try:
                if script.gate is not None:
                    await asyncio.to_thread(script.gate.wait, 10.0)
                if script.fail:
                    raise RuntimeError(script.fail)
                return self._output(script)
            finally:
                engine.in_flight -= 1

        def _output(self, script: Script) -> Any:
            n = int(self.params.kwargs.get("max_tokens", script.tokens))
            words = [f"{self.prompt.split()[-1]}{i}" for i in range(n)]
            perf = None
            if script.perf_metrics and self.params.kwargs.get("return_perf_metrics"):
                first = timedelta(seconds=100.0)
                spec = None
                if script.drafted is not None:
                    spec = types.SimpleNamespace(
                        total_draft_tokens=script.drafted,
                        total_accepted_draft_tokens=script.accepted,
                        acceptance_rate=(script.accepted or 0) / script.drafted if script.drafted else 0.0,
                    )
                perf = types.SimpleNamespace(
                    timing_metrics=types.SimpleNamespace(
                        arrival_time=timedelta(seconds=99.5),
                        first_scheduled_time=timedelta(seconds=99.6),
                        first_token_time=first,
                        last_token_time=first + timedelta(seconds=script.tpot_s * (n - 1)),
                    ),
                    speculative_decoding=spec,
                )
            output = types.SimpleNamespace(
                index=0, text=" ".join(words), token_ids=list(range(n)), request_perf_metrics=perf
            )
            return types.SimpleNamespace(outputs=[output], finished=True)

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs
            self.requests: list[tuple[str, SamplingParams, bool]] = []
            self.shut_down = False
            engine.llms.append(self)

        def generate_async(
            self, prompt: str, sampling_params: SamplingParams, streaming: bool = False
        ) -> Any:
            assert not self.shut_down, "generate_async after shutdown"
            self.requests.append((prompt, sampling_params, streaming))
            return FakeResult(prompt, sampling_params)

        def shutdown(self) -> None:
            self.shut_down = True

    trtllm = types.ModuleType("tensorrt_llm")
    trtllm.LLM = LLM  # type: ignore[attr-defined]
    trtllm.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    modules: dict[str, Any] = {"tensorrt_llm": trtllm}
    if converter is not None:
        llmapi = types.ModuleType("tensorrt_llm.llmapi")
        llm_utils = types.ModuleType("tensorrt_llm.llmapi.llm_utils")
        llm_utils.update_llm_args_with_extra_dict = converter  # type: ignore[attr-defined]
        llmapi.llm_utils = llm_utils  # type: ignore[attr-defined]
        trtllm.llmapi = llmapi  # type: ignore[attr-defined]
        modules |= {"tensorrt_llm.llmapi": llmapi, "tensorrt_llm.llmapi.llm_utils": llm_utils}
    return modules


# ------------------------------------------------------------------ fixtures and helpers


@dataclass
class Harness:
    module: types.ModuleType
    engine: FakeEngine
    config_file: Path
    models: list[Any] = field(default_factory=list)

    def start(self, config: dict[str, Any] | None = None) -> Any:
        self.config_file.write_text(yaml.safe_dump(SPEC_CONFIG if config is None else config))
        model = self.module.TritonPythonModel()
        model.initialize({"model_config": json.dumps({"name": "tensorrt_llm"}), **_names()})
        self.models.append(model)
        return model

    @property
    def llm(self) -> Any:
        return self.engine.llms[-1]


def _names() -> dict[str, str]:
    return {"model_name": "tensorrt_llm", "model_version": "1", "model_instance_kind": "CPU"}


def load_model_module(path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("specops_llmapi_model_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def install(
    monkeypatch: pytest.MonkeyPatch, converter: Callable[..., dict[str, Any]] | None = None
) -> FakeEngine:
    pb.reset()
    engine = FakeEngine()
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    for name, module in make_tensorrt_llm(engine, converter).items():
        monkeypatch.setitem(sys.modules, name, module)
    if converter is None:
        monkeypatch.delitem(sys.modules, "tensorrt_llm.llmapi", raising=False)
        monkeypatch.delitem(sys.modules, "tensorrt_llm.llmapi.llm_utils", raising=False)
    return engine


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Harness]:
    engine = install(monkeypatch)
    config_file = tmp_path / "elsewhere" / "llm.yaml"
    config_file.parent.mkdir()
    monkeypatch.setenv("LLM_CONFIG_PATH", str(config_file))  # an absolute path
    h = Harness(load_model_module(MODEL_PATH, monkeypatch), engine, config_file)
    yield h
    if engine.script.gate is not None:
        engine.script.gate.set()
    for model in h.models:
        if not model._closing:
            model.finalize()
    pb.reset()


def request(text: str = "the prompt", **inputs: Any) -> pb.InferenceRequest:
    dtypes = {
        "sampling_param_max_tokens": np.int32,
        "sampling_param_temperature": np.float32,
        "sampling_param_top_k": np.int32,
        "sampling_param_top_p": np.float32,
        "sampling_param_seed": np.uint64,
        "sampling_param_return_perf_metrics": np.bool_,
        "streaming": np.bool_,
        "stop": np.bool_,
    }
    tensors = [pb.Tensor("text_input", np.array([text.encode()], dtype=object))]
    for name, value in inputs.items():
        if name == "sampling_param_stop":
            tensors.append(pb.Tensor(name, np.array([w.encode() for w in value], dtype=object)))
        else:
            tensors.append(pb.Tensor(name, np.array([value], dtype=dtypes[name])))
    return pb.InferenceRequest(inputs=tensors)


def answer(model: Any, req: pb.InferenceRequest) -> pb.InferenceResponse:
    assert model.execute([req]) is None
    response = req.sender.wait_final()
    assert response is not None
    assert len(req.sender.sent) == 1  # one response per request, flagged final
    return response


def output(response: pb.InferenceResponse | None, name: str = "text_output") -> Any:
    assert response is not None
    assert not response.has_error(), response.error().message()  # type: ignore[union-attr]
    tensor = pb.get_output_tensor_by_name(response, name)
    assert tensor is not None
    value = tensor.as_numpy()[0]
    return value.decode() if isinstance(value, bytes) else value.item()


def metric(name: str) -> Any:
    return pb.metric_value(name, LABELS)


def counters() -> dict[str, float]:
    names = (
        "specops_spec_decode_draft_tokens_total",
        "specops_spec_decode_accepted_tokens_total",
        "specops_generation_tokens_total",
        "specops_request_success_total",
    )
    return {name.removeprefix("specops_"): metric(name) for name in names}


def error_of(response: pb.InferenceResponse | None) -> pb.TritonError:
    assert response is not None and response.has_error()
    error = response.error()
    assert error is not None
    return error


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.002)


# ------------------------------------------------------------------ configuration


def test_model_yaml_reaches_llm_without_triton_config(harness: Harness) -> None:
    harness.start(SPEC_CONFIG)
    expected = {key: value for key, value in SPEC_CONFIG.items() if key != "triton_config"}
    assert harness.llm.kwargs == expected


def test_the_llm_api_converter_builds_the_arguments_when_the_library_has_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def update_llm_args_with_extra_dict(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        seen.append((dict(base), dict(extra)))
        return {**base, **extra, "speculative_config": ("converted", extra["speculative_config"])}

    engine = install(monkeypatch, update_llm_args_with_extra_dict)
    config_file = tmp_path / "model.yaml"
    monkeypatch.setenv("LLM_CONFIG_PATH", str(config_file))
    h = Harness(load_model_module(MODEL_PATH, monkeypatch), engine, config_file)
    model = h.start(SPEC_CONFIG)
    try:
        assert seen == [({}, {k: v for k, v in SPEC_CONFIG.items() if k != "triton_config"})]
        assert h.llm.kwargs["speculative_config"] == ("converted", SPEC_CONFIG["speculative_config"])
    finally:
        model.finalize()


def test_model_yaml_is_read_next_to_model_py_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = install(monkeypatch)
    monkeypatch.delenv("LLM_CONFIG_PATH", raising=False)
    version_dir = tmp_path / "tensorrt_llm" / "1"
    version_dir.mkdir(parents=True)
    shutil.copy(MODEL_PATH, version_dir / "model.py")
    (version_dir / "model.yaml").write_text(yaml.safe_dump(PLAIN_CONFIG))
    model = load_model_module(version_dir / "model.py", monkeypatch).TritonPythonModel()
    model.initialize(_names())
    try:
        assert engine.llms[-1].kwargs == {
            "model": "/models/target",
            "backend": "pytorch",
            "tensor_parallel_size": 1,
        }
    finally:
        model.finalize()


def test_a_relative_config_path_is_read_from_the_model_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = install(monkeypatch)
    monkeypatch.setenv("LLM_CONFIG_PATH", "revision-b.yaml")
    shutil.copy(MODEL_PATH, tmp_path / "model.py")
    (tmp_path / "revision-b.yaml").write_text(yaml.safe_dump({**PLAIN_CONFIG, "tensor_parallel_size": 4}))
    model = load_model_module(tmp_path / "model.py", monkeypatch).TritonPythonModel()
    model.initialize(_names())
    try:
        assert engine.llms[-1].kwargs["tensor_parallel_size"] == 4
    finally:
        model.finalize()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a list\n", "mapping"),
        ("model: [unclosed\n", "not YAML"),
        (yaml.safe_dump({**PLAIN_CONFIG, "triton_config": {"decoupled": True}}), "decoupled"),
    ],
)
def test_a_config_the_model_cannot_serve_fails_the_load(harness: Harness, text: str, message: str) -> None:
    harness.config_file.write_text(text)
    model = harness.module.TritonPythonModel()
    with pytest.raises(ValueError, match=message):
        model.initialize(_names())
    assert harness.engine.llms == []


def test_a_missing_config_fails_the_load(harness: Harness) -> None:
    model = harness.module.TritonPythonModel()
    with pytest.raises(ValueError, match="cannot read"):
        model.initialize(_names())


# ------------------------------------------------------------------ requests and metrics


def test_a_request_gets_its_text_and_moves_every_metric_by_its_own_numbers(harness: Harness) -> None:
    harness.engine.script = Script(drafted=9, accepted=6, tpot_s=0.02)
    model = harness.start()
    response = answer(model, request("the prompt", sampling_param_max_tokens=12))
    assert output(response) == " ".join(f"prompt{i}" for i in range(12))
    assert output(response, "total_draft_tokens") == 9
    assert output(response, "total_accepted_draft_tokens") == 6
    assert output(response, "acceptance_rate") == pytest.approx(6 / 9)
    assert counters() == {
        "spec_decode_draft_tokens_total": 9,
        "spec_decode_accepted_tokens_total": 6,
        "generation_tokens_total": 12,
        "request_success_total": 1,
    }
    # one observation: (last token time - first token time) / (12 - 1)
    assert metric("specops_time_per_output_token_seconds") == [pytest.approx(0.02)]
    assert metric("specops_num_requests_running") == 0


def test_metrics_add_up_over_requests_and_histogram_buckets_are_explicit(harness: Harness) -> None:
    harness.engine.script = Script(drafted=5, accepted=2, tpot_s=0.004)
    model = harness.start()
    for tokens in (3, 10):
        answer(model, request(sampling_param_max_tokens=tokens))
    assert counters() == {
        "spec_decode_draft_tokens_total": 10,
        "spec_decode_accepted_tokens_total": 4,
        "generation_tokens_total": 13,
        "request_success_total": 2,
    }
    assert metric("specops_time_per_output_token_seconds") == [pytest.approx(0.004)] * 2
    assert pb.METRIC_KINDS == {
        "specops_num_requests_running": pb.GAUGE,
        "specops_time_per_output_token_seconds": pb.HISTOGRAM,
        "specops_spec_decode_draft_tokens_total": pb.COUNTER,
        "specops_spec_decode_accepted_tokens_total": pb.COUNTER,
        "specops_generation_tokens_total": pb.COUNTER,
        "specops_request_success_total": pb.COUNTER,
    }
    buckets = harness.module.TPOT_BUCKETS
    assert buckets == sorted(buckets) and buckets[0] == 0.0001 and buckets[-1] == 1.0


def test_every_request_asks_for_perf_metrics_and_temperature_zero_is_honoured(harness: Harness) -> None:
    model = harness.start()
    answer(
        model,
        request(
            "greedy please",
            sampling_param_max_tokens=5,
            sampling_param_temperature=0.0,
            sampling_param_return_perf_metrics=False,
        ),
    )
    answer(
        model, request("sampled", sampling_param_top_k=40, sampling_param_top_p=0.9, sampling_param_seed=7)
    )
    (prompt, greedy, streaming), (_, sampled, _) = harness.llm.requests
    assert (prompt, streaming) == ("greedy please", False)
    assert greedy.kwargs == {"max_tokens": 5, "temperature": 0.0, "return_perf_metrics": True}
    assert isinstance(greedy.kwargs["temperature"], float)
    assert sampled.kwargs == {
        "top_k": 40,
        "top_p": pytest.approx(0.9),
        "seed": 7,
        "return_perf_metrics": True,
    }


def test_stop_words_reach_the_sampling_params(harness: Harness) -> None:
    model = harness.start()
    answer(model, request(sampling_param_stop=["\n\n", "END"]))
    assert harness.llm.requests[0][1].kwargs["stop"] == ["\n\n", "END"]


def test_a_plain_engine_counts_tokens_and_no_speculation(harness: Harness) -> None:
    harness.engine.script = Script(drafted=None, accepted=None)  # no speculative_decoding block
    model = harness.start(PLAIN_CONFIG)
    response = answer(model, request(sampling_param_max_tokens=6))
    assert output(response, "total_draft_tokens") == 0
    assert output(response, "acceptance_rate") == 0.0
    assert counters() == {
        "spec_decode_draft_tokens_total": 0,
        "spec_decode_accepted_tokens_total": 0,
        "generation_tokens_total": 6,
        "request_success_total": 1,
    }
    assert len(metric("specops_time_per_output_token_seconds")) == 1


def test_a_build_reporting_zero_speculation_counts_adds_nothing(harness: Harness) -> None:
    harness.engine.script = Script(drafted=0, accepted=0)
    model = harness.start()
    answer(model, request(sampling_param_max_tokens=4))
    assert counters()["spec_decode_draft_tokens_total"] == 0
    assert counters()["spec_decode_accepted_tokens_total"] == 0
    assert counters()["generation_tokens_total"] == 4


def test_without_perf_metrics_time_per_token_falls_back_to_wall_time(harness: Harness) -> None:
    harness.engine.script = Script(perf_metrics=False)
    model = harness.start()
    answer(model, request(sampling_param_max_tokens=4))
    [observed] = metric("specops_time_per_output_token_seconds")
    assert 0 < observed < 1
    assert counters()["spec_decode_draft_tokens_total"] == 0


def test_a_single_token_request_has_no_time_per_output_token(harness: Harness) -> None:
    model = harness.start()
    answer(model, request(sampling_param_max_tokens=1))
    assert metric("specops_time_per_output_token_seconds") == []
    assert counters()["request_success_total"] == 1


def test_requests_run_concurrently_and_the_running_gauge_follows_them(harness: Harness) -> None:
    gate = threading.Event()
    harness.engine.script = Script(gate=gate)
    model = harness.start()
    requests = [request(f"prompt {i}") for i in range(3)]
    for req in requests:  # one execute call each, as Triton makes them with max_batch_size 0
        assert model.execute([req]) is None
    wait_until(lambda: harness.engine.in_flight == 3)
    wait_until(lambda: metric("specops_num_requests_running") == 3)
    assert not any(req.sender.finished for req in requests)
    gate.set()
    texts = [output(req.sender.wait_final()) for req in requests]
    assert texts == [" ".join(f"{i}{j}" for j in range(8)) for i in range(3)]
    assert harness.engine.peak_in_flight == 3
    assert metric("specops_num_requests_running") == 0
    assert counters()["request_success_total"] == 3


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"streaming": True}, "streaming"),
        ({"stop": True}, "stop"),
        ({"sampling_param_max_tokens": 0}, "max_tokens"),
        ({"sampling_param_temperature": -1.0}, "temperature"),
    ],
)
def test_a_bad_request_gets_an_invalid_argument_error(
    harness: Harness, inputs: dict[str, Any], message: str
) -> None:
    model = harness.start()
    error = error_of(answer(model, request(**inputs)))
    assert message in error.message()
    assert error.code() == pb.TritonError.INVALID_ARG
    assert harness.llm.requests == []
    assert counters()["request_success_total"] == 0
    assert metric("specops_num_requests_running") == 0


def test_a_request_without_text_input_or_with_two_prompts_is_refused(harness: Harness) -> None:
    model = harness.start()
    no_text = pb.InferenceRequest(inputs=[pb.Tensor("sampling_param_max_tokens", np.array([4], np.int32))])
    two = pb.InferenceRequest(inputs=[pb.Tensor("text_input", np.array([b"a", b"b"], dtype=object))])
    assert "text_input is required" in error_of(answer(model, no_text)).message()
    assert "exactly one value" in error_of(answer(model, two)).message()


def test_a_failing_generation_becomes_an_error_response_and_the_next_request_is_served(
    harness: Harness,
) -> None:
    harness.engine.script = Script(fail="CUDA out of memory")
    model = harness.start()
    error = error_of(answer(model, request()))
    assert "generation failed: CUDA out of memory" in error.message()
    assert error.code() == pb.TritonError.INTERNAL
    assert counters()["request_success_total"] == 0
    assert metric("specops_num_requests_running") == 0
    harness.engine.script = Script()
    assert output(answer(model, request("next one", sampling_param_max_tokens=2))) == "one0 one1"
    assert counters()["request_success_total"] == 1


def test_one_call_with_several_requests_answers_each_on_its_own(harness: Harness) -> None:
    model = harness.start()
    good, bad = request("fine words"), request(streaming=True)
    assert model.execute([good, bad]) is None
    assert output(good.sender.wait_final()).startswith("words0")
    assert "streaming" in error_of(bad.sender.wait_final()).message()


# ------------------------------------------------------------------ unloading


def test_finalize_waits_for_requests_in_flight_then_shuts_the_llm_down(harness: Harness) -> None:
    gate = threading.Event()
    harness.engine.script = Script(gate=gate)
    model = harness.start()
    req = request("late answer")
    model.execute([req])
    wait_until(lambda: harness.engine.in_flight == 1)
    finalizing = threading.Thread(target=model.finalize)
    finalizing.start()
    time.sleep(0.05)
    assert finalizing.is_alive() and not harness.llm.shut_down
    gate.set()
    finalizing.join(timeout=5)
    assert not finalizing.is_alive()
    assert harness.llm.shut_down
    assert output(req.sender.wait_final()).startswith("answer0")
    # a request that arrives while unloading is refused, not lost
    after = request()
    model.execute([after])
    assert "unloading" in error_of(after.sender.wait_final()).message()


def test_finalize_with_nothing_in_flight_shuts_the_llm_down(harness: Harness) -> None:
    model = harness.start()
    model.finalize()
    assert harness.llm.shut_down
    assert not model._thread.is_alive()


def test_without_histogram_support_time_per_token_is_a_sum_and_count(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(pb.MetricFamily, "HISTOGRAM")
    harness.engine.script = Script(tpot_s=0.01)
    model = harness.start()
    answer(model, request(sampling_param_max_tokens=5))
    answer(model, request(sampling_param_max_tokens=5))
    assert metric("specops_time_per_output_token_seconds_count") == 2
    assert metric("specops_time_per_output_token_seconds_sum") == pytest.approx(0.02)
