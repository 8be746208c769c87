"""The canary judgement: one analysis (`analyse`) and what the canary does next (`next_action`)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pytest
from scipy.stats import mannwhitneyu

from specops.api.models import CanaryAnalysis
from specops.domain.canary import (
    CAUSE_ACCEPTANCE_DROPPED,
    CAUSE_ACCEPTANCE_NOT_WORSE,
    CAUSE_ACCEPTANCE_UNCLEAR,
    CAUSE_ACCEPTANCE_WITHIN_TOLERANCE,
    CAUSE_LATENCY_ABOVE_SLO,
    CAUSE_METRICS_UNAVAILABLE,
    CAUSE_NOT_ENOUGH_SAMPLES,
    REASON_ANALYSIS_FAILED,
    REASON_FAILURE_LIMIT_EXCEEDED,
    REASON_INCONCLUSIVE,
    REASON_INCONCLUSIVE_LIMIT_EXCEEDED,
    REASON_JUDGEMENT_SUSPENDED,
    REASON_METRICS_UNAVAILABLE,
    REASON_STEP_PASSED,
    CanaryCounters,
    Sample,
    Verdict,
    analyse,
    mann_whitney_p,
    next_action,
    sample_from_measurement,
)
from specops.domain.metrics import Measurement

SLO = 0.045
FAILED_READ = Sample(ok=False)


def window(alpha: float, n: int = 20, spread: float = 0.01, p99: float | None = 0.030) -> list[Sample]:
    """n interval samples around `alpha`, deterministic, relative spread +-`spread` (few ties)."""
    return [
        Sample(alpha=alpha * (1.0 + spread * (((i * 7) % 11) - 5) / 5.0), tpot_p99_s=p99, tokens_per_s=900.0)
        for i in range(n)
    ]


def with_p99(samples: list[Sample], p99s: list[float]) -> list[Sample]:
    return [replace(s, tpot_p99_s=p) for s, p in zip(samples, p99s, strict=True)]


@dataclass(frozen=True)
class Case:
    name: str
    canary: list[Sample]
    stable: list[Sample]
    verdict: Verdict
    cause: str
    tolerance: float = 0.02


CASES = [
    Case(
        "equal, well measured drafts pass as within tolerance",
        window(0.75),
        window(0.75),
        Verdict.PASS,
        CAUSE_ACCEPTANCE_WITHIN_TOLERANCE,
    ),
    Case(
        "equal, noisy drafts pass as not worse",
        window(0.75, n=8, spread=0.06),
        window(0.75, n=8, spread=0.06),
        Verdict.PASS,
        CAUSE_ACCEPTANCE_NOT_WORSE,
    ),
    Case(
        "a better draft passes as within tolerance",
        window(0.80),
        window(0.75),
        Verdict.PASS,
        CAUSE_ACCEPTANCE_WITHIN_TOLERANCE,
    ),
    Case(
        "a significant but immaterial 1 % drop passes",
        window(0.7425, n=40, spread=0.002),
        window(0.75, n=40, spread=0.002),
        Verdict.PASS,
        CAUSE_ACCEPTANCE_WITHIN_TOLERANCE,
    ),
    Case(
        "a 5 % worse draft fails",
        window(0.7125),
        window(0.75),
        Verdict.FAIL,
        CAUSE_ACCEPTANCE_DROPPED,
    ),
    Case(
        "with no tolerance a significant 1 % drop fails",
        window(0.7425, n=40, spread=0.002),
        window(0.75, n=40, spread=0.002),
        Verdict.FAIL,
        CAUSE_ACCEPTANCE_DROPPED,
        tolerance=0.0,
    ),
    Case(
        "a 3 % lower median buried in noise is inconclusive",
        window(0.7275, n=8, spread=0.08),
        window(0.75, n=8, spread=0.08),
        Verdict.INCONCLUSIVE,
        CAUSE_ACCEPTANCE_UNCLEAR,
    ),
    Case(
        "four samples are not enough",
        window(0.60, n=4),
        window(0.75, n=4),
        Verdict.INCONCLUSIVE,
        CAUSE_NOT_ENOUGH_SAMPLES,
    ),
    Case(
        "a canary that drafted nothing cannot be judged on acceptance",
        [Sample(alpha=None, tpot_p99_s=0.03)] * 20,
        window(0.75),
        Verdict.INCONCLUSIVE,
        CAUSE_NOT_ENOUGH_SAMPLES,
    ),
    Case(
        "the canary's latest read failed",
        [*window(0.40), FAILED_READ],
        window(0.75),
        Verdict.ERROR,
        CAUSE_METRICS_UNAVAILABLE,
    ),
    Case(
        "the stable's latest read failed",
        window(0.75),
        [*window(0.75), FAILED_READ],
        Verdict.ERROR,
        CAUSE_METRICS_UNAVAILABLE,
    ),
    Case(
        "more than a quarter of the window is missing",
        [*[FAILED_READ] * 6, *window(0.75, n=14)],
        window(0.75),
        Verdict.ERROR,
        CAUSE_METRICS_UNAVAILABLE,
    ),
    Case(
        "one failed read inside a window is only a missing sample",
        [*window(0.75, n=10), FAILED_READ, *window(0.75, n=10)],
        window(0.75),
        Verdict.PASS,
        CAUSE_ACCEPTANCE_WITHIN_TOLERANCE,
    ),
    Case(
        "canary p99 above the SLO in most intervals fails, whatever its acceptance",
        with_p99(window(0.80, n=10), [0.050] * 6 + [0.040] * 4),
        window(0.75, n=10),
        Verdict.FAIL,
        CAUSE_LATENCY_ABOVE_SLO,
    ),
    Case(
        "canary p99 above the SLO in a minority of intervals does not fail",
        with_p99(window(0.75, n=10), [0.050] * 5 + [0.040] * 5),
        window(0.75, n=10),
        Verdict.PASS,
        CAUSE_ACCEPTANCE_WITHIN_TOLERANCE,
    ),
    Case(
        "a breach the stable shares is load, not the draft",
        window(0.75, p99=0.060),
        window(0.75, p99=0.055),
        Verdict.PASS,
        CAUSE_ACCEPTANCE_WITHIN_TOLERANCE,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_verdicts(case: Case) -> None:
    # given a window of canary and stable samples, when analysed at 95 % confidence
    verdict, evidence = analyse(
        case.canary, case.stable, confidence=0.95, slo_p99_s=SLO, tolerance=case.tolerance
    )
    # then the verdict and the rule that decided it are the expected ones
    assert (verdict, evidence.cause) == (case.verdict, case.cause)
    assert evidence.summary.startswith(f"{case.verdict.value} ({case.cause})")


def test_evidence_carries_the_numbers_that_decided() -> None:
    # given a 5 % worse canary whose p99 is 10 % above the stable's and a recorded baseline
    canary = [replace(s, tpot_p50_s=0.010) for s in window(0.7125, p99=0.033)]
    stable = window(0.75, p99=0.030)
    # when analysed
    verdict, evidence = analyse(canary, stable, confidence=0.95, slo_p99_s=SLO, baseline_p50_s=0.021)
    # then the evidence holds medians, p-value, effect, latency and speedup, and the summary says them
    assert verdict is Verdict.FAIL
    assert (evidence.canary_samples, evidence.stable_samples) == (20, 20)
    assert evidence.canary_alpha == pytest.approx(0.7125, rel=0.01)
    assert evidence.stable_alpha == pytest.approx(0.75, rel=0.01)
    assert evidence.effect == pytest.approx(-0.05, abs=0.005)
    assert evidence.p_value is not None and evidence.p_value < 0.001
    assert evidence.p99_vs_stable == pytest.approx(1.1)
    assert evidence.p99_breach_fraction == 0.0
    assert evidence.measured_speedup == pytest.approx(2.1)
    assert (evidence.confidence, evidence.tolerance) == (0.95, 0.02)
    for text in ("0.713", "0.750", "-5.0%", "p99 33.0ms", "SLO 45.0ms", "1.10x stable", "2.10x vs baseline"):
        assert text in evidence.summary
    assert "\n" not in evidence.summary


def test_error_evidence_counts_the_failed_reads() -> None:
    verdict, evidence = analyse(
        [*window(0.75), FAILED_READ, FAILED_READ], window(0.75), confidence=0.95, slo_p99_s=None
    )
    assert verdict is Verdict.ERROR
    assert (evidence.canary_errors, evidence.stable_errors) == (2, 0)
    assert "failed reads 2/0" in evidence.summary


def test_higher_confidence_needs_stronger_evidence_to_fail() -> None:
    # given a small, noisy window with a 4 % drop: significant at 90 % but not at 99.9 %
    canary, stable = window(0.72, n=6, spread=0.04), window(0.75, n=6, spread=0.04)
    assert analyse(canary, stable, confidence=0.90, slo_p99_s=None)[0] is Verdict.FAIL
    assert analyse(canary, stable, confidence=0.999, slo_p99_s=None)[0] is Verdict.INCONCLUSIVE


def test_min_samples_is_configurable() -> None:
    canary, stable = window(0.75, n=8), window(0.75, n=8)
    assert analyse(canary, stable, confidence=0.95, slo_p99_s=None, min_samples=8)[0] is Verdict.PASS
    assert analyse(canary, stable, confidence=0.95, slo_p99_s=None, min_samples=9)[0] is Verdict.INCONCLUSIVE


@pytest.mark.parametrize(("confidence", "tolerance"), [(1.0, 0.02), (0.0, 0.02), (0.95, -0.1), (0.95, 1.0)])
def test_nonsense_parameters_are_refused(confidence: float, tolerance: float) -> None:
    with pytest.raises(ValueError):
        analyse(window(0.75), window(0.75), confidence=confidence, slo_p99_s=None, tolerance=tolerance)


def test_samples_from_measurements() -> None:
    at = datetime(2024, 1, 1, tzinfo=UTC)
    ok = Measurement(phase="Ok", at=at, alpha=0.7, tpot_p50_s=0.01, tpot_p99_s=0.03, tokens_per_s=800.0)
    assert sample_from_measurement(ok) == Sample(
        alpha=0.7, tpot_p99_s=0.03, tokens_per_s=800.0, ok=True, tpot_p50_s=0.01
    )
    assert sample_from_measurement(Measurement.failed(at, "MetricsUnavailable", "timeout")) == FAILED_READ
    # a cycle that went without its latency quantiles still serves the control loop, never a canary:
    # judged without p99, a canary breaching the latency SLO could pass
    blind = replace(ok, tpot_p50_s=None, tpot_p99_s=None, latency_error="latency quantiles missing")
    assert sample_from_measurement(blind) == FAILED_READ


# ---------------------------------------------------------------- next_action

LIMITS = CanaryAnalysis(failure_limit=2, inconclusive_limit=3, consecutive_error_limit=4)


@pytest.mark.parametrize(
    ("verdict", "before", "action", "after", "reason"),
    [
        (Verdict.PASS, CanaryCounters(1, 2, 3), "advance", CanaryCounters(1, 2, 0), REASON_STEP_PASSED),
        (Verdict.FAIL, CanaryCounters(0, 0, 2), "hold", CanaryCounters(1, 0, 0), REASON_ANALYSIS_FAILED),
        (Verdict.FAIL, CanaryCounters(1, 3, 0), "hold", CanaryCounters(2, 3, 0), REASON_ANALYSIS_FAILED),
        (
            Verdict.FAIL,
            CanaryCounters(2, 0, 0),
            "rollback",
            CanaryCounters(3, 0, 0),
            REASON_FAILURE_LIMIT_EXCEEDED,
        ),
        (Verdict.INCONCLUSIVE, CanaryCounters(0, 2, 1), "hold", CanaryCounters(0, 3, 0), REASON_INCONCLUSIVE),
        (
            Verdict.INCONCLUSIVE,
            CanaryCounters(2, 3, 0),
            "rollback",
            CanaryCounters(2, 4, 0),
            REASON_INCONCLUSIVE_LIMIT_EXCEEDED,
        ),
        (
            Verdict.ERROR,
            CanaryCounters(2, 3, 0),
            "pause",
            CanaryCounters(2, 3, 1),
            REASON_METRICS_UNAVAILABLE,
        ),
        (
            Verdict.ERROR,
            CanaryCounters(0, 0, 3),
            "pause",
            CanaryCounters(0, 0, 4),
            REASON_METRICS_UNAVAILABLE,
        ),
        (
            Verdict.ERROR,
            CanaryCounters(0, 0, 4),
            "pause",
            CanaryCounters(0, 0, 5),
            REASON_JUDGEMENT_SUSPENDED,
        ),
    ],
)
def test_next_action(
    verdict: Verdict, before: CanaryCounters, action: str, after: CanaryCounters, reason: str
) -> None:
    assert next_action(verdict, before, LIMITS) == (action, after, reason)


def test_zero_limits_roll_back_on_the_first_bad_verdict() -> None:
    strict = CanaryAnalysis(failure_limit=0, inconclusive_limit=0, consecutive_error_limit=0)
    assert next_action(Verdict.FAIL, CanaryCounters(), strict)[0] == "rollback"
    assert next_action(Verdict.INCONCLUSIVE, CanaryCounters(), strict)[0] == "rollback"
    assert next_action(Verdict.ERROR, CanaryCounters(), strict)[::2] == ("pause", REASON_JUDGEMENT_SUSPENDED)


def test_a_metrics_outage_never_rolls_back_nor_promotes() -> None:
    # given a canary that already used up its failure and inconclusive allowance, and a terrible
    # canary whose metrics then go away
    counters = CanaryCounters(failures=2, inconclusives=3)
    canary = [*window(0.30), FAILED_READ]
    # when it is analysed over and over through a long outage
    actions = set()
    for _ in range(50):
        verdict, _ = analyse(canary, window(0.75), confidence=0.95, slo_p99_s=SLO)
        action, counters, reason = next_action(verdict, counters, LIMITS)
        actions.add(action)
        canary.append(FAILED_READ)
    # then judgement only ever pauses, the counters that decide rollback are untouched,
    # and the reason says judgement is suspended
    assert actions == {"pause"}
    assert (counters.failures, counters.inconclusives, counters.consecutive_errors) == (2, 3, 50)
    assert reason == REASON_JUDGEMENT_SUSPENDED
    # and when metrics return, the first real verdict is judged with the same counters
    assert next_action(Verdict.PASS, counters, LIMITS) == (
        "advance",
        CanaryCounters(2, 3, 0),
        REASON_STEP_PASSED,
    )


# ---------------------------------------------------------------- Mann-Whitney U


def test_mann_whitney_agrees_with_scipy_on_random_samples_with_ties() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n1, n2 = rng.randint(1, 60), rng.randint(1, 60)
        digits = rng.choice([0, 1, 2, 4])  # rounding makes ties, from many to none
        shift = rng.uniform(-1.0, 1.0)
        x = [round(rng.gauss(shift, 1.0), digits) for _ in range(n1)]
        y = [round(rng.gauss(0.0, 1.0), digits) for _ in range(n2)]
        for alternative in ("less", "greater"):
            expected = mannwhitneyu(x, y, alternative=alternative, method="asymptotic").pvalue
            assert mann_whitney_p(x, y, alternative) == pytest.approx(expected, abs=1e-3)


def test_mann_whitney_edge_cases() -> None:
    assert mann_whitney_p([0.7] * 5, [0.7] * 5, "less") == 1.0  # all tied: no evidence
    assert mann_whitney_p([0.1, 0.2, 0.3], [0.7, 0.8, 0.9], "less") < 0.05
    assert mann_whitney_p([0.1, 0.2, 0.3], [0.7, 0.8, 0.9], "greater") > 0.95
    with pytest.raises(ValueError):
        mann_whitney_p([], [0.5], "less")


def test_against_plain_stable_pods_a_canary_is_judged_on_its_latency() -> None:
    from specops.domain.canary import Sample, analyse

    plain = [
        Sample(ok=True, alpha=None, tpot_p50_s=0.020 + 0.0005 * (i % 3), tpot_p99_s=0.03) for i in range(12)
    ]
    faster = [
        Sample(ok=True, alpha=0.7, tpot_p50_s=0.012 + 0.0005 * (i % 3), tpot_p99_s=0.02) for i in range(12)
    ]
    slower = [
        Sample(ok=True, alpha=0.1, tpot_p50_s=0.026 + 0.0005 * (i % 3), tpot_p99_s=0.04) for i in range(12)
    ]
    verdict, evidence = analyse(faster, plain, confidence=0.95, slo_p99_s=None)
    assert verdict.value == "Pass" and evidence.cause == "NotSlowerThanPlain"
    assert "0.6" in evidence.summary and "plain stable pods" in evidence.summary
    verdict, evidence = analyse(slower, plain, confidence=0.95, slo_p99_s=None)
    assert verdict.value == "Fail" and evidence.cause == "SlowerThanPlain"


# ---------------------------------------------------------------- the verdict in words

P_SAID = re.compile(r"p=([0-9.e+-]+) (<|>=) ([0-9.e+-]+)")


def said_p_values_hold(summary: str) -> int:
    """Every 'p=X < L' / 'p=X >= L' in a summary is true of its numbers; how many there are."""
    found = P_SAID.findall(summary)
    for value, sign, level in found:
        assert (float(value) < float(level)) == (sign == "<"), summary
    return len(found)


def test_a_small_significant_drop_inside_the_tolerance_passes_and_says_so() -> None:
    # Given a canary 1 % below stable, measured tightly: significantly lower, but within the 2 % tolerance
    verdict, evidence = analyse(
        window(0.792, n=30, spread=0.002), window(0.80, n=30, spread=0.002), confidence=0.95, slo_p99_s=None
    )
    assert verdict is Verdict.PASS and evidence.cause == CAUSE_ACCEPTANCE_WITHIN_TOLERANCE
    assert evidence.p_value is not None and evidence.p_value < 0.05
    # Then the words say what each test found, in agreement with the p-values beside them
    summary = evidence.summary
    assert "any drop shown to be within the 2% tolerance (p=" in summary
    assert (
        "canary acceptance significantly lower than stable (p=" in summary
        and "inside the tolerance" in summary
    )
    assert "a test holds" not in summary
    assert said_p_values_hold(summary) == 2


@pytest.mark.parametrize("seed", range(40))
def test_every_verdicts_words_agree_with_its_p_values(seed: int) -> None:
    rng = random.Random(seed)
    stable_alpha = rng.uniform(0.5, 0.9)
    canary_alpha = stable_alpha * rng.uniform(0.9, 1.05)
    n = rng.choice([3, 8, 20, 40])
    verdict, evidence = analyse(
        window(canary_alpha, n=n, spread=rng.uniform(0.001, 0.05)),
        window(stable_alpha, n=n, spread=rng.uniform(0.001, 0.05)),
        confidence=rng.choice([0.9, 0.95, 0.99]),
        slo_p99_s=None,
    )
    shown = said_p_values_hold(evidence.summary)
    assert evidence.summary.startswith(f"{verdict.value} ({evidence.cause}): ")
    # both tests are reported with their levels once there are enough samples to run them
    assert shown == (0 if evidence.cause == CAUSE_NOT_ENOUGH_SAMPLES else 2)
    if (
        verdict is Verdict.PASS
        and evidence.p_value is not None
        and evidence.p_value < 1 - evidence.confidence
    ):
        assert "significantly lower" in evidence.summary and "inside the tolerance" in evidence.summary
    if verdict is Verdict.FAIL:
        assert "significantly lower" in evidence.summary and "beyond the" in evidence.summary
