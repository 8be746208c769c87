"""`specops bench canary`: how fast the canary judgement catches a worse draft, and how rarely it
rolls back a good one.

Each analysis interval, each variant serves its share of the traffic and reports alpha the way
the operator measures it: accepted / drafted tokens over the interval, converted to alpha at the
draft length. The simulation of one interval of one variant at traffic weight w:

- requests: Poisson with mean w x request rate x interval;
- the interval's true alpha: the configured alpha times (1 + N(0, drift)), the same draw for
  both variants (the prompt mix drifts for everyone); a worse canary multiplies it by (1 - worse);
- prompts differ in acceptance: the interval's mean over its n requests is off by
  N(0, request_alpha_sd / sqrt(n));
- verification steps = requests x tokens per request / E(alpha, g); accepted tokens are the sum
  over the steps of a truncated geometric count (normal approximation with its exact mean and
  variance), so the estimate has binomial-like noise that shrinks with the token count.

Two experiments, each with its own seeded random.Random:

- power: a draft `worse` lower in alpha at `canary_weight`; `analyse` over the first n intervals
  of each run (one analysis per run and n, no peeking across n); the result is the smallest n
  at which at least 95 % of runs say FAIL;
- A/A: canary and stable with the same alpha through the full default step schedule of a
  SpeculativeDeployment (weights 5, 10, 25, 50, 100 %, each baked 10 minutes) with the default
  analysis limits. After each bake `analyse` judges the samples since the step began and
  `next_action` decides; a hold bakes the same step again (its window grows); reaching 100 %
  is promotion (no stable traffic is left to compare). A rollback is a false rollback. The
  same schedule is run with the worse draft to report how often it is rolled back.

No metrics outages are simulated: an outage pauses judgement and never rolls back or promotes
(see tests/unit/test_canary_analysis.py).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from specops.api.models import CanaryAnalysis, CanarySpec
from specops.api.units import parse_duration
from specops.cli_output import write_json
from specops.domain.acceptance import alpha_from_acceptance_rate
from specops.domain.canary import (
    DEFAULT_MIN_SAMPLES,
    DEFAULT_TOLERANCE,
    CanaryCounters,
    Sample,
    Verdict,
    analyse,
    next_action,
)
from specops.domain.perf import expected_tokens

POWER_TARGET = 0.95
FALSE_ROLLBACK_TARGET = 0.01

RESULT_KEYS = (
    "request_rate",
    "canary_weight",
    "interval_s",
    "detect_intervals_95",
    "detect_seconds_95",
    "power_at_detect",
    "aa_runs",
    "false_rollback_rate",
)


@dataclass(frozen=True)
class Traffic:
    """What the deployment serves and how noisy its per-interval alpha is."""

    request_rate: float  # requests per second over all variants
    tokens_per_request: float
    interval_s: float
    draft_length: int
    request_alpha_sd: float  # spread of alpha between prompts
    drift_sd: float  # relative, per interval, shared by both variants


@dataclass(frozen=True)
class Judgement:
    """How the canary is judged: the spec's analysis limits plus the analysis parameters."""

    confidence: float
    tolerance: float
    min_samples: int
    limits: CanaryAnalysis
    steps: tuple[tuple[float, float], ...]  # (weight fraction, bake seconds)


@dataclass(frozen=True)
class ScheduleOutcome:
    rolled_back: bool
    analyses: int
    seconds: float
    last_weight: float


def _poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0.0:
        return 0
    if mean > 50.0:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, count, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count


def _accepted_per_step(alpha: float, draft_length: int) -> tuple[float, float]:
    """Mean and variance of accepted draft tokens in one step: P(k) = alpha^k (1 - alpha), k < g; alpha^g at g."""
    probabilities = [alpha**k * (1.0 - alpha) for k in range(draft_length)] + [alpha**draft_length]
    mean = sum(k * p for k, p in enumerate(probabilities))
    return mean, sum((k - mean) ** 2 * p for k, p in enumerate(probabilities))


def measure_interval(rng: random.Random, true_alpha: float, weight: float, traffic: Traffic) -> Sample:
    """The alpha one variant reports for one interval at traffic share `weight`."""
    requests = _poisson(rng, weight * traffic.request_rate * traffic.interval_s)
    if requests == 0:
        return Sample(alpha=None)  # nothing drafted: ok, but no alpha
    alpha = min(0.99, max(0.01, true_alpha + rng.gauss(0.0, traffic.request_alpha_sd / math.sqrt(requests))))
    g = traffic.draft_length
    steps = max(1.0, round(requests * traffic.tokens_per_request / expected_tokens(alpha, g)))
    mean, variance = _accepted_per_step(alpha, g)
    accepted = rng.gauss(steps * mean, math.sqrt(steps * variance))
    rate = min(1.0, max(0.0, accepted / (steps * g)))
    return Sample(alpha=alpha_from_acceptance_rate(rate, g))


class Run:
    """One canary's interval-by-interval measurements, generated on demand from its own seed."""

    def __init__(self, seed: int, traffic: Traffic, alpha: float, canary_factor: float) -> None:
        self._rng = random.Random(seed)
        self._traffic = traffic
        self._alpha = alpha
        self._canary_factor = canary_factor

    def interval(self, weight: float) -> tuple[Sample, Sample]:
        """(canary, stable) samples of the next interval with the canary at `weight`."""
        shared = self._alpha * (1.0 + self._rng.gauss(0.0, self._traffic.drift_sd))
        canary = measure_interval(self._rng, shared * self._canary_factor, weight, self._traffic)
        stable = measure_interval(self._rng, shared, 1.0 - weight, self._traffic)
        return canary, stable


def _verdict(canary: Sequence[Sample], stable: Sequence[Sample], judgement: Judgement) -> Verdict:
    verdict, _ = analyse(
        canary,
        stable,
        confidence=judgement.confidence,
        slo_p99_s=None,
        min_samples=judgement.min_samples,
        tolerance=judgement.tolerance,
    )
    return verdict


def detection_power(
    runs: Sequence[Run], weight: float, judgement: Judgement, max_intervals: int
) -> tuple[int | None, float, list[float]]:
    """Smallest n whose analysis says FAIL in >= 95 % of runs, the power there, and power by n."""
    windows: list[tuple[list[Sample], list[Sample]]] = [([], []) for _ in runs]
    curve: list[float] = []
    for n in range(1, max_intervals + 1):
        fails = 0
        for run, (canary, stable) in zip(runs, windows, strict=True):
            c, s = run.interval(weight)
            canary.append(c)
            stable.append(s)
            if n >= judgement.min_samples and _verdict(canary, stable, judgement) is Verdict.FAIL:
                fails += 1
        curve.append(fails / len(runs))
        if curve[-1] >= POWER_TARGET:
            return n, curve[-1], curve
    return None, curve[-1] if curve else 0.0, curve


def run_schedule(run: Run, judgement: Judgement, interval_s: float) -> ScheduleOutcome:
    """One canary through the step schedule: analyse after each bake, follow next_action."""
    counters = CanaryCounters()
    analyses, seconds, weight = 0, 0.0, 0.0
    for weight, bake_s in judgement.steps:
        if weight >= 1.0:
            break
        canary: list[Sample] = []
        stable: list[Sample] = []
        while True:
            for _ in range(max(1, round(bake_s / interval_s))):
                c, s = run.interval(weight)
                canary.append(c)
                stable.append(s)
                seconds += interval_s
            analyses += 1
            action, counters, _ = next_action(_verdict(canary, stable, judgement), counters, judgement.limits)
            if action == "rollback":
                return ScheduleOutcome(True, analyses, seconds, weight)
            if action == "advance":
                break
    return ScheduleOutcome(False, analyses, seconds, weight)


def upper_bound_95(events: int, trials: int) -> float:
    """One-sided 95 % upper confidence bound of a binomial rate (Clopper-Pearson)."""
    if trials == 0:
        return 1.0
    if events >= trials:
        return 1.0

    def cdf(p: float) -> float:
        log_p, log_q = math.log(p), math.log1p(-p)
        return sum(
            math.exp(
                math.lgamma(trials + 1)
                - math.lgamma(k + 1)
                - math.lgamma(trials - k + 1)
                + k * log_p
                + (trials - k) * log_q
            )
            for k in range(events + 1)
        )

    lo, hi = events / trials, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if cdf(mid) > 0.05:
            lo = mid
        else:
            hi = mid
    return hi


def run(
    traffic: Traffic,
    judgement: Judgement,
    *,
    alpha: float,
    worse: float,
    canary_weight: float,
    runs: int,
    aa_runs: int,
    bad_runs: int,
    max_intervals: int,
    seed: int,
) -> dict[str, Any]:
    """Both experiments; every run draws from its own seed derived from `seed`."""
    power_runs = [Run(seed * 1_000_003 + i, traffic, alpha, 1.0 - worse) for i in range(runs)]
    detect, power, curve = detection_power(power_runs, canary_weight, judgement, max_intervals)

    aa = [
        run_schedule(Run(seed * 1_000_003 + 500_000 + i, traffic, alpha, 1.0), judgement, traffic.interval_s)
        for i in range(aa_runs)
    ]
    false_rollbacks = sum(1 for o in aa if o.rolled_back)
    promoted = [o for o in aa if not o.rolled_back]
    bad = [
        run_schedule(
            Run(seed * 1_000_003 + 800_000 + i, traffic, alpha, 1.0 - worse), judgement, traffic.interval_s
        )
        for i in range(bad_runs)
    ]
    first_weight = judgement.steps[0][0]
    return {
        "request_rate": traffic.request_rate,
        "canary_weight": canary_weight,
        "interval_s": traffic.interval_s,
        "detect_intervals_95": detect,
        "detect_seconds_95": detect * traffic.interval_s if detect is not None else None,
        "power_at_detect": power,
        "power_by_intervals": curve,
        "runs": runs,
        "aa_runs": aa_runs,
        "false_rollbacks": false_rollbacks,
        "false_rollback_rate": false_rollbacks / aa_runs if aa_runs else 0.0,
        "false_rollback_upper95": upper_bound_95(false_rollbacks, aa_runs),
        "aa_mean_analyses": sum(o.analyses for o in aa) / aa_runs if aa_runs else 0.0,
        "aa_mean_minutes_to_promote": (
            sum(o.seconds for o in promoted) / len(promoted) / 60.0 if promoted else None
        ),
        "bad_runs": bad_runs,
        "bad_rollback_rate": sum(1 for o in bad if o.rolled_back) / bad_runs if bad_runs else 0.0,
        "bad_rollback_at_first_step_rate": (
            sum(1 for o in bad if o.rolled_back and o.last_weight == first_weight) / bad_runs
            if bad_runs
            else 0.0
        ),
    }


def assumptions(traffic: Traffic, judgement: Judgement, alpha: float, worse: float) -> list[str]:
    steps = ", ".join(f"{w:.0%} for {s / 60:.0f}m" for w, s in judgement.steps)
    limits = judgement.limits
    return [
        f"request rate {traffic.request_rate:g} req/s over all variants, Poisson per interval; "
        f"{traffic.tokens_per_request:g} output tokens per request",
        f"draft length {traffic.draft_length}; stable alpha {alpha:g}; the worse draft's alpha is "
        f"{1.0 - worse:.0%} of it",
        f"alpha measured as accepted/drafted over each {traffic.interval_s:g}s interval, converted at the "
        "draft length; verification steps independent (truncated-geometric accepted count)",
        f"prompts differ: per-request alpha spread {traffic.request_alpha_sd:g} (sd); shared per-interval "
        f"drift {traffic.drift_sd:.1%} (relative sd)",
        f"analysis: one-sided Mann-Whitney U at confidence {judgement.confidence:g}, tolerance "
        f"{judgement.tolerance:.0%}, at least {judgement.min_samples} samples per side; no latency SLO",
        f"schedule: {steps}; a hold re-bakes the step; 100 % means promoted",
        f"limits: failureLimit {limits.failure_limit}, inconclusiveLimit {limits.inconclusive_limit}, "
        f"consecutiveErrorLimit {limits.consecutive_error_limit}; no metrics outages",
    ]


def _format(result: dict[str, Any]) -> str:
    def show(value: Any, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    rows = [
        ("request rate (req/s)", show(result["request_rate"], "g")),
        ("canary weight (power)", show(result["canary_weight"], ".0%")),
        ("interval (s)", show(result["interval_s"], "g")),
        (
            f"intervals to FAIL a {result['worse']:.0%} worse draft, 95 % power",
            show(result["detect_intervals_95"], "d"),
        ),
        ("  seconds of canary traffic", show(result["detect_seconds_95"], ".0f")),
        ("  power there", show(result["power_at_detect"], ".3f")),
        ("A/A runs through the full schedule", show(result["aa_runs"], "d")),
        ("  false rollback rate", show(result["false_rollback_rate"], ".3%")),
        ("  95 % upper bound", show(result["false_rollback_upper95"], ".2%")),
        ("  mean minutes to promote", show(result["aa_mean_minutes_to_promote"], ".1f")),
        ("worse-draft runs through the schedule", show(result["bad_runs"], "d")),
        ("  rolled back", show(result["bad_rollback_rate"], ".1%")),
        ("  rolled back at the first step", show(result["bad_rollback_at_first_step_rate"], ".1%")),
    ]
    width = max(len(label) for label, _ in rows) + 2
    lines = [f"{label:<{width}}{value:>10}" for label, value in rows]
    lines.append("assumptions:")
    lines.extend(f"  - {line}" for line in result["assumptions"])
    return "\n".join(lines)


def default_judgement(confidence: float | None, tolerance: float, min_samples: int) -> Judgement:
    """The judgement a SpeculativeDeployment gets by default: the CRD's steps and limits."""
    spec = CanarySpec()
    return Judgement(
        confidence=spec.analysis.confidence if confidence is None else confidence,
        tolerance=tolerance,
        min_samples=min_samples,
        limits=spec.analysis,
        steps=tuple((step.weight / 100.0, parse_duration(step.pause)) for step in spec.steps),
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="specops bench canary",
        description="Power of the canary analysis against a worse draft and its false rollback rate.",
    )
    parser.add_argument("--json", dest="json_path", help="write results as JSON to PATH ('-' for stdout)")
    parser.add_argument("--request-rate", type=float, default=10.0, help="requests/s over all variants")
    parser.add_argument("--tokens-per-request", type=float, default=256.0)
    parser.add_argument("--draft-length", type=int, default=4)
    parser.add_argument("--canary-weight", type=float, default=0.10, help="traffic share in the power test")
    parser.add_argument("--interval-s", type=float, default=15.0, help="analysis interval (metrics interval)")
    parser.add_argument("--alpha", type=float, default=0.75, help="per-token acceptance of the stable draft")
    parser.add_argument("--worse", type=float, default=0.05, help="relative alpha drop of the bad draft")
    parser.add_argument(
        "--request-alpha-sd", type=float, default=0.10, help="spread of alpha between prompts"
    )
    parser.add_argument("--drift", type=float, default=0.01, help="relative per-interval drift, shared")
    parser.add_argument("--confidence", type=float, default=None, help="default: the CRD's default")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    parser.add_argument("--min-samples", type=int, default=DEFAULT_MIN_SAMPLES)
    parser.add_argument("--runs", type=int, default=400, help="runs of the power experiment")
    parser.add_argument("--aa-runs", type=int, default=200, help="A/A runs through the full schedule")
    parser.add_argument("--bad-runs", type=int, default=100, help="worse-draft runs through the schedule")
    parser.add_argument("--max-intervals", type=int, default=240, help="give up on power after this many")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    traffic = Traffic(
        request_rate=args.request_rate,
        tokens_per_request=args.tokens_per_request,
        interval_s=args.interval_s,
        draft_length=args.draft_length,
        request_alpha_sd=args.request_alpha_sd,
        drift_sd=args.drift,
    )
    judgement = default_judgement(args.confidence, args.tolerance, args.min_samples)
    started = time.perf_counter()
    result = run(
        traffic,
        judgement,
        alpha=args.alpha,
        worse=args.worse,
        canary_weight=args.canary_weight,
        runs=args.runs,
        aa_runs=args.aa_runs,
        bad_runs=args.bad_runs,
        max_intervals=args.max_intervals,
        seed=args.seed,
    )
    result = {
        "benchmark": "canary",
        **result,
        "alpha": args.alpha,
        "worse": args.worse,
        "seed": args.seed,
        "traffic": asdict(traffic),
        "confidence": judgement.confidence,
        "tolerance": judgement.tolerance,
        "min_samples": judgement.min_samples,
        "limits": judgement.limits.model_dump(by_alias=True),
        "steps": [{"weight": w, "bake_s": s} for w, s in judgement.steps],
        "power_target": POWER_TARGET,
        "false_rollback_target": FALSE_ROLLBACK_TARGET,
        "assumptions": assumptions(traffic, judgement, args.alpha, args.worse),
        "wall_s": round(time.perf_counter() - started, 2),
    }
    print(_format(result), file=sys.stderr if args.json_path == "-" else sys.stdout)
    write_json(result, args.json_path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
