"""A small stand-in for Triton's python-backend module ``triton_python_backend_utils``.

Tests install it with ``monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)``
and then load a python-backend model file. Only what specops's model uses is here:
tensors, inference requests and responses, response senders (each records what it sent),
errors with their codes, calls to other models (served by fakes registered with
:func:`serve`), custom metrics and the logger. Custom metrics are recorded in
:data:`METRICS` so tests can read what a model counted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

ModelHandler = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]
"""A fake model: input name -> array in, output name -> array out."""

MODELS: dict[str, ModelHandler] = {}
METRICS: dict[str, dict[frozenset[tuple[str, str]], Any]] = {}
"""family name -> frozen label set -> value (a float, or a list of observations for histograms)."""
METRIC_KINDS: dict[str, str] = {}
LOG: list[tuple[str, str]] = []

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1


def reset() -> None:
    MODELS.clear()
    METRICS.clear()
    METRIC_KINDS.clear()
    LOG.clear()


def serve(model_name: str, handler: ModelHandler) -> None:
    """Make requests to ``model_name`` answer with ``handler``."""
    MODELS[model_name] = handler


def metric_value(name: str, labels: Mapping[str, str]) -> Any:
    return METRICS.get(name, {}).get(frozenset(labels.items()))


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 1) -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):
    pass


class Tensor:
    def __init__(self, name: str, data: Any) -> None:
        self._name = name
        self._data = np.asarray(data)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._data

    def is_cpu(self) -> bool:
        return True


class InferenceResponse:
    def __init__(self, output_tensors: Sequence[Tensor], error: TritonError | None = None) -> None:
        self._tensors = list(output_tensors)
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return list(self._tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


class ResponseSender:
    """A request's response sender: records ``(response, flags)`` pairs, in order, from any thread."""

    def __init__(self) -> None:
        self.sent: list[tuple[InferenceResponse | None, int]] = []
        self._final = threading.Event()
        self._lock = threading.Lock()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        with self._lock:
            if self._final.is_set():
                raise RuntimeError("a response was sent after the final flag")
            self.sent.append((response, flags))
            if flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self._final.set()

    def wait_final(self, timeout: float = 5.0) -> InferenceResponse | None:
        """The last response once the final flag has been sent (AssertionError on timeout)."""
        assert self._final.wait(timeout), "no final response"
        return self.sent[-1][0]

    @property
    def finished(self) -> bool:
        return self._final.is_set()


class InferenceRequest:
    """Both the request a model receives and a request it sends to another model (``exec``)."""

    def __init__(
        self,
        model_name: str = "",
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        **_: Any,
    ) -> None:
        self.model_name = model_name
        self._inputs = list(inputs)
        self.requested_output_names = list(requested_output_names)
        self.sender = ResponseSender()

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def get_response_sender(self) -> ResponseSender:
        return self.sender

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        if decoupled:
            raise NotImplementedError("the stub serves non-decoupled requests only")
        handler = MODELS.get(self.model_name)
        if handler is None:
            return InferenceResponse([], TritonError(f"Request for unknown model: '{self.model_name}'"))
        try:
            outputs = handler({t.name(): t.as_numpy() for t in self._inputs})
        except Exception as error:  # a failing model answers with an error, as Triton does
            return InferenceResponse([], TritonError(str(error)))
        names = self.requested_output_names or list(outputs)
        return InferenceResponse([Tensor(name, outputs[name]) for name in names if name in outputs])


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


class Metric:
    def __init__(
        self, family: MetricFamily, labels: Mapping[str, str], buckets: Sequence[float] | None
    ) -> None:
        self._family = family
        self._key = frozenset(labels.items())
        self.buckets = list(buckets) if buckets is not None else None
        if family.kind == HISTOGRAM and buckets is None:
            raise ValueError("histogram metrics need buckets")
        store = METRICS.setdefault(family.name, {})
        store.setdefault(self._key, [] if family.kind == HISTOGRAM else 0.0)

    def increment(self, value: float) -> None:
        if self._family.kind not in (COUNTER, GAUGE):
            raise TypeError("increment() needs a counter or gauge")
        if self._family.kind == COUNTER and value < 0:
            raise ValueError("counters only go up")
        METRICS[self._family.name][self._key] += value

    def set(self, value: float) -> None:
        if self._family.kind != GAUGE:
            raise TypeError("set() needs a gauge")
        METRICS[self._family.name][self._key] = value

    def observe(self, value: float) -> None:
        if self._family.kind != HISTOGRAM:
            raise TypeError("observe() needs a histogram")
        METRICS[self._family.name][self._key].append(value)

    def value(self) -> Any:
        return METRICS[self._family.name][self._key]


class MetricFamily:
    COUNTER = COUNTER
    GAUGE = GAUGE
    HISTOGRAM = HISTOGRAM
    """Older python backends lack HISTOGRAM: tests may delete it to exercise a model's fallback."""

    def __init__(self, name: str, description: str, kind: str) -> None:
        if kind not in (COUNTER, GAUGE, HISTOGRAM):
            raise ValueError(f"unknown metric kind {kind!r}")
        if METRIC_KINDS.setdefault(name, kind) != kind:
            raise ValueError(f"metric family {name} already registered with another kind")
        self.name = name
        self.description = description
        self.kind = kind

    def Metric(
        self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        return Metric(self, labels or {}, buckets)


class Logger:
    @staticmethod
    def log_info(message: str) -> None:
        LOG.append(("info", message))

    @staticmethod
    def log_warn(message: str) -> None:
        LOG.append(("warn", message))

    @staticmethod
    def log_error(message: str) -> None:
        LOG.append(("error", message))

    @staticmethod
    def log_verbose(message: str) -> None:
        LOG.append(("verbose", message))
