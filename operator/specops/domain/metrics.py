"""What specops measures, per serving backend, and how raw Prometheus answers become measurements.

One query per quantity covers every resource: each query is grouped
``by (namespace, specops_deployment, variant, specops_draft)``, the labels the
PodMonitor relabels from the pod labels, so the number of queries per cycle does
not grow with the number of resources. ``specops_draft`` is the identity of the
draft a pod serves (``names.draft_label``): a canary is judged on the series of
the draft under test only, never on what an earlier draft left in the rate
window. This module is pure: the adapter runs the queries and hands the raw
vectors to :func:`build_snapshot`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, TypeVar

from specops.domain.acceptance import alpha_from_acceptance_rate
from specops.domain.engines.base import MetricNames
from specops.domain.engines.sglang import Sglang
from specops.domain.engines.trtllm import Triton, TrtllmServe
from specops.domain.engines.vllm import Vllm

DRAFT_LABEL = "specops_draft"
"""The Prometheus label with the draft identity (relabelled from the pod label specops.dev/draft)."""
GROUP_LABELS = ("namespace", "specops_deployment", "variant", DRAFT_LABEL)
_GROUP = ", ".join(GROUP_LABELS)

# Quantity names: the keys of BackendProfile.queries() and of the raw results.
Q_DRAFTED = "drafted_tokens_per_s"
Q_ACCEPTED = "accepted_tokens_per_s"
Q_DRAFT_STEPS = "draft_steps_per_s"
Q_ACCEPTANCE_GAUGE = "acceptance_rate_gauge"
Q_BATCH = "batch_per_pod"
Q_PODS = "pods_reporting"
Q_REQUESTS = "requests_per_s"
Q_TOKENS = "output_tokens_per_s"
Q_TPOT_P50 = "tpot_p50_s"
Q_TPOT_P95 = "tpot_p95_s"
Q_TPOT_P99 = "tpot_p99_s"
Q_TPOT_MEAN = "tpot_mean_s"
# The latency quantiles: the cycle's costliest queries (histogram_quantile over every pod's
# buckets), and the only ones a cycle can do without. The control loop decides on the mean; a
# canary's latency analysis needs them, so a cycle without them pauses canary judgement.
LATENCY_QUANTILES = frozenset({Q_TPOT_P50, Q_TPOT_P95, Q_TPOT_P99})
# Per pod (grouped by pod as well): what a split-fleet A/B compares, pods at different settings,
# and each pod's own acceptance (a pod that lost its draft weights accepts nothing while its
# neighbours on the same draft accept normally: domain/collapse.py).
Q_POD_BATCH = "pod_batch"
Q_POD_TPOT_MEAN = "pod_tpot_mean_s"
Q_POD_DRAFTED = "pod_drafted_tokens_per_s"
Q_POD_ACCEPTED = "pod_accepted_tokens_per_s"
Q_POD_ACCEPTANCE_GAUGE = "pod_acceptance_rate_gauge"
POD_QUANTITIES = (Q_POD_BATCH, Q_POD_TPOT_MEAN, Q_POD_DRAFTED, Q_POD_ACCEPTED, Q_POD_ACCEPTANCE_GAUGE)

# Reasons carried by error measurements (usable as condition reasons).
REASON_METRICS_UNAVAILABLE = "MetricsUnavailable"
REASON_NO_METRICS = "NoMetricsForDeployment"
REASON_STALE = "MetricsStale"
REASON_INVALID = "MetricsInvalid"
"""Prometheus answered for a resource, but with no finite, physically possible value (NaN, an
infinity or a negative number in every series): as blind as an outage, and said apart from one."""
REASON_PENDING = "MetricsPending"  # the first poll after start-up has not completed: not an outage
REASON_AUTH = "PrometheusAuthFailed"
"""Prometheus refused the credentials, or the Secret or ConfigMap holding them cannot be read."""

Key = tuple[str, str, str]
"""(namespace, deployment, variant)."""
V = TypeVar("V")

# Quantities that add up across the pods of two drafts, and those that are per-pod averages.
_ADDITIVE = (Q_DRAFTED, Q_ACCEPTED, Q_DRAFT_STEPS, Q_REQUESTS, Q_TOKENS, Q_PODS)
_PER_POD = (Q_BATCH, Q_ACCEPTANCE_GAUGE)

RawVector = Sequence[Mapping[str, Any]]
"""A Prometheus instant-query vector: [{"metric": {...}, "value": [ts, "1.5"]}, ...]."""


POSSIBLE = " >= 0 < +Inf"
"""A PromQL filter keeping finite, non-negative samples only (NaN compares false). Applied to the
rates fed to a quotient or a quantile: those launder impossible inputs into plausible outputs
(two negative rates divide into a positive mean; histogram_quantile over NaN or infinite buckets
answers the top bucket's bound), so impossible rates are dropped before them and the result is
absent instead. Sums and gauges need no filter: an impossible input stays impossible in them and
is refused when read (`_finite`)."""


def rate_window_s(scrape_interval_s: float) -> float:
    """Rate window long enough to hold several scrapes, so one missed scrape does not blank a rate."""
    return max(4.0 * scrape_interval_s, 10.0)


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


@dataclass(frozen=True)
class BackendProfile:
    """Metric names of one serving engine and the PromQL that turns them into specops quantities.

    Selectors may carry label matchers (``name{label="x"}``); histogram names are
    the base name (``_bucket`` is appended).
    """

    name: str
    batch_gauge: str
    request_counter: str
    tpot_histogram: str
    drafted_tokens: str | None = None
    accepted_tokens: str | None = None
    draft_steps: str | None = None
    acceptance_rate_gauge: str | None = None
    output_tokens_counter: str | None = None

    @property
    def measures_draft_length(self) -> bool:
        """True when the engine counts verification steps, so g = drafted / steps is measured."""
        return self.draft_steps is not None and self.drafted_tokens is not None

    def queries(self, window_s: float) -> dict[str, str]:
        """One PromQL instant query per quantity, each grouped so it answers for every resource at once."""
        w = _duration(window_s)

        def summed_rate(selector: str, by: str = _GROUP, possible: str = "") -> str:
            return f"sum by ({by}) (rate({selector}[{w}]){possible})"

        def mean(by: str) -> str:
            histogram = self.tpot_histogram
            return f"{summed_rate(histogram + '_sum', by, POSSIBLE)} / {summed_rate(histogram + '_count', by, POSSIBLE)}"

        def pod_rate(selector: str) -> str:
            return summed_rate(selector, f"{_GROUP}, pod")

        def quantile(q: float) -> str:
            buckets = summed_rate(f"{self.tpot_histogram}_bucket", f"{_GROUP}, le", POSSIBLE)
            return f"histogram_quantile({q}, {buckets})"

        per_pod_batch = f"max by ({_GROUP}, pod) ({self.batch_gauge})"
        result = {
            Q_BATCH: f"avg by ({_GROUP}) ({per_pod_batch})",
            Q_PODS: f"count by ({_GROUP}) ({per_pod_batch})",
            Q_REQUESTS: summed_rate(self.request_counter),
            Q_TPOT_P50: quantile(0.5),
            Q_TPOT_P95: quantile(0.95),
            Q_TPOT_P99: quantile(0.99),
            # the exact mean (histogram sum / count): what calibration fits, free of bucket rounding
            Q_TPOT_MEAN: mean(_GROUP),
            # per pod, still one query for every resource: pods at different settings side by side
            Q_POD_BATCH: per_pod_batch,
            Q_POD_TPOT_MEAN: mean(f"{_GROUP}, pod"),
        }
        if self.drafted_tokens is not None:
            result[Q_DRAFTED] = summed_rate(self.drafted_tokens)
            result[Q_POD_DRAFTED] = pod_rate(self.drafted_tokens)
        if self.accepted_tokens is not None:
            result[Q_ACCEPTED] = summed_rate(self.accepted_tokens)
            result[Q_POD_ACCEPTED] = pod_rate(self.accepted_tokens)
        if self.draft_steps is not None:
            result[Q_DRAFT_STEPS] = summed_rate(self.draft_steps)
        if self.acceptance_rate_gauge is not None:
            result[Q_ACCEPTANCE_GAUGE] = f"avg by ({_GROUP}) ({self.acceptance_rate_gauge})"
            result[Q_POD_ACCEPTANCE_GAUGE] = f"avg by ({_GROUP}, pod) ({self.acceptance_rate_gauge})"
        if self.output_tokens_counter is not None:
            result[Q_TOKENS] = summed_rate(self.output_tokens_counter)
        return result


def profile_of(name: str, names: MetricNames) -> BackendProfile:
    """The queries of an engine adapter's metric names."""
    return BackendProfile(
        name=name,
        batch_gauge=names.running,
        request_counter=names.requests,
        tpot_histogram=names.tpot_histogram,
        drafted_tokens=names.drafted_tokens,
        accepted_tokens=names.accepted_tokens,
        draft_steps=names.draft_steps,
        acceptance_rate_gauge=names.acceptance_rate_gauge,
        output_tokens_counter=names.output_tokens,
    )


PROFILES: dict[str, BackendProfile] = {
    # The engines' own names, from their adapters (domain/engines): specops's Triton model and
    # trtllm-serve count tokens but not steps (g is the schedule's K at the batch); vLLM counts
    # steps too; SGLang publishes an acceptance-rate gauge, which cannot tell "all drafts
    # rejected" from "not speculating".
    **{
        engine.name: profile_of(engine.name, engine.metrics)
        for engine in (Triton(), TrtllmServe(), Vllm(), Sglang())
    },
}


@dataclass(frozen=True)
class PodMeasurement:
    """One pod's own batch, mean per-token latency and acceptance over the rate window."""

    batch: float | None = None
    tpot_mean_s: float | None = None
    drafted_per_s: float | None = None
    """Draft tokens the pod proposed per second (None: the engine does not count them, SGLang)."""
    acceptance_rate: float | None = None
    """Accepted / drafted tokens of this pod alone, in [0, 1]; the engine's acceptance-rate gauge
    where it publishes one instead (SGLang, where 0 also reads when nothing was drafted). None when
    nothing was drafted in the window or nothing readable was answered."""


def pod_measurement(profile: BackendProfile, values: Mapping[str, float | None]) -> PodMeasurement:
    """One pod's figures from its per-pod series (`_grouped`: NaN and negative values are None)."""
    drafted = values.get(Q_POD_DRAFTED)
    accepted = values.get(Q_POD_ACCEPTED)
    rate: float | None = None
    if profile.acceptance_rate_gauge is not None:
        gauge = values.get(Q_POD_ACCEPTANCE_GAUGE)
        rate = None if gauge is None else min(gauge, 1.0)
    elif drafted is not None and drafted > 0 and accepted is not None:
        rate = min(accepted / drafted, 1.0)
    return PodMeasurement(
        batch=values.get(Q_POD_BATCH),
        tpot_mean_s=values.get(Q_POD_TPOT_MEAN),
        drafted_per_s=drafted,
        acceptance_rate=rate,
    )


@dataclass(frozen=True)
class Measurement:
    """What one (namespace, deployment, variant) looked like over the last rate window.

    An Error measurement never carries numbers, so no decision can be made on
    stale or missing data by mistake. ``alpha`` is None, without error, when
    nothing was drafted in the window (speculation off).
    """

    phase: Literal["Ok", "Error"]
    at: datetime
    error: str | None = None
    reason: str | None = None
    alpha: float | None = None
    acceptance_rate: float | None = None
    mean_draft_length: float | None = None
    batch: float | None = None
    request_rate: float | None = None
    tokens_per_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_p99_s: float | None = None
    tpot_mean_s: float | None = None
    pods_reporting: int = 0
    per_pod: Mapping[str, PodMeasurement] = field(default_factory=dict)
    latency_error: str | None = None
    """Why this cycle's latency quantiles are missing (their queries failed while the rest
    answered); None when they were read. An Ok measurement with it still serves the control loop."""

    @property
    def ok(self) -> bool:
        return self.phase == "Ok"

    @classmethod
    def failed(cls, at: datetime, reason: str, message: str) -> Measurement:
        return cls(phase="Error", at=at, reason=reason, error=message)

    def with_configured_draft_length(self, draft_length: int | None) -> Measurement:
        """Fill in g and alpha for engines that count tokens but not steps (trtllm-serve, SGLang)."""
        if (
            not self.ok
            or self.alpha is not None
            or self.acceptance_rate is None
            or self.mean_draft_length is not None
            or draft_length is None
            or draft_length <= 0
        ):
            return self
        return replace(
            self,
            mean_draft_length=float(draft_length),
            alpha=alpha_from_acceptance_rate(self.acceptance_rate, draft_length),
        )


@dataclass(frozen=True)
class Snapshot:
    """Every resource's measurement from one poll cycle (or why the cycle failed)."""

    at: datetime
    phase: Literal["Ok", "Error"]
    error: str | None = None
    measurements: Mapping[Key, Measurement] = field(default_factory=dict)
    """Each variant as a whole (every draft its pods serve): what the control loop reads."""
    reason: str = REASON_METRICS_UNAVAILABLE
    by_draft: Mapping[Key, Mapping[str, Measurement]] = field(default_factory=dict)
    """Each variant's measurement per draft identity: what a canary judges."""

    @classmethod
    def failed(cls, at: datetime, message: str, reason: str = REASON_METRICS_UNAVAILABLE) -> Snapshot:
        return cls(at=at, phase="Error", error=message, reason=reason)

    def lookup(
        self,
        namespace: str,
        deployment: str,
        variant: str,
        now: datetime,
        max_age_s: float,
        draft_length: int | None = None,
        draft: str | None = None,
    ) -> Measurement:
        """The measurement for one resource's variant, or an Error measurement saying why there is none.

        ``draft_length`` is the configured draft length, used only by engines
        whose metrics do not reveal it. ``draft`` (a ``specops_draft`` value) keeps
        only the series of the pods serving that draft; None takes the variant as a whole.
        """
        if self.phase != "Ok":
            return Measurement.failed(now, self.reason, self.error or "metrics unavailable")
        age_s = (now - self.at).total_seconds()
        if age_s > max_age_s:
            return Measurement.failed(
                now, REASON_STALE, f"last metrics are {age_s:.0f}s old (limit {max_age_s:.0f}s)"
            )
        key = (namespace, deployment, variant)
        found = self.measurements.get(key) if draft is None else _of_draft(self.by_draft.get(key), draft)
        if found is None:
            which = "" if draft is None else f" draft {draft}"
            return Measurement.failed(
                now,
                REASON_NO_METRICS,
                f"no metrics for {namespace}/{deployment} variant {variant}{which} (no pod scraped yet?)",
            )
        return found.with_configured_draft_length(draft_length)


def _of_draft(drafts: Mapping[str, Measurement] | None, draft: str) -> Measurement | None:
    """The draft's measurement; a scrape that adds no draft label at all (its series all have "")
    still answers, so a hand-written scrape config keeps working, without the draft separation."""
    if not drafts:
        return None
    found = drafts.get(draft)
    if found is None and set(drafts) == {""}:
        return drafts[""]
    return found


def _finite(raw: Any) -> float | None:
    """A finite number no less than 0, else None: every quantity read (gauges, rates, counts,
    latencies) is non-negative, so a negative value is refused as unreadable, like NaN and Inf."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0.0 else None


Series = tuple[str, str, str, str]
"""(namespace, deployment, variant, draft identity or pod name): one group of a grouped query."""


def _number(sample: Mapping[str, Any]) -> float | None:
    value = sample.get("value")
    return _finite(value[1]) if isinstance(value, list | tuple) and len(value) == 2 else None


Q_UNREADABLE = "_unreadable"
"""Marks a series all of whose readings were NaN, infinite or negative (see `_finite`)."""
COUNTS = frozenset({Q_PODS})
"""Quantities that count series and read none of their values: a pod exporting NaN is counted
like any other, so a count is no sign that anything was read."""


def _grouped(
    results: Mapping[str, RawVector], quantities: Sequence[str], member: str
) -> tuple[dict[Series, dict[str, float | None]], dict[Key, tuple[str, ...]]]:
    """The values of ``quantities`` by series (resource key and ``member``, the draft identity or
    the pod: "" for series without it), each a dict of quantity to value (NaN/Inf, e.g. a quantile
    with no observations, and negative values become None; a series none of whose values is
    readable, its `COUNTS` aside, carries ``Q_UNREADABLE``); and each resource key's members in order.

    One pass over every sample of the cycle (about 26,000 at 2,000 resources). The layout keeps
    what a snapshot holds for a cycle out of the collector's way (`Snapshot`): a dict of floats is
    never tracked, a tuple of strings is untracked at its first young pass, and what remains is
    the two outer dicts."""
    values: dict[Series, dict[str, float | None]] = {}
    members: dict[Key, list[str]] = {}
    readable: set[Series] = set()
    for quantity in quantities:
        for sample in results.get(quantity, ()):
            labels = sample.get("metric") or {}
            deployment = labels.get("specops_deployment")
            if not deployment:
                continue
            which = str(labels.get(member, ""))
            if member == "pod" and not which:
                continue
            key = (str(labels.get("namespace", "")), str(deployment), str(labels.get("variant", "")))
            series = (*key, which)
            found = values.get(series)
            if found is None:
                found = values[series] = {}
                known = members.get(key)
                if known is None:
                    members[key] = [which]
                else:
                    known.append(which)
            number = found[quantity] = _number(sample)
            if number is not None and quantity not in COUNTS:
                readable.add(series)
    for series in values.keys() - readable:  # no finite, possible value at all
        values[series][Q_UNREADABLE] = None
    return values, {key: tuple(found) for key, found in members.items()}


def _acceptance(
    profile: BackendProfile, values: Mapping[str, float | None]
) -> tuple[float | None, float | None, float | None]:
    """(alpha, acceptance rate, mean draft length); all None when nothing was drafted."""
    if profile.acceptance_rate_gauge is not None:
        gauge = values.get(Q_ACCEPTANCE_GAUGE)
        if gauge is None or gauge <= 0:
            return None, None, None
        return None, min(gauge, 1.0), None
    drafted = values.get(Q_DRAFTED)
    accepted = values.get(Q_ACCEPTED)
    if drafted is None or drafted <= 0 or accepted is None:
        return None, None, None
    rate = min(max(accepted / drafted, 0.0), 1.0)
    steps = values.get(Q_DRAFT_STEPS)
    if not profile.measures_draft_length or steps is None or steps <= 0:
        return None, rate, None
    mean_draft_length = drafted / steps
    return alpha_from_acceptance_rate(rate, mean_draft_length), rate, mean_draft_length


def measurement_from_values(
    profile: BackendProfile,
    values: Mapping[str, float | None],
    at: datetime,
    latency_error: str | None = None,
    per_pod: Mapping[str, PodMeasurement] | None = None,
) -> Measurement:
    """One resource's measurement from its value of each quantity (missing quantities are None);
    ``latency_error``: why the cycle went without its latency quantiles, if it did. Values that
    hold no finite, non-negative number at all (``Q_UNREADABLE``) are a failed measurement,
    reason MetricsInvalid: a resource Prometheus answers for with NaN, Inf or negative values
    only is as unmeasured as one it does not answer for."""
    if Q_UNREADABLE in values:
        return Measurement.failed(
            at,
            REASON_INVALID,
            "Prometheus answered no finite, non-negative value for this resource "
            "(NaN, infinite or negative samples only)",
        )
    alpha, rate, mean_draft_length = _acceptance(profile, values)
    pods = values.get(Q_PODS)
    return Measurement(
        phase="Ok",
        at=at,
        alpha=alpha,
        acceptance_rate=rate,
        mean_draft_length=mean_draft_length,
        batch=values.get(Q_BATCH),
        request_rate=values.get(Q_REQUESTS),
        tokens_per_s=values.get(Q_TOKENS),
        tpot_p50_s=values.get(Q_TPOT_P50),
        tpot_p95_s=values.get(Q_TPOT_P95),
        tpot_p99_s=values.get(Q_TPOT_P99),
        tpot_mean_s=values.get(Q_TPOT_MEAN),
        pods_reporting=round(pods) if pods is not None else 0,
        per_pod={} if per_pod is None else per_pod,
        latency_error=latency_error,
    )


def _weighted(pairs: Sequence[tuple[float | None, float]]) -> float | None:
    known = [(value, weight) for value, weight in pairs if value is not None]
    total = sum(weight for _, weight in known)
    if not known:
        return None
    if total <= 0:
        return sum(value for value, _ in known) / len(known)
    return sum(value * weight for value, weight in known) / total


def merge_drafts(per_draft: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    """One variant's values from those of its drafts (two drafts serve at once during a rollout).

    Rates and pod counts add up; per-pod averages are weighted by pods; latency figures
    (quantiles, mean), which do not add up, are weighted by requests: an approximation
    that lasts as long as the rollout.
    """
    if len(per_draft) == 1:
        return dict(per_draft[0])
    quantities = {quantity for values in per_draft for quantity in values} - {Q_UNREADABLE}
    merged: dict[str, float | None] = {}
    if all(Q_UNREADABLE in values for values in per_draft):
        merged[Q_UNREADABLE] = None
    for quantity in quantities:
        present = [values.get(quantity) for values in per_draft]
        if quantity in _ADDITIVE:
            known = [value for value in present if value is not None]
            merged[quantity] = sum(known) if known else None
        elif quantity in _PER_POD:
            merged[quantity] = _weighted(
                [(values.get(quantity), values.get(Q_PODS) or 1.0) for values in per_draft]
            )
        else:
            merged[quantity] = _weighted(
                [(values.get(quantity), values.get(Q_REQUESTS) or 0.0) for values in per_draft]
            )
    return merged


def build_snapshot(
    profile: BackendProfile, results: Mapping[str, RawVector], at: datetime, latency_error: str | None = None
) -> Snapshot:
    """Turn the raw vectors of one cycle (quantity -> vector) into per-resource measurements.

    A resource appears when any quantity mentions it; quantities it lacks stay None. Each
    variant is measured per draft (``by_draft``) and as a whole (``measurements``).
    ``latency_error``: the cycle's latency quantiles failed (why); every measurement carries it.

    The values are kept as read and a measurement is made when it is looked up (`_Cycle`): a
    resource is looked up about once a cycle, and measurements made for every resource at once
    lived the whole cycle, thousands of objects that every young and middle pass of the
    collector scanned and promoted (at 2,000 resources about 14,000 a cycle)."""
    quantities = [q for q in results if q not in POD_QUANTITIES]
    values, drafts = _grouped(results, quantities, DRAFT_LABEL)
    pods, pod_names = _grouped(results, POD_QUANTITIES, "pod")
    cycle = _Cycle(profile, at, latency_error, values, drafts, pods, pod_names)
    return Snapshot(
        at=at,
        phase="Ok",
        measurements=_OnDemand(cycle.whole, cycle.keys),
        by_draft=_OnDemand(cycle.by_draft, cycle.drafts.keys),
    )


@dataclass(frozen=True)
class _Cycle:
    """One cycle's values by series (`_grouped`), from which measurements are made on demand."""

    profile: BackendProfile
    at: datetime
    latency_error: str | None
    values: Mapping[Series, Mapping[str, float | None]]
    drafts: Mapping[Key, tuple[str, ...]]
    pods: Mapping[Series, Mapping[str, float | None]]
    pod_names: Mapping[Key, tuple[str, ...]]

    def keys(self) -> set[Key]:
        return set(self.drafts) | set(self.pod_names)

    def whole(self, key: Key) -> Measurement | None:
        """The variant as a whole (every draft its pods serve), with each pod's own figures."""
        drafts = self.drafts.get(key)
        names = self.pod_names.get(key)
        if drafts is None and names is None:
            return None
        if not drafts:  # only the per-pod series mention it
            found: Mapping[str, float | None] = {}
        elif len(drafts) == 1:
            found = self.values[(*key, drafts[0])]
        else:
            found = merge_drafts([self.values[(*key, draft)] for draft in drafts])
        per_pod = {name: pod_measurement(self.profile, self.pods[(*key, name)]) for name in names or ()}
        return measurement_from_values(self.profile, found, self.at, self.latency_error, per_pod)

    def by_draft(self, key: Key) -> dict[str, Measurement] | None:
        drafts = self.drafts.get(key)
        if drafts is None:
            return None
        return {
            draft: measurement_from_values(
                self.profile, self.values[(*key, draft)], self.at, self.latency_error
            )
            for draft in drafts
        }


class _OnDemand(Mapping[Key, V]):
    """A cycle's measurements by resource key (`Snapshot.measurements`, `Snapshot.by_draft`), each
    made by ``make`` when looked up (None: the key has none); ``keys`` gives the keys it has."""

    def __init__(self, make: Callable[[Key], V | None], keys: Callable[[], Collection[Key]]) -> None:
        self._make = make
        self._keys = keys

    def __getitem__(self, key: Key) -> V:
        found = self._make(key)
        if found is None:
            raise KeyError(key)
        return found

    def __iter__(self) -> Iterator[Key]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())
