"""Canary judgement: is the new draft at least as good as the stable one?

A canary step ends with `analyse`, which compares per-interval samples of the canary
and the stable variant taken over the same window, and `next_action`, which turns the
verdict and the counters kept in status into advance / hold / rollback / pause. Both
are pure: value in, verdict out, like Argo Rollouts' assessMetricStatus.

The statistics, in the order the rules are applied:

1. Error. A sample that is not ok (the metrics read failed) carries no numbers. When the
   latest sample of either variant is not ok, or more than `max_error_fraction` of either
   window is, the outage is ongoing or the survivors are too few to represent the window:
   the verdict is ERROR. An outage is never read as a Fail nor as a Pass.
2. Latency. With an SLO, the canary fails when its per-token p99 is above the SLO in the
   majority of its samples (at least `min_samples` readings), unless the stable variant
   breaches it in the majority of its samples too: a breach both share comes from load,
   not from the draft, and is alerted on elsewhere.
3. Sample size. Fewer than `min_samples` usable alpha samples (ok and drafting) on
   either side: INCONCLUSIVE.
4. Acceptance worse. A one-sided Mann-Whitney U test of "canary alpha is stochastically
   smaller than stable alpha" gives `p_value`; the effect is the relative difference of
   the medians, canary / stable - 1. FAIL when p_value < 1 - confidence and the effect is
   below -tolerance: the drop is both significant and material.
5. Acceptance not worse. PASS on either of two kinds of evidence:
   a. within tolerance (a non-inferiority test): the same one-sided test asks whether the
      canary is stochastically larger than the stable samples scaled by (1 - tolerance);
      p_non_inferior < 1 - confidence rejects a drop larger than the tolerance. This is
      what passes a drop that is significant but immaterial (well measured, under the
      tolerance);
   b. not worse: no significant drop (p_value >= 1 - confidence) and the canary's median
      within the tolerance of the stable median (effect >= -tolerance), on at least
      `min_samples` samples per side.
   (b) alone is weaker evidence than (a) on a small window, and that is deliberate: the
   schedule judges every step, failures and inconclusives add up over the whole canary,
   and later steps carry more canary traffic, so a worse draft that slips through one
   step is caught at the next; requiring (a) everywhere makes an equal draft on light
   traffic run into inconclusiveLimit and roll back (`specops bench canary` measures both).
6. Anything else: INCONCLUSIVE.

Mann-Whitney U uses the normal approximation with tie correction and a continuity
correction (what scipy.stats.mannwhitneyu calls method="asymptotic"): with n1 canary
and n2 stable samples, U1 = R1 - n1 (n1 + 1) / 2 where R1 is the canary's rank sum
(ties get their mean rank), mu = n1 n2 / 2, sigma^2 = n1 n2 / 12 * ((n + 1) -
sum(t^3 - t) / (n (n - 1))) over tie groups of size t, and p = P(Z >= (U - mu - 1/2) /
sigma) with U = U1 for "greater" and U = n1 n2 - U1 for "less". It needs no
distributional assumption about alpha, which is bounded and skewed near 1. The samples
of one interval are not paired, so drift shared by both variants only adds noise.

The tolerance (default 2 %) is the relative alpha drop treated as no drop; it must stay
well below the drop the canary has to catch (5 % in the benchmark). With tolerance 0 an
equal draft passes only when its median is at least the stable one's.

Across steps, `next_action` counts like Argo Rollouts' AnalysisRun: failures and
inconclusives accumulate over the whole canary (a new canary starts from
`CanaryCounters()`), and the canary rolls back when either exceeds its limit. (Argo
pauses the rollout for a person on an Inconclusive run; specops has no person in its
loop, so it falls back to the draft known to work.) A FAIL or
INCONCLUSIVE below its limit holds the current weight for another bake (the next analysis
sees more samples). An ERROR pauses judgement: no advance and no rollback, ever; past
`consecutiveErrorLimit` the reason says judgement is suspended so that the condition and
the alert say so. Any real verdict resets the consecutive error count.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal

from specops.api.models import CanaryAnalysis
from specops.domain.metrics import Measurement

DEFAULT_TOLERANCE = 0.02  # relative alpha drop treated as "no worse"
DEFAULT_MIN_SAMPLES = 5
DEFAULT_MAX_ERROR_FRACTION = 0.25

# Why the analysis reached its verdict (Evidence.cause).
CAUSE_METRICS_UNAVAILABLE = "MetricsUnavailable"
CAUSE_LATENCY_ABOVE_SLO = "LatencyAboveSLO"
CAUSE_NOT_ENOUGH_SAMPLES = "NotEnoughSamples"
CAUSE_ACCEPTANCE_DROPPED = "AcceptanceDropped"
CAUSE_ACCEPTANCE_WITHIN_TOLERANCE = "AcceptanceWithinTolerance"
CAUSE_ACCEPTANCE_NOT_WORSE = "AcceptanceNotWorse"
CAUSE_ACCEPTANCE_UNCLEAR = "AcceptanceUnclear"
CAUSE_SLOWER_THAN_PLAIN = "SlowerThanPlain"
CAUSE_NOT_SLOWER_THAN_PLAIN = "NotSlowerThanPlain"

# Reasons of `next_action` (conditions and Events).
REASON_STEP_PASSED = "CanaryStepPassed"
REASON_ANALYSIS_FAILED = "CanaryAnalysisFailed"
REASON_FAILURE_LIMIT_EXCEEDED = "CanaryFailureLimitExceeded"
REASON_INCONCLUSIVE = "CanaryInconclusive"
REASON_INCONCLUSIVE_LIMIT_EXCEEDED = "CanaryInconclusiveLimitExceeded"
REASON_METRICS_UNAVAILABLE = "CanaryMetricsUnavailable"
REASON_JUDGEMENT_SUSPENDED = "CanaryJudgementSuspended"

Action = Literal["advance", "hold", "rollback", "pause"]
Alternative = Literal["less", "greater"]


class Verdict(StrEnum):
    PASS = "Pass"
    FAIL = "Fail"
    INCONCLUSIVE = "Inconclusive"
    ERROR = "Error"


@dataclass(frozen=True)
class Sample:
    """One analysis interval of one variant. `ok` False: the read failed and the numbers are absent."""

    alpha: float | None = None
    tpot_p99_s: float | None = None
    tokens_per_s: float | None = None
    ok: bool = True
    tpot_p50_s: float | None = None


def sample_from_measurement(measurement: Measurement) -> Sample:
    """The sample a Measurement gives; an Error measurement becomes a not-ok sample, and so does
    one whose latency quantiles are missing: a canary is never judged without its latency."""
    if not measurement.ok or measurement.latency_error is not None:
        return Sample(ok=False)
    return Sample(
        alpha=measurement.alpha,
        tpot_p99_s=measurement.tpot_p99_s,
        tokens_per_s=measurement.tokens_per_s,
        tpot_p50_s=measurement.tpot_p50_s,
    )


@dataclass(frozen=True)
class Window:
    """What the analysis reads of one variant's window: each metric's usable readings and the failed reads.

    `Window.of(samples)` builds it from per-interval samples; a canary step keeps it summarised
    in status instead (domain.canary_window), so status never holds raw samples.
    """

    alphas: Sequence[float] = ()
    p99s: Sequence[float] = ()
    p50s: Sequence[float] = ()
    ok: int = 0  # readings that succeeded
    errors: int = 0  # readings that failed
    last_ok: bool = True  # whether the latest reading succeeded (True for an empty window)

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Window:
        good = [s for s in samples if s.ok]
        return cls(
            alphas=[s.alpha for s in good if s.alpha is not None and math.isfinite(s.alpha)],
            p99s=[s.tpot_p99_s for s in good if s.tpot_p99_s is not None],
            p50s=[s.tpot_p50_s for s in good if s.tpot_p50_s is not None],
            ok=len(good),
            errors=len(samples) - len(good),
            last_ok=samples[-1].ok if samples else True,
        )


@dataclass(frozen=True)
class Evidence:
    """The numbers behind a verdict; `summary` is the one line that goes to status and Events."""

    cause: str
    canary_samples: int  # usable alpha samples
    stable_samples: int
    canary_errors: int  # not-ok samples in the window
    stable_errors: int
    canary_alpha: float | None  # medians
    stable_alpha: float | None
    p_value: float | None  # one-sided: canary alpha smaller than stable
    p_non_inferior: float | None  # one-sided: canary alpha larger than stable x (1 - tolerance)
    effect: float | None  # canary median / stable median - 1 (negative: canary worse)
    canary_p99_s: float | None  # median of the canary's per-interval p99
    slo_p99_s: float | None
    p99_breach_fraction: float | None  # share of canary p99 readings above the SLO
    p99_vs_stable: float | None  # canary median p99 / stable median p99
    measured_speedup: float | None  # baseline p50 / canary median p50
    confidence: float
    tolerance: float
    summary: str
    min_samples: int = DEFAULT_MIN_SAMPLES
    stable_breach_fraction: float | None = None  # share of stable p99 readings above the SLO
    latency_ratio: float | None = None  # canary median p50 / plain stable median p50 (plain stable only)


@dataclass(frozen=True)
class CanaryCounters:
    """Judgement progress of one canary, kept in status; a new canary starts from zero."""

    failures: int = 0
    inconclusives: int = 0
    consecutive_errors: int = 0


# ---------------------------------------------------------------- statistics


def _ranks(values: Sequence[float]) -> tuple[list[float], float]:
    """Mid-ranks (1-based, ties share their mean rank) and the tie term sum(t^3 - t)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    tie_term = 0.0
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        mid_rank = (start + end) / 2.0 + 1.0
        for position in range(start, end + 1):
            ranks[order[position]] = mid_rank
        tied = end - start + 1
        tie_term += tied**3 - tied
        start = end + 1
    return ranks, tie_term


def mann_whitney_p(x: Sequence[float], y: Sequence[float], alternative: Alternative) -> float:
    """One-sided Mann-Whitney U p-value that x is stochastically `alternative` than y.

    Normal approximation with tie and continuity corrections (scipy's method="asymptotic").
    All values tied: no evidence either way, p = 1.
    """
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("both samples must be non-empty")
    ranks, tie_term = _ranks([*x, *y])
    u1 = sum(ranks[:n1]) - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    variance = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1)))
    if variance <= 0.0:
        return 1.0
    u = u1 if alternative == "greater" else n1 * n2 - u1
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(variance)
    return min(1.0, max(0.0, 0.5 * math.erfc(z / math.sqrt(2.0))))


# ---------------------------------------------------------------- one analysis


def analyse(
    canary: Sequence[Sample],
    stable: Sequence[Sample],
    *,
    confidence: float,
    slo_p99_s: float | None,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    tolerance: float = DEFAULT_TOLERANCE,
    baseline_p50_s: float | None = None,
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION,
) -> tuple[Verdict, Evidence]:
    """Judge one window of canary samples against the stable samples of the same window."""
    return analyse_windows(
        Window.of(canary),
        Window.of(stable),
        confidence=confidence,
        slo_p99_s=slo_p99_s,
        min_samples=min_samples,
        tolerance=tolerance,
        baseline_p50_s=baseline_p50_s,
        max_error_fraction=max_error_fraction,
    )


def analyse_windows(
    canary: Window,
    stable: Window,
    *,
    confidence: float,
    slo_p99_s: float | None,
    min_samples: int = DEFAULT_MIN_SAMPLES,
    tolerance: float = DEFAULT_TOLERANCE,
    baseline_p50_s: float | None = None,
    max_error_fraction: float = DEFAULT_MAX_ERROR_FRACTION,
) -> tuple[Verdict, Evidence]:
    """`analyse` on windows already reduced to each metric's readings."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be between 0 and 1")
    if not 0.0 <= tolerance < 1.0:
        raise ValueError("tolerance must be in [0, 1)")
    level = 1.0 - confidence
    canary_alpha, stable_alpha = list(canary.alphas), list(stable.alphas)
    canary_med = statistics.median(canary_alpha) if canary_alpha else None
    stable_med = statistics.median(stable_alpha) if stable_alpha else None
    effect = canary_med / stable_med - 1.0 if canary_med is not None and stable_med else None
    canary_p99, stable_p99 = list(canary.p99s), list(stable.p99s)
    canary_p99_med = statistics.median(canary_p99) if canary_p99 else None
    stable_p99_med = statistics.median(stable_p99) if stable_p99 else None
    canary_p50_med = statistics.median(canary.p50s) if canary.p50s else None
    enough = len(canary_alpha) >= min_samples and len(stable_alpha) >= min_samples
    p_worse = mann_whitney_p(canary_alpha, stable_alpha, "less") if enough else None
    p_non_inferior = (
        mann_whitney_p(canary_alpha, [a * (1.0 - tolerance) for a in stable_alpha], "greater")
        if enough
        else None
    )

    def evidence(verdict: Verdict, cause: str) -> tuple[Verdict, Evidence]:
        found = Evidence(
            cause=cause,
            canary_samples=len(canary_alpha),
            stable_samples=len(stable_alpha),
            canary_errors=canary.errors,
            stable_errors=stable.errors,
            canary_alpha=canary_med,
            stable_alpha=stable_med,
            p_value=p_worse,
            p_non_inferior=p_non_inferior,
            effect=effect,
            canary_p99_s=canary_p99_med,
            slo_p99_s=slo_p99_s,
            p99_breach_fraction=_breach_fraction(canary_p99, slo_p99_s),
            p99_vs_stable=canary_p99_med / stable_p99_med if canary_p99_med and stable_p99_med else None,
            measured_speedup=(baseline_p50_s / canary_p50_med if baseline_p50_s and canary_p50_med else None),
            confidence=confidence,
            tolerance=tolerance,
            summary="",
            min_samples=min_samples,
            stable_breach_fraction=_breach_fraction(stable_p99, slo_p99_s),
        )
        return verdict, replace(found, summary=_summary(verdict, found))

    if _outage(canary, max_error_fraction) or _outage(stable, max_error_fraction):
        return evidence(Verdict.ERROR, CAUSE_METRICS_UNAVAILABLE)
    if slo_p99_s is not None and len(canary_p99) >= min_samples:
        canary_breaches = _majority_above(canary_p99, slo_p99_s)
        shared = len(stable_p99) >= min_samples and _majority_above(stable_p99, slo_p99_s)
        if canary_breaches and not shared:
            return evidence(Verdict.FAIL, CAUSE_LATENCY_ABOVE_SLO)
    if not stable_alpha and stable.ok >= min_samples and len(canary_alpha) >= min_samples:
        # the stable pods run plain: no acceptance to compare, so the canary is judged on what
        # matters against plain decoding, its per-token latency in the same window
        canary_lat, stable_lat = list(canary.p50s), list(stable.p50s)
        if len(canary_lat) >= min_samples and len(stable_lat) >= min_samples:
            p_slower = mann_whitney_p(canary_lat, stable_lat, "greater")
            slower = p_slower < level
            verdict, found = evidence(
                Verdict.FAIL if slower else Verdict.PASS,
                CAUSE_SLOWER_THAN_PLAIN if slower else CAUSE_NOT_SLOWER_THAN_PLAIN,
            )
            found = replace(
                found,
                p_value=p_slower,
                latency_ratio=statistics.median(canary_lat) / statistics.median(stable_lat),
            )
            return verdict, replace(found, summary=_summary(verdict, found))
    if not enough or p_worse is None or p_non_inferior is None:
        return evidence(Verdict.INCONCLUSIVE, CAUSE_NOT_ENOUGH_SAMPLES)
    if p_worse < level and effect is not None and effect < -tolerance:
        return evidence(Verdict.FAIL, CAUSE_ACCEPTANCE_DROPPED)
    if p_non_inferior < level:
        return evidence(Verdict.PASS, CAUSE_ACCEPTANCE_WITHIN_TOLERANCE)
    if p_worse >= level and effect is not None and effect >= -tolerance:
        return evidence(Verdict.PASS, CAUSE_ACCEPTANCE_NOT_WORSE)
    return evidence(Verdict.INCONCLUSIVE, CAUSE_ACCEPTANCE_UNCLEAR)


def _outage(window: Window, max_error_fraction: float) -> bool:
    """The latest read failed, or too much of the window is missing to stand for it."""
    return not window.last_ok or window.errors > max_error_fraction * (window.ok + window.errors)


def _majority_above(values: Sequence[float], limit: float) -> bool:
    return 2 * sum(1 for v in values if v > limit) > len(values)


def _breach_fraction(values: Sequence[float], limit: float | None) -> float | None:
    if limit is None or not values:
        return None
    return sum(1 for v in values if v > limit) / len(values)


def _p(value: float, level: float) -> str:
    """A p-value beside the level it is compared with, the comparison written out."""
    return f"p={value:.3g} {'<' if value < level else '>='} {level:.3g}"


def _finding(verdict: Verdict, e: Evidence) -> str:
    """What was tested and what it found, in words that agree with the p-values beside them."""
    level = 1.0 - e.confidence
    tolerance = f"{e.tolerance:.0%}"
    lower = (
        None
        if e.p_value is None
        else (
            f"canary acceptance significantly lower than stable ({_p(e.p_value, level)})"
            if e.p_value < level
            else f"no significant drop in acceptance ({_p(e.p_value, level)})"
        )
    )
    within = (
        None
        if e.p_non_inferior is None
        else (
            f"any drop shown to be within the {tolerance} tolerance ({_p(e.p_non_inferior, level)})"
            if e.p_non_inferior < level
            else f"staying within the {tolerance} tolerance not shown ({_p(e.p_non_inferior, level)})"
        )
    )
    effect = "" if e.effect is None else f"{e.effect:+.1%}"
    if e.cause == CAUSE_METRICS_UNAVAILABLE:
        return (
            f"metrics unavailable (failed reads canary {e.canary_errors}, stable {e.stable_errors}, "
            "or the latest read failed): nothing judged"
        )
    if e.cause == CAUSE_LATENCY_ABOVE_SLO and e.p99_breach_fraction is not None:
        stable = "" if e.stable_breach_fraction is None else f", stable in {e.stable_breach_fraction:.0%}"
        return f"canary p99 above the SLO in {e.p99_breach_fraction:.0%} of its readings{stable}"
    if e.cause in (CAUSE_SLOWER_THAN_PLAIN, CAUSE_NOT_SLOWER_THAN_PLAIN) and e.p_value is not None:
        ratio = "" if e.latency_ratio is None else f"{e.latency_ratio:.2f}x the plain stable pods', "
        found = "significantly slower" if e.p_value < level else "not shown to be slower"
        return f"per-token latency {ratio}{found} ({_p(e.p_value, level)})"
    if e.cause == CAUSE_NOT_ENOUGH_SAMPLES:
        return (
            f"too few samples to test: canary {e.canary_samples}, stable {e.stable_samples}, "
            f"{e.min_samples} needed on each side"
        )
    if e.cause == CAUSE_ACCEPTANCE_DROPPED:
        return f"{lower}, by {effect}, beyond the {tolerance} tolerance; {within}"
    if e.cause == CAUSE_ACCEPTANCE_WITHIN_TOLERANCE:
        significant = e.p_value is not None and e.p_value < level
        return f"{within}; {lower}" + (f", by {effect}, inside the tolerance" if significant else "")
    if e.cause == CAUSE_ACCEPTANCE_NOT_WORSE:
        return f"{lower}, median {effect} within the {tolerance} tolerance; {within}"
    if verdict is Verdict.INCONCLUSIVE:
        return f"{lower}; {within}"
    return ""


def _summary(verdict: Verdict, e: Evidence) -> str:
    """One line with the numbers: what an operator reads in `kubectl describe` and the Event."""
    finding = _finding(verdict, e)
    parts = [f"{verdict.value} ({e.cause})" + (f": {finding}" if finding else "")]
    if e.canary_alpha is not None and e.stable_alpha is not None:
        parts.append(f"alpha canary {e.canary_alpha:.3f} vs stable {e.stable_alpha:.3f}")
    parts.append(f"samples {e.canary_samples}/{e.stable_samples}")
    if e.canary_errors or e.stable_errors:
        parts.append(f"failed reads {e.canary_errors}/{e.stable_errors}")
    if e.canary_p99_s is not None:
        latency = f"p99 {e.canary_p99_s * 1e3:.1f}ms"
        if e.slo_p99_s is not None and e.p99_breach_fraction is not None:
            latency += f" (SLO {e.slo_p99_s * 1e3:.1f}ms, above in {e.p99_breach_fraction:.0%})"
        if e.p99_vs_stable is not None:
            latency += f" {e.p99_vs_stable:.2f}x stable"
        parts.append(latency)
    if e.measured_speedup is not None:
        parts.append(f"speedup {e.measured_speedup:.2f}x vs baseline")
    return "; ".join(parts)


# ---------------------------------------------------------------- across steps


def next_action(
    verdict: Verdict, counters: CanaryCounters, analysis_limits: CanaryAnalysis
) -> tuple[Action, CanaryCounters, str]:
    """What the canary does after one analysis, the updated counters, and the reason.

    advance: promote to the next weight; hold: stay at this weight for another bake;
    rollback: remove the canary; pause: judgement impossible (metrics outage), keep the
    weight and analyse again at the next interval.
    """
    if verdict is Verdict.ERROR:
        errors = replace(counters, consecutive_errors=counters.consecutive_errors + 1)
        if errors.consecutive_errors > analysis_limits.consecutive_error_limit:
            return "pause", errors, REASON_JUDGEMENT_SUSPENDED
        return "pause", errors, REASON_METRICS_UNAVAILABLE
    judged = replace(counters, consecutive_errors=0)
    if verdict is Verdict.PASS:
        return "advance", judged, REASON_STEP_PASSED
    if verdict is Verdict.FAIL:
        failed = replace(judged, failures=judged.failures + 1)
        if failed.failures > analysis_limits.failure_limit:
            return "rollback", failed, REASON_FAILURE_LIMIT_EXCEEDED
        return "hold", failed, REASON_ANALYSIS_FAILED
    unsure = replace(judged, inconclusives=judged.inconclusives + 1)
    if unsure.inconclusives > analysis_limits.inconclusive_limit:
        return "rollback", unsure, REASON_INCONCLUSIVE_LIMIT_EXCEEDED
    return "hold", unsure, REASON_INCONCLUSIVE
