"""specops's TensorRT-LLM model for Triton's python backend (model ``tensorrt_llm``).

This file is shipped into each serving pod's model repository as ``tensorrt_llm/1/model.py``;
the operator never imports it. It stands in for TensorRT-LLM's ``llmapi`` model and speaks the
same language, plus metrics:

- ``initialize`` reads ``model.yaml`` next to this file (``LLM_CONFIG_PATH`` names another file,
  relative to this directory or absolute) and passes every key but ``triton_config`` to
  ``tensorrt_llm.LLM(**args)``: the LLM API, whose only execution backend is PyTorch.
- ``execute`` reads ``text_input`` and the ``sampling_param_*`` inputs, hands each request to
  ``LLM.generate_async`` on an event loop of its own and returns at once. The response goes
  out through the request's response sender when generation ends (one response per request:
  the model is not decoupled). Triton can therefore hand in the next request while others
  are generating, and the LLM API batches them in flight; a model whose ``execute`` waited for
  its answers would see one request at a time (``max_batch_size`` is 0, one instance).
- Every request asks for its perf metrics (``return_perf_metrics=True``), whatever the client
  sent, and the model exports what the upstream model does not, through Triton's
  custom-metrics API (labels ``model`` and ``version``):

  ``specops_num_requests_running``               gauge: requests handed to the LLM, not finished
  ``specops_time_per_output_token_seconds``      histogram: one observation per finished request,
                                                 its mean time per output token after the first
  ``specops_spec_decode_draft_tokens_total``     counter: draft tokens proposed
  ``specops_spec_decode_accepted_tokens_total``  counter: draft tokens accepted
  ``specops_generation_tokens_total``            counter: tokens generated
  ``specops_request_success_total``              counter: requests answered with text

  A plain engine (no ``speculative_config``), or a build that reports no speculation counts
  for its mode, adds 0 to the speculation counters. A python backend without the histogram
  kind gets ``specops_time_per_output_token_seconds_sum`` and ``_count`` counters instead.
- ``finalize`` waits for the requests in flight, then shuts the LLM down.

Streaming and stop (cancel) requests need a decoupled model and are answered with an error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

CONFIG_ENV = "LLM_CONFIG_PATH"
DEFAULT_CONFIG = "model.yaml"
TRITON_CONFIG_KEY = "triton_config"
DEFAULT_MODEL_NAME = "tensorrt_llm"
DEFAULT_MODEL_VERSION = "1"
FINALIZE_WAIT_S = 120.0
"""How long unloading waits for requests in flight before it shuts the LLM down anyway."""

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
"""Seconds per output token: 0.1 ms steps up to 1 ms (MoE targets with few active parameters
decode a token in 0.3-0.6 ms; coarser buckets would make speculation on and off look alike),
0.25-1 ms steps up to 10 ms (dense targets with speculation), then on to 1 s."""

SAMPLING_INPUTS: dict[str, tuple[str, type]] = {
    "sampling_param_max_tokens": ("max_tokens", int),
    "sampling_param_temperature": ("temperature", float),
    "sampling_param_top_k": ("top_k", int),
    "sampling_param_top_p": ("top_p", float),
    "sampling_param_seed": ("seed", int),
}
"""Scalar inputs (names of the upstream llmapi model) -> SamplingParams argument."""


# ------------------------------------------------------------------ configuration


def config_path(model_dir: str) -> str:
    """``model.yaml`` in the model's version directory, or ``$LLM_CONFIG_PATH`` (absolute or relative)."""
    return os.path.join(model_dir, os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)


def load_config(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as file:
            config = yaml.safe_load(file)
    except OSError as error:
        raise ValueError(f"cannot read the LLM config {path}: {error}") from error
    except yaml.YAMLError as error:
        raise ValueError(f"the LLM config {path} is not YAML: {error}") from error
    if not isinstance(config, dict):
        raise ValueError(f"the LLM config {path} must be a mapping of LLM arguments")
    return config


def llm_arguments(config: Mapping[str, Any]) -> dict[str, Any]:
    """Every key of ``model.yaml`` but ``triton_config``, for ``LLM(**args)``."""
    return {key: value for key, value in config.items() if key != TRITON_CONFIG_KEY}


def check_triton_config(config: Mapping[str, Any]) -> None:
    triton_config = config.get(TRITON_CONFIG_KEY) or {}
    if not isinstance(triton_config, dict):
        raise ValueError("triton_config must be a mapping")
    if triton_config.get("decoupled"):
        raise ValueError("triton_config.decoupled: this model answers once per request (decoupled: false)")


# ------------------------------------------------------------------ requests


@dataclass(frozen=True)
class Prompt:
    """One request as plain values (Triton frees the request's tensors when execute returns)."""

    text: str
    sampling: dict[str, Any] = field(default_factory=dict)


def _array(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else np.asarray(tensor.as_numpy())


def _one(request: Any, name: str) -> Any:
    """The single value of input ``name``, or None when the request leaves it out."""
    array = _array(request, name)
    if array is None:
        return None
    if array.size != 1:
        raise ValueError(f"{name} must hold exactly one value, got shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    return value.item() if isinstance(value, np.generic) and not isinstance(value, np.bytes_) else value


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def parse_request(request: Any) -> Prompt:
    """The prompt and sampling parameters of one request; ValueError says what is wrong."""
    if _one(request, "streaming"):
        raise ValueError("streaming needs a decoupled model: send streaming false")
    if _one(request, "stop"):
        raise ValueError("stop requests cancel a stream and need a decoupled model")
    text = _one(request, "text_input")
    if text is None:
        raise ValueError("text_input is required")
    sampling: dict[str, Any] = {}
    for name, (argument, kind) in SAMPLING_INPUTS.items():
        value = _one(request, name)
        if value is not None:
            sampling[argument] = kind(value)
    if sampling.get("max_tokens", 1) < 1:
        raise ValueError("sampling_param_max_tokens must be at least 1")
    if sampling.get("temperature", 0.0) < 0:
        raise ValueError("sampling_param_temperature must be >= 0")
    stop = _array(request, "sampling_param_stop")
    if stop is not None and stop.size:
        sampling["stop"] = [_text(word) for word in stop.reshape(-1)]
    return Prompt(text=_text(text), sampling=sampling)


# ------------------------------------------------------------------ results


@dataclass(frozen=True)
class Outcome:
    """What one finished request produced and cost."""

    text: str
    output_tokens: int
    draft_tokens: int
    accepted_tokens: int
    time_per_output_token: float | None

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


def _seconds(value: Any) -> float | None:
    """A timing field (a timedelta from the bindings, or seconds) in seconds; None when unset."""
    if value is None:
        return None
    seconds = value.total_seconds() if hasattr(value, "total_seconds") else float(value)
    return seconds if seconds > 0 else None


def _count(source: Any, name: str) -> int:
    value = getattr(source, name, 0) if source is not None else 0
    return max(0, int(value or 0))


def outcome_of(result: Any, wall_seconds: float) -> Outcome:
    """Text, tokens, speculation counts and time per output token of a finished request.

    Time per output token is (last token time - first token time) / (tokens - 1), as
    TensorRT-LLM computes it; without timing metrics the request's wall time / tokens stands
    in. A request of fewer than two tokens has no time per output token.
    """
    output = result.outputs[0]
    tokens = len(getattr(output, "token_ids", None) or [])
    perf = getattr(output, "request_perf_metrics", None)
    spec = getattr(perf, "speculative_decoding", None) if perf is not None else None
    timing = getattr(perf, "timing_metrics", None) if perf is not None else None
    tpot: float | None = None
    if tokens >= 2:
        first = _seconds(getattr(timing, "first_token_time", None)) if timing is not None else None
        last = _seconds(getattr(timing, "last_token_time", None)) if timing is not None else None
        if first is not None and last is not None and last >= first:
            tpot = (last - first) / (tokens - 1)
        elif wall_seconds > 0:
            tpot = wall_seconds / tokens
    return Outcome(
        text=str(output.text),
        output_tokens=tokens,
        draft_tokens=_count(spec, "total_draft_tokens"),
        accepted_tokens=_count(spec, "total_accepted_draft_tokens"),
        time_per_output_token=tpot,
    )


def success_response(outcome: Outcome) -> Any:
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("text_output", np.array([outcome.text.encode("utf-8")], dtype=np.object_)),
            pb_utils.Tensor("acceptance_rate", np.array([outcome.acceptance_rate], dtype=np.float32)),
            pb_utils.Tensor(
                "total_accepted_draft_tokens", np.array([outcome.accepted_tokens], dtype=np.int32)
            ),
            pb_utils.Tensor("total_draft_tokens", np.array([outcome.draft_tokens], dtype=np.int32)),
        ]
    )


def error_response(message: str, code: str = "INTERNAL") -> Any:
    error_code = getattr(pb_utils.TritonError, code, None)
    error = pb_utils.TritonError(message) if error_code is None else pb_utils.TritonError(message, error_code)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


# ------------------------------------------------------------------ metrics


class Metrics:
    """The model's custom metrics; families live on the instance as long as the model does."""

    def __init__(self, labels: dict[str, str]) -> None:
        kinds = pb_utils.MetricFamily
        self._lock = threading.Lock()
        self._running_count = 0
        self._families: dict[str, Any] = {}

        def metric(key: str, name: str, description: str, kind: Any, **extra: Any) -> Any:
            family = pb_utils.MetricFamily(name=name, description=description, kind=kind)
            self._families[key] = family
            return family.Metric(labels=labels, **extra)

        self.running = metric(
            "running",
            "specops_num_requests_running",
            "Requests handed to the LLM and not finished.",
            kinds.GAUGE,
        )
        self.draft = metric(
            "draft",
            "specops_spec_decode_draft_tokens_total",
            "Draft tokens proposed for verification.",
            kinds.COUNTER,
        )
        self.accepted = metric(
            "accepted",
            "specops_spec_decode_accepted_tokens_total",
            "Draft tokens the target accepted.",
            kinds.COUNTER,
        )
        self.generated = metric(
            "generated", "specops_generation_tokens_total", "Tokens generated.", kinds.COUNTER
        )
        self.success = metric(
            "success", "specops_request_success_total", "Requests answered with text.", kinds.COUNTER
        )
        description = "Per finished request: its mean time per output token after the first, in seconds."
        self.tpot: Any = None
        self.tpot_sum: Any = None
        self.tpot_count: Any = None
        if hasattr(kinds, "HISTOGRAM"):
            self.tpot = metric(
                "tpot",
                "specops_time_per_output_token_seconds",
                description,
                kinds.HISTOGRAM,
                buckets=TPOT_BUCKETS,
            )
        else:
            self.tpot_sum = metric(
                "tpot_sum", "specops_time_per_output_token_seconds_sum", description, kinds.COUNTER
            )
            self.tpot_count = metric(
                "tpot_count", "specops_time_per_output_token_seconds_count", description, kinds.COUNTER
            )

    def started(self) -> None:
        self._move_running(1)

    def ended(self) -> None:
        self._move_running(-1)

    def _move_running(self, delta: int) -> None:
        with self._lock:
            self._running_count = max(0, self._running_count + delta)
            self.running.set(float(self._running_count))

    def record(self, outcome: Outcome) -> None:
        with self._lock:
            self.success.increment(1.0)
            for metric, value in (
                (self.generated, outcome.output_tokens),
                (self.draft, outcome.draft_tokens),
                (self.accepted, outcome.accepted_tokens),
            ):
                if value:
                    metric.increment(float(value))
            tpot = outcome.time_per_output_token
            if tpot is not None:
                if self.tpot is not None:
                    self.tpot.observe(tpot)
                else:
                    self.tpot_sum.increment(tpot)
                    self.tpot_count.increment(1.0)


# ------------------------------------------------------------------ the model


def _final_flag() -> int:
    return int(pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    """Triton python-backend entry point."""

    def initialize(self, args: dict[str, str]) -> None:
        labels = {
            "model": args.get("model_name") or DEFAULT_MODEL_NAME,
            "version": str(args.get("model_version") or DEFAULT_MODEL_VERSION),
        }
        path = config_path(os.path.dirname(os.path.abspath(__file__)))
        config = load_config(path)
        check_triton_config(config)
        llm_args = llm_arguments(config)

        # Imported here, not at module level: importing tensorrt_llm initialises CUDA.
        import tensorrt_llm

        try:
            from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict
        except ImportError:
            update_llm_args_with_extra_dict = None
        if update_llm_args_with_extra_dict is not None:
            # Turns nested blocks (speculative_config, kv_cache_config, ...) into their classes.
            llm_args = update_llm_args_with_extra_dict({}, llm_args)

        self._sampling_params = tensorrt_llm.SamplingParams
        self._pending: set[concurrent.futures.Future[None]] = set()
        self._pending_lock = threading.Lock()
        self._closing = False
        self._metrics = Metrics(labels)
        pb_utils.Logger.log_info(f"specops llmapi model: LLM arguments from {path}: {sorted(llm_args)}")
        self._llm = tensorrt_llm.LLM(**llm_args)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="specops-llmapi-requests", daemon=True
        )
        self._thread.start()

    def execute(self, requests: list[Any]) -> None:
        """Start each request and return; its response is sent when it finishes."""
        for request in requests:
            sender = request.get_response_sender()
            if self._closing:
                sender.send(error_response("the model is unloading", "UNAVAILABLE"), flags=_final_flag())
                continue
            try:
                prompt = parse_request(request)
            except Exception as error:
                sender.send(error_response(str(error), "INVALID_ARG"), flags=_final_flag())
                continue
            self._metrics.started()
            future = asyncio.run_coroutine_threadsafe(self._serve(prompt, sender), self._loop)
            with self._pending_lock:
                self._pending.add(future)
            future.add_done_callback(self._forget)
        return None

    def _forget(self, future: concurrent.futures.Future[None]) -> None:
        with self._pending_lock:
            self._pending.discard(future)

    async def _serve(self, prompt: Prompt, sender: Any) -> None:
        started = time.perf_counter()
        try:
            params = self._sampling_params(**prompt.sampling, return_perf_metrics=True)
            result = await self._llm.generate_async(prompt.text, params, streaming=False).aresult()
            outcome = outcome_of(result, time.perf_counter() - started)
            response = success_response(outcome)
        except Exception as error:
            pb_utils.Logger.log_error(f"specops llmapi model: generation failed: {error}")
            outcome = None
            response = error_response(f"generation failed: {error}")
        finally:
            self._metrics.ended()
        if outcome is not None:
            try:
                self._metrics.record(outcome)
            except Exception as error:  # a metrics fault must not lose the answer
                pb_utils.Logger.log_error(f"specops llmapi model: recording metrics failed: {error}")
        try:
            sender.send(response, flags=_final_flag())
        except Exception as error:
            pb_utils.Logger.log_error(f"specops llmapi model: sending a response failed: {error}")

    def finalize(self) -> None:
        """Wait for the requests in flight (at most FINALIZE_WAIT_S), then shut the LLM down."""
        self._closing = True
        with self._pending_lock:
            pending = list(self._pending)
        if pending:
            pb_utils.Logger.log_info(f"specops llmapi model: waiting for {len(pending)} requests")
            concurrent.futures.wait(pending, timeout=FINALIZE_WAIT_S)
        try:
            self._llm.shutdown()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()
            pb_utils.Logger.log_info("specops llmapi model: LLM shut down")
