"""The operator's own metrics, served on ``/metrics`` for Prometheus (docs/metrics.md).

Per resource, every gauge is set from the status the operator just wrote
(``observe_status``), so what Prometheus sees is what ``kubectl get -o yaml`` shows;
decisions, revision rollouts, canary rollbacks and acceptance collapses are counted when the
status shows a new one.
Durations and errors are recorded where they happen (handlers, adapters).

Names follow Prometheus' conventions: ``specops_`` prefix, base units (seconds,
ratios), ``_total`` on counters. Every per-resource series carries ``namespace`` and
``name`` labels and is removed by ``forget`` when the resource goes away.
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
import zlib
from collections.abc import Iterator, Mapping
from socketserver import ThreadingMixIn
from typing import Any, get_args
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CONTENT_TYPE_PLAIN_0_0_4,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from specops.api.models import SpeculativeDeploymentStatus
from specops.api.units import parse_duration

DEFAULT_PORT = 8081
PHASES: tuple[str, ...] = tuple(
    phase
    for member in get_args(SpeculativeDeploymentStatus.model_fields["phase"].annotation)
    for phase in get_args(member)
)
"""Every lifecycle phase: ``specops_phase`` is 1 for the current one and 0 for the others."""
CONDITION_STATUSES = ("True", "False", "Unknown")
RESOURCE = ("namespace", "name")
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _break_even(calibration: Mapping[str, Any]) -> float | None:
    """status.speculation.calibration.breakEvenBatch; +Inf when computed and none up to 1024."""
    if not calibration.get("breakEvenKnown"):
        return None
    batch = _number(calibration.get("breakEvenBatch"))
    return math.inf if batch is None else batch


def _seconds(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_duration(value)
    except ValueError:
        return None


_UNSET = object()
_REMEMBERED = ("state", "draftLength", "lastChangeTime", "lastDecisionTime", "acceptanceCollapses")
"""What the previous speculation status must show to count the next decision and toggle."""


class PerResourceMetric:
    """One per-resource metric family held as plain values: labels (namespace, name, ...) -> value.

    prometheus_client's labelled children cost about 0.65 KiB each (a child object, a lock, and a
    value with its own lock): at about 45 series per resource that was 29 KiB per resource, 57 MiB
    at 2,000. Here a series is one dict entry, rendered when Prometheus scrapes
    (`PerResourceCollector`, the client's custom-collector interface). The API is the part of
    Gauge and Counter the operator uses: ``labels(...).set/inc`` and ``remove(...)``."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...], *, counter: bool = False):
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.counter = counter
        self.values: dict[tuple[str, ...], float] = {}

    def labels(self, *labelvalues: str) -> _Series:
        if len(labelvalues) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {labelvalues}")
        return _Series(self.values, tuple(labelvalues))

    def remove(self, *labelvalues: str) -> None:
        del self.values[tuple(labelvalues)]

    def family(self, samples: list[tuple[tuple[str, ...], float]]) -> Metric:
        family: Metric
        if self.counter:
            family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        else:
            family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labelvalues, value in samples:
            family.add_metric(labelvalues, value)
        return family


class _Series:
    __slots__ = ("_key", "_values")

    def __init__(self, values: dict[tuple[str, ...], float], key: tuple[str, ...]) -> None:
        self._values, self._key = values, key
        values.setdefault(key, 0.0)

    def set(self, value: float) -> None:
        self._values[self._key] = float(value)

    def inc(self, amount: float = 1.0) -> None:
        self._values[self._key] = self._values.get(self._key, 0.0) + amount


class PerResourceCollector:
    """Renders the per-resource families for a scrape, copying each family's values under the
    writers' lock (the metrics server answers from its own thread)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.metrics: list[PerResourceMetric] = []

    def add(self, metric: PerResourceMetric) -> PerResourceMetric:
        self.metrics.append(metric)
        return metric

    def describe(self) -> list[Metric]:
        return [metric.family([]) for metric in self.metrics]

    def collect(self) -> Iterator[Metric]:
        """One family at a time: the exposition writes each before the next is built, so a scrape
        holds one family's samples (about 2,000-16,000 at 2,000 resources), not all 90,000."""
        for metric in self.metrics:
            with self._lock:
                samples = list(metric.values.items())
            yield metric.family(samples)


class OperatorMetrics:
    """All of specops' metrics in one registry (the process default in the operator, a fresh one in tests)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._lock = threading.Lock()
        # What each resource last showed: to count new decisions/toggles/rollbacks and drop old label sets.
        self._seen: dict[tuple[str, str], dict[str, Any]] = {}
        per_resource = PerResourceCollector(self._lock)

        def gauge(name: str, doc: str, *extra: str) -> PerResourceMetric:
            return per_resource.add(PerResourceMetric(name, doc, (*RESOURCE, *extra)))

        def counter(name: str, doc: str, *extra: str) -> PerResourceMetric:
            return per_resource.add(PerResourceMetric(name, doc, (*RESOURCE, *extra), counter=True))

        self.phase = gauge(
            "specops_phase", "1 for the resource's current lifecycle phase, 0 for the others.", "phase"
        )
        self.speculation_enabled = gauge(
            "specops_speculation_enabled", "1 while serving pods speculate, 0 when off."
        )
        self.draft_length = gauge("specops_draft_length", "Draft tokens per step the pods run (0 = off).")
        self.alpha = gauge("specops_acceptance_alpha", "Measured per-token acceptance alpha.")
        self.smoothed_alpha = gauge(
            "specops_smoothed_acceptance_alpha", "Smoothed alpha the control loop used."
        )
        self.acceptance_rate = gauge("specops_acceptance_rate_ratio", "Accepted / drafted tokens.")
        self.batch = gauge("specops_running_requests_per_pod", "Running requests (batch) per serving pod.")
        self.request_rate = gauge("specops_request_rate_per_second", "Completed requests per second.")
        self.tpot_p99 = gauge("specops_per_token_latency_p99_seconds", "Measured per-token latency p99.")
        self.baseline_tpot_p50 = gauge(
            "specops_baseline_per_token_latency_p50_seconds", "Per-token latency p50 without speculation."
        )
        self.baseline_tpot_p99 = gauge(
            "specops_baseline_per_token_latency_p99_seconds", "Per-token latency p99 without speculation."
        )
        self.predicted_speedup = gauge(
            "specops_predicted_speedup_ratio", "Modelled speedup of the last decision."
        )
        self.measured_speedup = gauge(
            "specops_measured_speedup_ratio", "Baseline p50 per-token latency / current p50 (while on)."
        )
        self.learned_break_even = gauge(
            "specops_learned_break_even_batch",
            "Fitted running requests per pod from which no draft length pays, at the current alpha "
            "(+Inf: none up to 1024; absent before the Dynamic phase).",
        )
        self.pods_desired = gauge("specops_pods_desired", "Ready serving pods that should run the setting.")
        self.pods_applied = gauge("specops_pods_applied", "Serving pods confirmed to run the setting.")
        self.canary_active = gauge("specops_canary_active", "1 while a canary of a new draft runs.")
        self.canary_weight = gauge(
            "specops_canary_weight_ratio", "Share of traffic the canary receives (0-1)."
        )
        self.canary_step = gauge(
            "specops_canary_step", "Index of the canary step (-1 during the lossless check)."
        )
        self.retraining_round = gauge(
            "specops_retraining_round", "Number of the latest draft retraining round."
        )
        self.retraining_running = gauge("specops_retraining_running", "1 while a retraining round runs.")
        self.retraining_failures = gauge(
            "specops_retraining_consecutive_failures", "Retraining rounds failed in a row."
        )
        self.condition = gauge(
            "specops_condition",
            "1 for each status condition's current status and reason, per condition type.",
            "type",
            "status",
            "reason",
        )
        self.slo_min_acceptance = gauge("specops_slo_min_acceptance", "spec.slo.minAcceptance.")
        self.slo_tpot_p99 = gauge(
            "specops_slo_per_token_latency_p99_seconds", "spec.slo.perTokenLatencyP99, when set."
        )
        self.decisions = counter(
            "specops_decisions",
            "Control-loop decisions, by action (enable, disable, lengthen, shorten, hold) and reason.",
            "action",
            "reason",
        )
        self.toggles = counter(
            "specops_revision_rollouts", "Revisions rolled out to the stable pods (each restarts every pod)."
        )
        self.rollbacks = counter("specops_canary_rollbacks", "Canaries of a new draft rolled back.")
        self.acceptance_collapses = counter(
            "specops_acceptance_collapses",
            "Stable pods whose acceptance collapsed while their neighbours on the same draft accepted "
            "normally, each deleted so a fresh engine replaced it.",
        )
        r.register(per_resource)
        self.reconcile_duration = Histogram(
            "specops_reconcile_duration_seconds",
            "Time to reconcile a SpeculativeDeployment (create, update, resume).",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.reconcile_errors = Counter(
            "specops_reconcile_errors",
            "Reconciles that failed and will be retried, by error kind.",
            ["kind"],
            registry=r,
        )
        self.tick_duration = Histogram(
            "specops_control_tick_duration_seconds",
            "Time of one resource's periodic tick (control loop, canary, retraining).",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ticks = Counter(
            "specops_control_ticks",
            "Resources' periodic ticks, by outcome: decided (the control loop's step ran in full), or "
            "unchanged (its inputs had not moved since the last step: nothing was decided again).",
            ["outcome"],
            registry=r,
        )
        self._tick_children = (self.ticks.labels("decided"), self.ticks.labels("unchanged"))
        self.errors = Counter(
            "specops_errors",
            "Errors talking to the Kubernetes API, Prometheus or Triton, by component and kind.",
            ["component", "kind"],
            registry=r,
        )
        self.gc_seconds = Counter(
            "specops_gc_seconds",
            "CPU time the operator's process spent in CPython's cyclic garbage collector, by generation.",
            ["generation"],
            registry=r,
        )
        # each generation's child resolved once: a young pass runs hundreds of times a second at
        # scale, and a labels() lookup (a lock, a tuple, a dict) per pass was a fiftieth of the CPU
        self._gc_children = tuple(self.gc_seconds.labels(str(generation)) for generation in range(3))
        # Labelled (namespace, name) only; phase, condition and decisions carry more labels.
        self._per_resource: tuple[PerResourceMetric, ...] = (
            self.speculation_enabled,
            self.draft_length,
            self.alpha,
            self.smoothed_alpha,
            self.acceptance_rate,
            self.batch,
            self.request_rate,
            self.tpot_p99,
            self.baseline_tpot_p50,
            self.baseline_tpot_p99,
            self.predicted_speedup,
            self.measured_speedup,
            self.learned_break_even,
            self.pods_desired,
            self.pods_applied,
            self.canary_active,
            self.canary_weight,
            self.canary_step,
            self.retraining_round,
            self.retraining_running,
            self.retraining_failures,
            self.slo_min_acceptance,
            self.slo_tpot_p99,
            self.toggles,
            self.rollbacks,
            self.acceptance_collapses,
        )

    # ------------------------------------------------------------ per resource

    def observe_status(
        self, namespace: str, name: str, status: Mapping[str, Any], spec: Mapping[str, Any] | None = None
    ) -> None:
        """Set every per-resource gauge from a status as stored in the resource (camelCase JSON).

        A field absent from the status removes its series rather than leaving a stale value.
        ``spec`` (optional) adds the SLO gauges the alerts compare against.
        """
        key = (namespace, name)
        with self._lock:
            seen = self._seen.setdefault(key, {"labels": {}})
            first = "speculation" not in seen
            speculation = status.get("speculation") or {}
            observed = status.get("observed") or {}
            baseline = status.get("baseline") or {}
            canary = status.get("canary") or None
            retraining = status.get("retraining") or {}
            pods = speculation.get("pods") or {}

            phase = status.get("phase")
            if first or seen.get("phase", _UNSET) != phase:
                for known in PHASES:
                    self.phase.labels(namespace, name, known).set(1.0 if phase == known else 0.0)
                seen["phase"] = phase

            state = speculation.get("state")
            length = _number(speculation.get("draftLength"))
            self._set(self.speculation_enabled, key, None if state is None else float(state == "on"))
            self._set(self.draft_length, key, length)
            self._set(self.smoothed_alpha, key, _number(speculation.get("smoothedAlpha")))
            self._set(self.predicted_speedup, key, _number(speculation.get("predictedSpeedup")))
            self._set(self.measured_speedup, key, _number(speculation.get("measuredSpeedup")))
            self._set(self.learned_break_even, key, _break_even(speculation.get("calibration") or {}))
            self._set(self.pods_desired, key, _number(pods.get("desired")))
            self._set(self.pods_applied, key, _number(pods.get("applied")))
            self._set(self.alpha, key, _number(observed.get("alpha")))
            self._set(self.acceptance_rate, key, _number(observed.get("acceptanceRate")))
            self._set(self.batch, key, _number(observed.get("batch")))
            self._set(self.request_rate, key, _number(observed.get("requestRate")))
            self._set(self.tpot_p99, key, _seconds(observed.get("perTokenLatencyP99")))
            self._set(self.baseline_tpot_p50, key, _seconds(baseline.get("perTokenLatencyP50")))
            self._set(self.baseline_tpot_p99, key, _seconds(baseline.get("perTokenLatencyP99")))

            self._set(self.canary_active, key, 1.0 if canary else 0.0)
            weight = _number((canary or {}).get("weight"))
            self._set(self.canary_weight, key, None if weight is None else weight / 100.0)
            self._set(self.canary_step, key, _number((canary or {}).get("step")))

            active = retraining.get("active") or None
            round_number = _number((active or {}).get("round"))
            if round_number is None:
                round_number = _number(retraining.get("rounds"))
            self._set(self.retraining_round, key, round_number)
            self._set(self.retraining_running, key, 1.0 if active else 0.0)
            self._set(self.retraining_failures, key, _number(retraining.get("consecutiveFailures")))

            self._observe_conditions(key, seen, status.get("conditions") or [])
            if spec is not None:
                slo = spec.get("slo") or {}
                self._set(self.slo_min_acceptance, key, _number(slo.get("minAcceptance")))
                self._set(self.slo_tpot_p99, key, _seconds(slo.get("perTokenLatencyP99")))

            # Counters start at 0 so that increase() sees the first event; the first status seen
            # (e.g. after an operator restart) is a starting point, not an event.
            if first:
                self.toggles.labels(namespace, name)
                self.rollbacks.labels(namespace, name)
                self.acceptance_collapses.labels(namespace, name)
            previous = seen.get("speculation") or {}
            if not first:
                toggle = speculation.get("lastChangeTime")
                if toggle and toggle != previous.get("lastChangeTime"):
                    self.toggles.labels(namespace, name).inc()
                collapses = _number(speculation.get("acceptanceCollapses")) or 0.0
                before = _number(previous.get("acceptanceCollapses")) or 0.0
                if collapses > before:  # a count that went down (status rewritten) is a new start
                    self.acceptance_collapses.labels(namespace, name).inc(collapses - before)
                decided = speculation.get("lastDecisionTime")
                if decided and decided != previous.get("lastDecisionTime"):
                    self._count_decision(key, seen, decision_action(previous, speculation), speculation)
                last_canary = status.get("lastCanary") or None
                if (
                    last_canary
                    and last_canary != seen.get("lastCanary")
                    and last_canary.get("result") == "RolledBack"
                ):
                    self.rollbacks.labels(namespace, name).inc()
            seen["speculation"] = {field: speculation.get(field) for field in _REMEMBERED}
            seen["lastCanary"] = status.get("lastCanary") or None

    def observe_decision(self, namespace: str, name: str, action: str, reason: str) -> None:
        """Count one control-loop decision."""
        with self._lock:
            seen = self._seen.setdefault((namespace, name), {"labels": {}})
            self._count_decision((namespace, name), seen, action, {"reason": reason})

    def forget(self, namespace: str, name: str) -> None:
        """Remove every series of a resource that is gone."""
        key = (namespace, name)
        with self._lock:
            seen = self._seen.pop(key, {"labels": {}})
            for metric in self._per_resource:
                with contextlib.suppress(KeyError):
                    metric.remove(namespace, name)
            for known in PHASES:
                with contextlib.suppress(KeyError):
                    self.phase.remove(namespace, name, known)
            for metric_name, label_sets in seen["labels"].items():
                metric = getattr(self, metric_name)
                for labels in label_sets:
                    with contextlib.suppress(KeyError):
                        metric.remove(namespace, name, *labels)

    def _set(self, gauge: PerResourceMetric, key: tuple[str, str], value: float | None) -> None:
        """Set (or, for None, remove) one resource's series."""
        if value is None:
            gauge.values.pop(key, None)
        else:
            gauge.values[key] = float(value)

    def _observe_conditions(self, key: tuple[str, str], seen: dict[str, Any], conditions: list[Any]) -> None:
        current: set[tuple[str, ...]] = set()
        for condition in conditions:
            if not isinstance(condition, Mapping) or not condition.get("type"):
                continue
            labels = (
                str(condition["type"]),
                str(condition.get("status", "Unknown")),
                str(condition.get("reason", "")),
            )
            current.add(labels)
            if labels not in seen["labels"].get("condition", set()):
                self.condition.labels(*key, *labels).set(1.0)
        for labels in seen["labels"].get("condition", set()) - current:
            with contextlib.suppress(KeyError):
                self.condition.remove(*key, *labels)
        seen["labels"]["condition"] = current

    def _count_decision(
        self, key: tuple[str, str], seen: dict[str, Any], action: str, speculation: Mapping[str, Any]
    ) -> None:
        labels = (action, str(speculation.get("reason") or "Unknown"))
        self.decisions.labels(*key, *labels).inc()
        seen["labels"].setdefault("decisions", set()).add(labels)

    # ------------------------------------------------------------ operator-wide

    @contextlib.contextmanager
    def time_reconcile(self) -> Iterator[None]:
        """Time a reconcile; an exception counts as a reconcile error (by its class) and propagates."""
        start = time.perf_counter()
        try:
            yield
        except Exception as error:
            self.reconcile_errors.labels(type(error).__name__).inc()
            raise
        finally:
            self.reconcile_duration.observe(time.perf_counter() - start)

    @contextlib.contextmanager
    def time_tick(self) -> Iterator[None]:
        """Time one resource's periodic tick."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.tick_duration.observe(time.perf_counter() - start)

    def count_tick(self, unchanged: bool) -> None:
        """One resource's tick ended, having decided or finding its inputs unchanged."""
        self._tick_children[1 if unchanged else 0].inc()

    def count_error(self, component: str, kind: str) -> None:
        """One failed call to ``component`` (kubernetes, prometheus, triton); ``kind`` says how it failed."""
        self.errors.labels(component, kind).inc()

    def count_gc(self, generation: int, seconds: float) -> None:
        """One garbage collection pass of ``generation`` (0 youngest, 2 full) that took ``seconds``."""
        if 0 <= generation < len(self._gc_children):
            self._gc_children[generation].inc(seconds)
        else:
            self.gc_seconds.labels(str(generation)).inc(seconds)

    def serve(
        self, port: int = DEFAULT_PORT, address: str = "0.0.0.0"
    ) -> tuple[WSGIServer, threading.Thread]:
        """Serve ``/metrics`` from a daemon thread; ``server.shutdown()`` stops it."""
        return serve_streaming(self.registry, port, address)


class _OneFamily:
    """A collector of one family already collected: the exposition renders one family at a time."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> list[Metric]:
        return [self._family]


def exposition(registry: CollectorRegistry, *, gzipped: bool = False) -> Iterator[bytes]:
    """The registry in Prometheus' text format (0.0.4), family by family.

    The client library's own server renders the whole body as one string: at 2,000 resources
    about 76,000 series, some 20-30 MiB at the peak of every scrape. Rendered and sent a family
    at a time (the client's renderer, on one family), a scrape holds one family. The bytes are the
    same as the client's ``generate_latest``. ``gzipped``: compressed as it streams."""
    compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS) if gzipped else None  # a gzip stream
    for family in registry.collect():
        chunk = generate_latest(_OneFamily(family))
        if compressor is not None:
            chunk = compressor.compress(chunk)
        if chunk:
            yield chunk
    if compressor is not None:
        yield compressor.flush()


class _MetricsServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress does not hold the process at exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


def serve_streaming(
    registry: CollectorRegistry, port: int, address: str = "0.0.0.0"
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` on every path (``/metrics``) from a daemon thread, streamed (``exposition``);
    gzip when the scraper accepts it, as Prometheus does."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        gzipped = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        headers = [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)]
        if gzipped:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return exposition(registry, gzipped=gzipped)

    class Server(_MetricsServer):
        address_family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]

    server = make_server(address, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True)
    thread.start()
    return server, thread


def decision_action(previous: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """What a decision did, from the speculation status before and after it."""
    was_on, is_on = previous.get("state") == "on", current.get("state") == "on"
    if is_on and not was_on:
        return "enable"
    if was_on and not is_on:
        return "disable"
    before, after = _number(previous.get("draftLength")), _number(current.get("draftLength"))
    if is_on and before is not None and after is not None and after != before:
        return "lengthen" if after > before else "shorten"
    return "hold"


METRICS = OperatorMetrics(REGISTRY)
"""The operator's metrics, in the process-wide registry (so process_* metrics are served too)."""

observe_status = METRICS.observe_status
observe_decision = METRICS.observe_decision
forget = METRICS.forget
time_reconcile = METRICS.time_reconcile
time_tick = METRICS.time_tick
count_error = METRICS.count_error
count_tick = METRICS.count_tick
count_gc = METRICS.count_gc
serve = METRICS.serve
