"""specops draft-target speculative decoding for Triton's python backend (model ``tensorrt_llm_bls``).

This file is shipped into each serving pod's model repository; the operator never
imports it. Per request it tokenizes ``text_input`` and loops:

1. the draft model (``tensorrt_llm_draft_model_name``) generates ``num_draft_tokens``
   tokens from the current sequence (one BLS request);
2. the target model (``tensorrt_llm_model_name``) verifies them in one request with
   ``draft_input_ids`` and returns the accepted tokens plus one token of its own;
3. accepted = the longest prefix on which draft and target agree.

It stops at ``max_tokens`` or the end id. With greedy sampling the output is token
for token what the target alone would produce (speculation is lossless).

``num_draft_tokens`` comes from the request when given, else from the
``specops_default_num_draft_tokens`` parameter, which the operator changes at run
time by reloading this model with a config override; it is clamped to the target
engine's ``specops_max_draft_len``. 0 means plain target decoding: one request to
the target, no draft request at all.

Triton's TensorRT-LLM backend exports no acceptance metric, so this model counts
drafted and accepted tokens, verification steps and output tokens with Triton's
custom-metrics API, and records per-request time per output token in a histogram
(on servers whose python backend has no histogram kind: ``_sum``/``_count``
counters, which give a mean but no quantiles).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

MODEL_NAME = "tensorrt_llm_bls"
MODEL_VERSION = "1"
TPOT_BUCKETS = [
    0.0001,
    0.0002,
    0.0003,
    0.0004,
    0.0005,
    0.0006,
    0.0007,
    0.0008,
    0.0009,
    0.001,
    0.00125,
    0.0015,
    0.00175,
    0.002,
    0.0025,
    0.003,
    0.0035,
    0.004,
    0.0045,
    0.005,
    0.006,
    0.007,
    0.008,
    0.009,
    0.01,
    0.0125,
    0.015,
    0.0175,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
]
"""Seconds per output token: from 0.1 ms in 0.1 ms steps (MoE targets with few active parameters
decode a token in 0.3-0.6 ms; coarser buckets would make speculation on and off look the same),
0.25-1 ms steps up to 10 ms (dense targets with speculation), to 1 s; SLOs sit around 10-50 ms."""

Generate = Callable[[str, Sequence[int], int, Sequence[int]], list[int]]
"""(model name, sequence, max new tokens, draft tokens) -> new tokens (without the sequence)."""


@dataclass(frozen=True)
class Settings:
    """The model's parameters from its config.pbtxt (or the operator's config override)."""

    target_model: str
    draft_model: str
    default_num_draft_tokens: int
    max_draft_len: int
    deployment: str
    variant: str
    draft_version: str
    tokenizer_dir: str

    @classmethod
    def from_model_config(cls, config: Mapping[str, Any]) -> Settings:
        params = {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}
        max_draft_len = max(0, int(params.get("specops_max_draft_len") or 0))
        return cls(
            target_model=params.get("tensorrt_llm_model_name") or "tensorrt_llm",
            draft_model=params.get("tensorrt_llm_draft_model_name") or "tensorrt_llm_draft",
            default_num_draft_tokens=min(
                max_draft_len, max(0, int(params.get("specops_default_num_draft_tokens") or 0))
            ),
            max_draft_len=max_draft_len,
            deployment=params.get("specops_deployment", ""),
            variant=params.get("specops_variant", ""),
            draft_version=params.get("specops_draft_version", ""),
            tokenizer_dir=params.get("tokenizer_dir", ""),
        )

    def num_draft_tokens(self, requested: int | None) -> int:
        """Draft length of one request: its own value or the default, within [0, engine limit]."""
        value = self.default_num_draft_tokens if requested is None else requested
        return max(0, min(int(value), self.max_draft_len))

    @property
    def metric_labels(self) -> dict[str, str]:
        return {
            "model": MODEL_NAME,
            "version": MODEL_VERSION,
            "draft": self.draft_model,
            "deployment": self.deployment,
            "variant": self.variant,
        }


@dataclass
class DecodeStats:
    """What one request cost and gained; summed into the Prometheus counters."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    output_tokens: int = 0


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def speculative_decode(
    prompt: Sequence[int],
    max_tokens: int,
    num_draft_tokens: int,
    end_id: int,
    generate: Generate,
    target_model: str,
    draft_model: str,
    stats: DecodeStats,
) -> list[int]:
    """Generated tokens (end id excluded) of a draft-target loop; 0 draft tokens = plain decoding."""
    sequence = list(prompt)
    output: list[int] = []
    while len(output) < max_tokens:
        remaining = max_tokens - len(output)
        # The target adds one token of its own per step: never draft past max_tokens.
        length = min(num_draft_tokens, remaining - 1)
        draft: list[int] = []
        if length > 0:
            draft = generate(draft_model, sequence, length, [])[:length]
            if end_id in draft:
                draft = draft[: draft.index(end_id) + 1]
        if draft:
            new = generate(target_model, sequence, len(draft) + 1, draft)
            stats.steps += 1
            stats.drafted += len(draft)
            stats.accepted += _common_prefix(draft, new)
        else:
            # Speculation off (or nothing left to draft): one plain request for the rest.
            # A draft with nothing to offer while speculating gets one plain step instead.
            new = generate(target_model, sequence, 1 if length > 0 else remaining, [])
        new = new[:remaining]
        ended = end_id in new
        if ended:
            new = new[: new.index(end_id)]
        output.extend(new)
        sequence.extend(new)
        if ended or not new or length <= 0:
            break  # end id, no progress, or a plain request that already ran to max_tokens
    stats.output_tokens += len(output)
    return output


def _value(tensor: Any, row: int) -> Any:
    """Row ``row`` of a [batch, 1] (or [batch]) input tensor, or None when the input is absent."""
    if tensor is None:
        return None
    array = np.asarray(tensor.as_numpy())
    return array.reshape(array.shape[0], -1)[row][0] if array.ndim else array.item()


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class _Metrics:
    """Triton custom metrics; families are kept on the instance so they live as long as the model."""

    def __init__(self, labels: dict[str, str]) -> None:
        counter = pb_utils.MetricFamily.COUNTER
        self._families = {
            "drafted": pb_utils.MetricFamily(
                name="specops_spec_decode_draft_tokens_total",
                description="Draft tokens proposed to the target for verification.",
                kind=counter,
            ),
            "accepted": pb_utils.MetricFamily(
                name="specops_spec_decode_accepted_tokens_total",
                description="Draft tokens the target accepted.",
                kind=counter,
            ),
            "steps": pb_utils.MetricFamily(
                name="specops_spec_decode_steps_total",
                description="Target verification steps that carried draft tokens.",
                kind=counter,
            ),
            "output": pb_utils.MetricFamily(
                name="specops_output_tokens_total",
                description="Tokens returned to clients.",
                kind=counter,
            ),
        }
        self._counters = {key: family.Metric(labels=labels) for key, family in self._families.items()}
        self._histogram: Any = None
        self._tpot_sum: Any = None
        self._tpot_count: Any = None
        description = "Request latency divided by its output tokens, in seconds."
        if hasattr(pb_utils.MetricFamily, "HISTOGRAM"):
            family = pb_utils.MetricFamily(
                name="specops_time_per_output_token_seconds",
                description=description,
                kind=pb_utils.MetricFamily.HISTOGRAM,
            )
            self._families["tpot"] = family
            self._histogram = family.Metric(labels=labels, buckets=TPOT_BUCKETS)
        else:
            for suffix in ("sum", "count"):
                family = pb_utils.MetricFamily(
                    name=f"specops_time_per_output_token_seconds_{suffix}",
                    description=description,
                    kind=counter,
                )
                self._families[f"tpot_{suffix}"] = family
            self._tpot_sum = self._families["tpot_sum"].Metric(labels=labels)
            self._tpot_count = self._families["tpot_count"].Metric(labels=labels)

    def record(self, stats: DecodeStats, seconds: float) -> None:
        for key, value in (
            ("drafted", stats.drafted),
            ("accepted", stats.accepted),
            ("steps", stats.steps),
            ("output", stats.output_tokens),
        ):
            if value:
                self._counters[key].increment(value)
        if stats.output_tokens:
            per_token = seconds / stats.output_tokens
            if self._histogram is not None:
                self._histogram.observe(per_token)
            else:
                self._tpot_sum.increment(per_token)
                self._tpot_count.increment(1)


class TritonPythonModel:
    """Triton python-backend entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        self.settings = Settings.from_model_config(json.loads(args["model_config"]))
        self.tokenizer = _load_tokenizer(self.settings.tokenizer_dir)
        self.metrics = _Metrics(self.settings.metric_labels)
        pb_utils.Logger.log_info(
            f"specops BLS: target={self.settings.target_model} draft={self.settings.draft_model} "
            f"default num_draft_tokens={self.settings.default_num_draft_tokens} "
            f"(engine limit {self.settings.max_draft_len})"
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._respond(request))
            except Exception as error:  # a bad request must not take the model down
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(error)))
                )
        return responses

    def finalize(self) -> None:
        pb_utils.Logger.log_info("specops BLS: unloading")

    # ------------------------------------------------------------------ one request

    def _respond(self, request: Any) -> Any:
        def get(name: str) -> Any:
            return pb_utils.get_input_tensor_by_name(request, name)

        text_input = get("text_input")
        max_tokens = get("max_tokens")
        if text_input is None or max_tokens is None:
            raise ValueError("text_input and max_tokens are required")
        batch = np.asarray(text_input.as_numpy()).shape[0]
        texts = []
        for row in range(batch):
            if _value(get("stream"), row):
                raise ValueError("streaming is not supported: use the non-streaming generate endpoint")
            texts.append(self._generate_text(get, row))
        output = np.array([[text.encode("utf-8")] for text in texts], dtype=object)
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("text_output", output)])

    def _generate_text(self, get: Callable[[str], Any], row: int) -> str:
        started = time.perf_counter()
        raw = _value(get("text_input"), row)
        text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        max_tokens = int(_value(get("max_tokens"), row))
        if max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        requested = _value(get("num_draft_tokens"), row)
        num_draft_tokens = self.settings.num_draft_tokens(None if requested is None else int(requested))
        end_id = _value(get("end_id"), row)
        end_id = int(end_id) if end_id is not None else int(self.tokenizer.eos_token_id)
        pad_id = _value(get("pad_id"), row)
        if pad_id is None:
            pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else end_id
        sampling = self._sampling_tensors(get, row, end_id, int(pad_id))

        def generate(model: str, sequence: Sequence[int], max_new: int, draft: Sequence[int]) -> list[int]:
            return self._engine_generate(model, sequence, max_new, draft, sampling)

        stats = DecodeStats()
        prompt = list(self.tokenizer.encode(text))
        tokens = speculative_decode(
            prompt,
            max_tokens,
            num_draft_tokens,
            end_id,
            generate,
            self.settings.target_model,
            self.settings.draft_model,
            stats,
        )
        self.metrics.record(stats, time.perf_counter() - started)
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True))

    @staticmethod
    def _sampling_tensors(get: Callable[[str], Any], row: int, end_id: int, pad_id: int) -> list[Any]:
        tensors = [
            pb_utils.Tensor("end_id", np.array([[end_id]], dtype=np.int32)),
            pb_utils.Tensor("pad_id", np.array([[pad_id]], dtype=np.int32)),
        ]
        for source, target, dtype in (
            ("temperature", "temperature", np.float32),
            ("top_k", "runtime_top_k", np.int32),
            ("top_p", "runtime_top_p", np.float32),
            ("random_seed", "random_seed", np.uint64),
        ):
            value = _value(get(source), row)
            if value is not None:
                tensors.append(pb_utils.Tensor(target, np.array([[value]], dtype=dtype)))
        return tensors

    @staticmethod
    def _engine_generate(
        model: str, sequence: Sequence[int], max_new: int, draft: Sequence[int], sampling: list[Any]
    ) -> list[int]:
        """One non-streaming request to a tensorrtllm model; returns the tokens after ``sequence``."""
        inputs = [
            pb_utils.Tensor("input_ids", np.array([list(sequence)], dtype=np.int32)),
            pb_utils.Tensor("input_lengths", np.array([[len(sequence)]], dtype=np.int32)),
            pb_utils.Tensor("request_output_len", np.array([[max_new]], dtype=np.int32)),
            *sampling,
        ]
        if draft:
            inputs.append(pb_utils.Tensor("draft_input_ids", np.array([list(draft)], dtype=np.int32)))
        response = pb_utils.InferenceRequest(
            model_name=model, inputs=inputs, requested_output_names=["output_ids", "sequence_length"]
        ).exec()
        if response.has_error():
            raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
        output_ids = np.asarray(pb_utils.get_output_tensor_by_name(response, "output_ids").as_numpy())
        lengths = np.asarray(pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy())
        # [batch=1, beam=1, tokens]; the engines run with exclude_input_in_output=false.
        full = output_ids.reshape(-1, output_ids.shape[-1])[0][: int(lengths.reshape(-1)[0])]
        return [int(token) for token in full[len(sequence) :]]
