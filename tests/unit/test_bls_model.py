"""The specops BLS (assets/tensorrt_llm_bls/model.py) against fake TensorRT-LLM models.

The fake target is a deterministic greedy model (next token = f(last token)) that
verifies draft tokens the way TensorRT-LLM does with draft_input_ids: it keeps the
draft's tokens while they match its own, then adds one token of its own. The fake
draft agrees with the target for the first ``agree`` tokens of every request and
then goes wrong, so the accepted counts are known in advance.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specops.domain import triton_repo
from tests.unit import triton_stub as pb

BLS_PATH = Path(__file__).parents[2] / "operator" / "specops" / "assets" / "tensorrt_llm_bls" / "model.py"
END_ID = 2
SETTINGS = triton_repo.RepositorySettings(
    deployment="llama-70b-chat",
    variant="stable",
    draft_version="v3",
    default_num_draft_tokens=4,
    max_draft_len=8,
)
LABELS = {
    "model": "tensorrt_llm_bls",
    "version": "1",
    "draft": "tensorrt_llm_draft",
    "deployment": "llama-70b-chat",
    "variant": "stable",
}


def target_next(sequence: list[int]) -> int:
    return (sequence[-1] * 7 + 3) % 97 + 10  # never END_ID


class WordTokenizer:
    """Whitespace tokens: "t<id>" is token id; other words get ids from 1000 up."""

    eos_token_id = END_ID
    pad_token_id = None

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            if word.startswith("t") and word[1:].isdigit():
                ids.append(int(word[1:]))
            else:
                ids.append(self.vocab.setdefault(word, 1000 + len(self.vocab)))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(f"t{i}" for i in ids if not (skip_special_tokens and i == END_ID))


@dataclass
class FakeEngines:
    """The target and draft models, with a log of every request they served."""

    agree: int = 2
    end_at_length: int | None = None
    calls: list[tuple[str, int, int, list[int]]] = field(default_factory=list)

    def _reply(self, sequence: list[int], new: list[int], requested: int) -> dict[str, np.ndarray]:
        padded = sequence + new + [END_ID] * (requested - len(new))
        return {
            "output_ids": np.array([[padded]], dtype=np.int32),
            "sequence_length": np.array([[len(sequence) + len(new)]], dtype=np.int32),
        }

    def _next(self, current: list[int]) -> int:
        if self.end_at_length is not None and len(current) >= self.end_at_length:
            return END_ID
        return target_next(current)

    def target(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sequence = [int(t) for t in inputs["input_ids"][0][: int(inputs["input_lengths"][0][0])]]
        requested = int(inputs["request_output_len"][0][0])
        draft = [int(t) for t in inputs["draft_input_ids"][0]] if "draft_input_ids" in inputs else []
        assert int(inputs["end_id"][0][0]) == END_ID
        self.calls.append(("target", len(sequence), requested, draft))
        current, new = list(sequence), []
        for i in range(requested):
            token = self._next(current)
            new.append(token)
            current.append(token)
            if token == END_ID or (i < len(draft) and draft[i] != token):
                break
        return self._reply(sequence, new, requested)

    def draft(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sequence = [int(t) for t in inputs["input_ids"][0]]
        requested = int(inputs["request_output_len"][0][0])
        assert "draft_input_ids" not in inputs
        self.calls.append(("draft", len(sequence), requested, []))
        current, new = list(sequence), []
        for j in range(requested):
            token = self._next(current)
            token = token if j < self.agree or token == END_ID else token + 1
            new.append(token)
            current.append(token)
        return self._reply(sequence, new, requested)

    def of(self, model: str) -> list[tuple[str, int, int, list[int]]]:
        return [call for call in self.calls if call[0] == model]


@pytest.fixture
def bls_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    pb.reset()
    transformers = types.ModuleType("transformers")
    loaded: list[str] = []

    class AutoTokenizer:
        @staticmethod
        def from_pretrained(path: str) -> WordTokenizer:
            loaded.append(path)
            return WordTokenizer()

    transformers.AutoTokenizer = AutoTokenizer  # type: ignore[attr-defined]
    transformers.loaded = loaded  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    spec = importlib.util.spec_from_file_location("specops_bls_under_test", BLS_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    yield module
    pb.reset()


def start(module: types.ModuleType, engines: FakeEngines, settings: Any = SETTINGS) -> Any:
    pb.serve("tensorrt_llm", engines.target)
    pb.serve(settings.draft_model_name, engines.draft)
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(triton_repo.bls_config(settings))})
    return model


def request(text: str, max_tokens: int, **optional: Any) -> pb.InferenceRequest:
    inputs = [
        pb.Tensor("text_input", np.array([[text.encode()]], dtype=object)),
        pb.Tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
    ]
    dtypes = {"num_draft_tokens": np.int32, "stream": np.bool_, "end_id": np.int32, "temperature": np.float32}
    inputs += [pb.Tensor(name, np.array([[value]], dtype=dtypes[name])) for name, value in optional.items()]
    return pb.InferenceRequest(inputs=inputs)


def text_of(response: pb.InferenceResponse) -> str:
    assert not response.has_error(), response.error().message()  # type: ignore[union-attr]
    tensor = pb.get_output_tensor_by_name(response, "text_output")
    assert tensor is not None
    return str(tensor.as_numpy()[0][0].decode())


def target_only(prompt: list[int], max_tokens: int) -> str:
    sequence = list(prompt)
    for _ in range(max_tokens):
        sequence.append(target_next(sequence))
    return " ".join(f"t{t}" for t in sequence[len(prompt) :])


def counter(name: str) -> float:
    return float(pb.metric_value(name, LABELS) or 0.0)


PROMPT = "t11 t12 t13"


def test_speculative_output_equals_target_only_output(bls_module: types.ModuleType) -> None:
    # given a draft that agrees with the target for 2 of every 4 proposed tokens
    model = start(bls_module, FakeEngines(agree=2))
    # when a request uses the default draft length (4)
    [response] = model.execute([request(PROMPT, 12)])
    # then the text is exactly what the target alone generates (lossless)
    assert text_of(response) == target_only([11, 12, 13], 12)


def test_counts_drafted_and_accepted_tokens_with_deployment_labels(bls_module: types.ModuleType) -> None:
    engines = FakeEngines(agree=2)
    model = start(bls_module, engines)
    # when 12 tokens are generated with 4 draft tokens per step, 2 of them right
    model.execute([request(PROMPT, 12)])
    # then 3 steps of (4 drafted, 2 accepted, 3 emitted) and a last step that drafts only
    # the 2 tokens max_tokens leaves room for: 14 drafted, 8 accepted, 4 steps, 12 tokens
    assert [call[2] for call in engines.of("draft")] == [4, 4, 4, 2]
    assert counter("specops_spec_decode_draft_tokens_total") == 14
    assert counter("specops_spec_decode_accepted_tokens_total") == 8
    assert counter("specops_spec_decode_steps_total") == 4
    assert counter("specops_output_tokens_total") == 12
    assert len(pb.metric_value("specops_time_per_output_token_seconds", LABELS)) == 1


def test_target_verifies_each_draft_in_one_request(bls_module: types.ModuleType) -> None:
    engines = FakeEngines(agree=4)
    model = start(bls_module, engines)
    model.execute([request(PROMPT, 10)])
    # every draft token accepted: each target request carries the draft and asks for one more token
    targets = engines.of("target")
    assert all(len(draft) == 4 and requested == 5 for _, _, requested, draft in targets[:2])
    assert counter("specops_spec_decode_accepted_tokens_total") == counter(
        "specops_spec_decode_draft_tokens_total"
    )


def test_request_num_draft_tokens_overrides_the_default(bls_module: types.ModuleType) -> None:
    engines = FakeEngines(agree=8)
    model = start(bls_module, engines)
    [response] = model.execute([request(PROMPT, 9, num_draft_tokens=2)])
    assert {call[2] for call in engines.of("draft")} == {2}
    assert text_of(response) == target_only([11, 12, 13], 9)


def test_request_num_draft_tokens_is_clamped_to_the_engine_limit(bls_module: types.ModuleType) -> None:
    engines = FakeEngines(agree=50)
    model = start(bls_module, engines)
    model.execute([request(PROMPT, 40, num_draft_tokens=50)])
    assert max(call[2] for call in engines.of("draft")) == SETTINGS.max_draft_len


def test_zero_draft_tokens_is_plain_target_decoding(bls_module: types.ModuleType) -> None:
    engines = FakeEngines()
    model = start(bls_module, engines)
    [response] = model.execute([request(PROMPT, 12, num_draft_tokens=0)])
    # then no draft request at all, one target request for every token
    assert engines.of("draft") == []
    assert [(call[2], call[3]) for call in engines.of("target")] == [(12, [])]
    assert text_of(response) == target_only([11, 12, 13], 12)
    assert counter("specops_spec_decode_draft_tokens_total") == 0
    assert counter("specops_output_tokens_total") == 12


def test_default_zero_from_the_config_switches_speculation_off(bls_module: types.ModuleType) -> None:
    engines = FakeEngines()
    model = start(bls_module, engines, dataclasses.replace(SETTINGS, default_num_draft_tokens=0))
    model.execute([request(PROMPT, 6)])
    assert engines.of("draft") == []
    # while a request may still ask for speculation explicitly
    model.execute([request(PROMPT, 6, num_draft_tokens=3)])
    assert engines.of("draft") != []


def test_draft_model_name_and_labels_follow_the_config(bls_module: types.ModuleType) -> None:
    # given the operator reloaded the BLS with a new draft model
    settings = dataclasses.replace(SETTINGS, draft_model_name="tensorrt_llm_draft_v4", variant="canary")
    engines = FakeEngines(agree=1)
    model = start(bls_module, engines, settings)
    model.execute([request(PROMPT, 5)])
    labels = {**LABELS, "draft": "tensorrt_llm_draft_v4", "variant": "canary"}
    assert pb.metric_value("specops_spec_decode_draft_tokens_total", labels) > 0
    assert pb.metric_value("specops_spec_decode_draft_tokens_total", LABELS) is None
    assert sys.modules["transformers"].loaded == ["/engines/target/tokenizer"]


def test_stops_at_the_end_id(bls_module: types.ModuleType) -> None:
    engines = FakeEngines(agree=4, end_at_length=3 + 6)
    model = start(bls_module, engines)
    [response] = model.execute([request(PROMPT, 50)])
    assert text_of(response) == target_only([11, 12, 13], 6)
    assert counter("specops_output_tokens_total") == 6


def test_a_failing_request_gets_an_error_and_the_next_one_is_served(bls_module: types.ModuleType) -> None:
    model = start(bls_module, FakeEngines())
    streaming, missing_tokens, fine = model.execute(
        [
            request(PROMPT, 5, stream=True),
            pb.InferenceRequest(inputs=[pb.Tensor("text_input", np.array([[b"x"]], dtype=object))]),
            request(PROMPT, 5),
        ]
    )
    assert streaming.has_error() and "streaming" in streaming.error().message()
    assert missing_tokens.has_error() and "max_tokens" in missing_tokens.error().message()
    assert text_of(fine) == target_only([11, 12, 13], 5)


def test_an_unavailable_draft_model_is_reported_as_an_error(bls_module: types.ModuleType) -> None:
    model = start(bls_module, FakeEngines())
    pb.MODELS.pop("tensorrt_llm_draft")
    [response] = model.execute([request(PROMPT, 5)])
    assert response.has_error() and "tensorrt_llm_draft" in response.error().message()


def test_without_histogram_support_time_per_token_is_a_sum_and_count(
    bls_module: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(pb.MetricFamily, "HISTOGRAM")
    model = start(bls_module, FakeEngines())
    model.execute([request(PROMPT, 5), request(PROMPT, 5)])
    assert counter("specops_time_per_output_token_seconds_count") == 2
    assert counter("specops_time_per_output_token_seconds_sum") > 0
