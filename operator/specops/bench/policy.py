"""`specops bench policy`: replay load traces through the speculation policy and its alternatives.

A trace is a CSV with header `t_seconds,batch,alpha` (optional `context_tokens`): the true
mean running requests per pod and per-token acceptance over each interval. Each interval is
one scrape-and-decide period. The realised speedup of an interval is the performance model's
`speedup(setup, true alpha, true batch, draft length in force)`; results are time-weighted
means over the trace.

What each strategy sees:
- policy: `decide()` starting in the Dynamic phase (baseline and soak already done, draft
  length at `initial_length`, smoothed alpha = the first measurement); at interval i it sees
  the measurement of interval i-1 (one scrape of delay) with noise: batch x (1 + N(0, 0.05)),
  alpha + N(0, 0.02); no alpha at all when it was not speculating;
- oracle: the best length in {0} U [min, max] for the true batch and alpha of each interval;
- always-on: `initial_length` throughout; always-off: 1.0 by definition;
- threshold rule: the folklore controller, draft length +1 when the measured acceptance rate
  (accepted / drafted, what engines export) was above 0.7, -1 below 0.4, clamped to
  [min, max], never off; it sees the same delayed, noisy measurements as the policy.

Worlds (`--world NAME|FILE`, repeatable, or `--world all`): the true speedup of an interval
comes from a serving profile (`specops.profiles`) instead of the roofline, while the
policy keeps the roofline prior the flags describe (`--gpu --tensor-parallel
--target-params --draft-params`, as a spec would give them): the world is hidden from it.
It also sees the world's per-token latency, x (1 + N(0, 0.03)). A profile with an alpha
shifts the trace's acceptance so that its mean is the profile's (drift and noise kept). In a world, always-on runs
at `ALWAYS_ON_LENGTH` (3) tokens, the oracle picks off or any length in 1..max per interval,
and the result adds the share of time slower than plain (`slowdown_time_fraction`, realised
speedup < 0.98) and both break-even batches: the world's and the prior's (the batch at
which no length in 1..max beats plain at the trace's mean alpha; null when none up to 1024).

`--policy calibrated` replays `domain.calibrated_policy` instead of `domain.policy`: it
learns the world from the noisy TPOT it sees and probes within its budget; probe intervals
are reported apart (`probe_cost_fraction`) and do not count as toggles.
`learned_break_even_batch` is its model's at the end of the trace (the prior's for the
roofline policy, which learns nothing).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import random
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from specops import profiles
from specops.cli_output import write_json
from specops.domain.acceptance import acceptance_rate_from_alpha
from specops.domain.calibrated_policy import (
    CalibratedPolicyConfig,
    CalibratedPolicyState,
    Measurement,
    model_of,
)
from specops.domain.calibrated_policy import decide as calibrated_decide
from specops.domain.calibration import ProbeConfig
from specops.domain.perf import GPUS, ModelSetup, best_length_break_even_batch, per_token_latency, speedup
from specops.domain.policy import Baseline, Observation, PolicyConfig, PolicyState, decide
from specops.domain.profile import ServingProfile

BATCH_NOISE_SIGMA = 0.05  # relative: a rate() over one scrape window of a running-requests gauge
ALPHA_NOISE_SIGMA = 0.02  # absolute: accepted/drafted counters over one window at ~1e4 drafted tokens
TPOT_NOISE_SIGMA = 0.03  # relative: a p50 from one scrape window of the per-token latency histogram
SLOWDOWN_BELOW = 0.98  # an interval counts as slower than plain below this realised speedup
ALWAYS_ON_LENGTH = 3  # the fixed length "leave speculation on" is compared at in a world
MAX_BREAK_EVEN_BATCH = 1024
POLICIES = ("roofline", "calibrated")
THRESHOLD_UP = 0.7
THRESHOLD_DOWN = 0.4
EPOCH = datetime(2024, 1, 1, tzinfo=UTC)

RESULT_KEYS = (
    "policy_speedup",
    "oracle_speedup",
    "always_on_speedup",
    "always_off_speedup",
    "threshold_rule_speedup",
    "ratio_to_oracle",
    "toggles_per_hour",
)


@dataclass(frozen=True)
class World:
    """What an interval really delivers: a serving profile's speedup, or the roofline's when none."""

    name: str
    setup: ModelSetup
    profile: ServingProfile | None = None

    def adapt(self, trace: list[TracePoint]) -> list[TracePoint]:
        """The trace as this world sees it: acceptance shifted so its mean is the profile's alpha.

        A profile's step times were measured at its own acceptance; the trace keeps its drift
        and noise around that level. Without a profile alpha the trace is unchanged.
        """
        if self.profile is None or self.profile.alpha is None:
            return trace
        shift = self.profile.alpha - sum(p.alpha for p in trace) / len(trace)
        return [replace(p, alpha=min(0.99, max(0.0, p.alpha + shift))) for p in trace]

    def _at(self, point: TracePoint) -> ModelSetup:
        return self.setup if point.context_tokens is None else self.setup.with_context(point.context_tokens)

    def speedup(self, point: TracePoint, length: int) -> float:
        if self.profile is None:
            return speedup(self._at(point), point.alpha, point.batch, length)
        return self.profile.speedup(point.alpha, length, max(1.0, point.batch))

    def tpot_s(self, point: TracePoint, length: int) -> float:
        if self.profile is None:
            return per_token_latency(self._at(point), point.alpha, point.batch, length)
        return self.profile.per_token_ms(point.alpha, length, max(1.0, point.batch)) / 1e3

    def break_even_batch(self, alpha: float, max_length: int) -> int | None:
        if self.profile is None:
            return best_length_break_even_batch(self.setup, alpha, max_length, MAX_BREAK_EVEN_BATCH)
        return self.profile.break_even_batch(alpha, max_length, MAX_BREAK_EVEN_BATCH)


@dataclass(frozen=True)
class TracePoint:
    t_seconds: float
    batch: float
    alpha: float
    context_tokens: float | None = None


def load_trace(path: Path) -> list[TracePoint]:
    with path.open(newline="") as handle:
        return parse_trace(handle)


def parse_trace(lines: Iterable[str]) -> list[TracePoint]:
    points = []
    for row in csv.DictReader(lines):
        context = row.get("context_tokens")
        points.append(
            TracePoint(
                t_seconds=float(row["t_seconds"]),
                batch=float(row["batch"]),
                alpha=float(row["alpha"]),
                context_tokens=float(context) if context not in (None, "") else None,
            )
        )
    if len(points) < 2:
        raise ValueError("a trace needs at least two intervals")
    return points


def shipped_traces() -> dict[str, Path]:
    """The traces packaged with specops, by name (file stem)."""
    folder = resources.files("specops.bench").joinpath("traces")
    return {
        Path(entry.name).stem: Path(str(entry))
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".csv")
    }


def default_config(setup: ModelSetup) -> PolicyConfig:
    """The policy as a SpeculativeDeployment gets it by default (initial 4, lengths 1..8)."""
    return PolicyConfig(
        mode="auto",
        initial_length=4,
        min_length=1,
        max_length=8,
        baseline_duration_s=0.0,
        soak_duration_s=0.0,
        setup=setup,
    )


def replay(
    trace: list[TracePoint],
    setup: ModelSetup,
    config: PolicyConfig,
    seed: int = 0,
    batch_noise_sigma: float = BATCH_NOISE_SIGMA,
    alpha_noise_sigma: float = ALPHA_NOISE_SIGMA,
    world: World | None = None,
    policy: str = "roofline",
) -> dict[str, float | None]:
    """Mean speedups of the policy and the reference strategies over one trace (see `replay_lengths`)."""
    return replay_lengths(
        trace, setup, config, seed, batch_noise_sigma, alpha_noise_sigma, world=world, policy=policy
    ).result


@dataclass(frozen=True)
class Replayed:
    """A replay's results, and per interval the length in force and whether it was a probe."""

    result: dict[str, float | None]
    lengths: list[int]
    probes: list[bool]


def replay_lengths(
    trace: list[TracePoint],
    setup: ModelSetup,
    config: PolicyConfig,
    seed: int = 0,
    batch_noise_sigma: float = BATCH_NOISE_SIGMA,
    alpha_noise_sigma: float = ALPHA_NOISE_SIGMA,
    world: World | None = None,
    policy: str = "roofline",
) -> Replayed:
    """Mean speedups of the policy and the reference strategies over one trace.

    Without a world the trace is replayed in the roofline of `setup` (the policy's own model)
    and always-on runs at `initial_length`; with one, in that world at `ALWAYS_ON_LENGTH`.
    `policy` is "roofline" (`domain.policy`) or "calibrated" (`domain.calibrated_policy`).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    in_world = world is not None
    truth = world if world is not None else World("roofline", setup)
    trace = truth.adapt(trace)
    rng = random.Random(seed)
    batch_noise = [rng.gauss(0.0, batch_noise_sigma) for _ in trace]
    alpha_noise = [rng.gauss(0.0, alpha_noise_sigma) for _ in trace]
    tpot_noise = [rng.gauss(0.0, TPOT_NOISE_SIGMA) for _ in trace]
    weights = _interval_weights(trace)
    lo, hi = max(1, config.min_length), max(1, config.max_length)
    initial = min(hi, max(lo, config.initial_length))
    always_on = min(hi, max(lo, ALWAYS_ON_LENGTH)) if in_world else initial

    def measured(i: int, length: int) -> Observation:
        point = trace[i]
        alpha = min(1.0, max(0.0, point.alpha + alpha_noise[i])) if length > 0 else None
        return Observation(
            batch=max(0.0, point.batch * (1.0 + batch_noise[i])),
            alpha=alpha,
            tpot_p50_s=truth.tpot_s(point, length) * (1.0 + tpot_noise[i]),
            context_tokens=point.context_tokens,
        )

    def realised(i: int, length: int) -> float:
        return truth.speedup(trace[i], length)

    start = EPOCH + timedelta(seconds=trace[0].t_seconds)
    first = measured(0, initial)
    state = PolicyState(
        phase="Dynamic",
        phase_since=start,
        enabled=True,
        draft_length=initial,
        alpha=first.alpha,
        last_toggle=None,
        baseline=Baseline(None, None, None, None, 0),
    )
    interval_s = trace[1].t_seconds - trace[0].t_seconds
    calibrated_config = CalibratedPolicyConfig(
        setup=setup,
        min_length=lo,
        max_length=hi,
        initial_length=initial,
        probes=ProbeConfig(probe_duration_s=interval_s),
    )
    calibrated = CalibratedPolicyState(enabled=True, draft_length=initial, alpha=first.alpha)
    policy_lengths = [initial]
    probes = [False]
    choices = [True]  # the policy's own on/off choice, probes aside
    threshold_lengths = [initial]
    for i in range(1, len(trace)):
        now = EPOCH + timedelta(seconds=trace[i].t_seconds)
        seen = measured(i - 1, policy_lengths[-1])
        if policy == "roofline":
            decision = decide(config, state, seen, now)
            state = decision.state
            policy_lengths.append(decision.num_draft_tokens)
            probes.append(False)
            choices.append(decision.num_draft_tokens > 0)
        else:
            measurement = Measurement(
                seen.batch, policy_lengths[-1], seen.tpot_p50_s, seen.alpha, seen.context_tokens
            )
            chosen = calibrated_decide(calibrated_config, calibrated, measurement, trace[i].t_seconds)
            calibrated = chosen.state
            policy_lengths.append(chosen.num_draft_tokens)
            probes.append(chosen.probe)
            choices.append(calibrated.enabled)
        threshold_lengths.append(
            _threshold_step(measured(i - 1, threshold_lengths[-1]), threshold_lengths[-1], lo, hi)
        )

    def mean(values: Iterable[float]) -> float:
        return sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)

    policy_speedups = [realised(i, g) for i, g in enumerate(policy_lengths)]
    policy_mean = mean(policy_speedups)
    oracle = mean(max([1.0, *(realised(i, g) for g in range(lo, hi + 1))]) for i in range(len(trace)))
    toggles = sum(1 for a, b in itertools.pairwise(choices) if a != b)
    hours = sum(weights) / 3600.0
    result: dict[str, float | None] = {
        "policy_speedup": policy_mean,
        "oracle_speedup": oracle,
        "always_on_speedup": mean(realised(i, always_on) for i in range(len(trace))),
        "always_off_speedup": 1.0,
        "threshold_rule_speedup": mean(realised(i, g) for i, g in enumerate(threshold_lengths)),
        "ratio_to_oracle": policy_mean / oracle,
        "toggles_per_hour": toggles / hours,
        "slowdown_time_fraction": mean(1.0 if v < SLOWDOWN_BELOW else 0.0 for v in policy_speedups),
        "intervals": float(len(trace)),
        "hours": hours,
        "policy_time_off_fraction": mean(1.0 if g == 0 else 0.0 for g in policy_lengths),
        "probe_cost_fraction": mean(1.0 if p else 0.0 for p in probes),
    }
    if in_world:
        mean_alpha = sum(p.alpha for p in trace) / len(trace)
        prior = World("prior", setup)
        result["always_on_length"] = float(always_on)
        result["world_break_even_batch"] = _optional(truth.break_even_batch(mean_alpha, hi))
        result["prior_break_even_batch"] = _optional(prior.break_even_batch(mean_alpha, hi))
        if policy == "roofline":
            learned = result["prior_break_even_batch"]
        else:
            model = model_of(calibrated_config, calibrated)
            learned = _optional(model.break_even_batch(calibrated.alpha or mean_alpha, (lo, hi)))
        result["learned_break_even_batch"] = learned
    return Replayed(result, policy_lengths, probes)


def _optional(value: int | None) -> float | None:
    return None if value is None else float(value)


def _threshold_step(obs: Observation, length: int, lo: int, hi: int) -> int:
    assert obs.alpha is not None  # the threshold rule never switches off, so alpha is always measured
    rate = acceptance_rate_from_alpha(obs.alpha, length)
    if rate > THRESHOLD_UP:
        return min(hi, length + 1)
    if rate < THRESHOLD_DOWN:
        return max(lo, length - 1)
    return length


def _interval_weights(trace: list[TracePoint]) -> list[float]:
    """Each interval lasts until the next sample; the last one as long as the one before it."""
    gaps = [b.t_seconds - a.t_seconds for a, b in itertools.pairwise(trace)]
    return [*gaps, gaps[-1]]


def _format_table(rows: list[dict[str, Any]]) -> str:
    header = f"{'trace':<22}{'policy':>8}{'oracle':>8}{'on@init':>9}{'off':>6}{'thresh':>8}{'ratio':>8}{'tog/h':>7}"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['trace']:<22}{row['policy_speedup']:>8.3f}{row['oracle_speedup']:>8.3f}"
            f"{row['always_on_speedup']:>9.3f}{row['always_off_speedup']:>6.2f}"
            f"{row['threshold_rule_speedup']:>8.3f}{row['ratio_to_oracle']:>8.3f}{row['toggles_per_hour']:>7.1f}"
        )
    return "\n".join(lines)


def _format_world_table(world: str, rows: list[dict[str, Any]]) -> str:
    def batch(value: float | None) -> str:
        return "none" if value is None else f"{value:.0f}"

    header = (
        f"{'trace':<22}{'policy':>8}{'oracle':>8}{'on@3':>7}{'off':>6}{'ratio':>8}"
        f"{'slower':>8}{'tog/h':>7}{'probe':>7}{'BE world':>10}{'BE learned':>12}"
    )
    lines = [f"world: {world}", header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row['trace']:<22}{row['policy_speedup']:>8.3f}{row['oracle_speedup']:>8.3f}"
            f"{row['always_on_speedup']:>7.3f}{row['always_off_speedup']:>6.2f}{row['ratio_to_oracle']:>8.3f}"
            f"{row['slowdown_time_fraction']:>8.1%}{row['toggles_per_hour']:>7.1f}"
            f"{row['probe_cost_fraction']:>7.1%}"
            f"{batch(row['world_break_even_batch']):>10}{batch(row['learned_break_even_batch']):>12}"
        )
    return "\n".join(lines)


def run(
    traces: dict[str, Path],
    setup: ModelSetup,
    seed: int,
    world: World | None = None,
    policy: str = "roofline",
    lengths_out: Path | None = None,
) -> list[dict[str, Any]]:
    """Replay every trace; with `lengths_out`, also write each interval's length and probe flag."""
    config = default_config(setup)
    rows = []
    for name, path in traces.items():
        trace = load_trace(path)
        replayed = replay_lengths(trace, setup, config, seed=seed, world=world, policy=policy)
        rows.append({"trace": name, **replayed.result})
        if lengths_out is not None:
            _write_lengths(lengths_out, trace, replayed)
    return rows


def _write_lengths(path: Path, trace: list[TracePoint], replayed: Replayed) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_seconds", "num_draft_tokens", "probe"])
        for point, length, probe in zip(trace, replayed.lengths, replayed.probes, strict=True):
            writer.writerow([f"{point.t_seconds:g}", length, int(probe)])


def worlds_from(names: list[str], setup: ModelSetup) -> list[World]:
    """`--world` values: builtin profile names or files; `all` is every builtin plus the roofline."""
    worlds: list[World] = []
    for name in names:
        if name == "all":
            worlds.append(World("roofline", setup))
            worlds.extend(World(n, setup, profiles.load_builtin(n)) for n in profiles.list_builtin())
        elif name == "roofline":
            worlds.append(World("roofline", setup))
        else:
            profile = profiles.resolve(name)
            worlds.append(World(profile.name, setup, profile))
    return worlds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="specops bench policy",
        description="Replay load traces through the speculation policy, an oracle and simple rules.",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        help="trace CSV (t_seconds,batch,alpha[,context_tokens]); default: every shipped trace",
    )
    parser.add_argument(
        "--world",
        action="append",
        metavar="NAME|FILE",
        help="replay in a world whose true speedup is this serving profile (builtin name or JSON file; "
        "'roofline' = the prior itself; 'all' = every builtin and the roofline); repeatable",
    )
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        default="roofline",
        help="the policy under test: the roofline policy, or the calibrated one that learns the world",
    )
    parser.add_argument(
        "--lengths-out",
        type=Path,
        metavar="CSV",
        help="with --trace: write t_seconds,num_draft_tokens,probe per interval",
    )
    parser.add_argument("--json", dest="json_path", help="write results as JSON to PATH ('-' for stdout)")
    parser.add_argument("--gpu", choices=sorted(GPUS), default="H100")
    parser.add_argument("--tensor-parallel", type=int, default=1)
    parser.add_argument("--target-params", type=float, default=70e9)
    parser.add_argument("--draft-params", type=float, default=7e9)
    parser.add_argument("--seed", type=int, default=0, help="seed of the measurement noise")
    args = parser.parse_args(argv)
    if args.lengths_out is not None and (args.trace is None or (args.world and len(args.world) > 1)):
        parser.error("--lengths-out needs --trace and at most one --world")

    setup = ModelSetup(
        GPUS[args.gpu], args.target_params, args.draft_params, tensor_parallel=args.tensor_parallel
    )
    traces = {args.trace.stem: args.trace} if args.trace else shipped_traces()
    described: dict[str, Any] = {
        "benchmark": "policy",
        "gpu": args.gpu,
        "tensor_parallel": args.tensor_parallel,
        "target_params": args.target_params,
        "draft_params": args.draft_params,
        "seed": args.seed,
        "batch_noise_sigma": BATCH_NOISE_SIGMA,
        "alpha_noise_sigma": ALPHA_NOISE_SIGMA,
        "policy": args.policy,
    }
    table_out = sys.stderr if args.json_path == "-" else sys.stdout
    result: dict[str, Any]
    if not args.world:
        rows = run(traces, setup, args.seed, policy=args.policy, lengths_out=args.lengths_out)
        print(_format_table(rows), file=table_out)
        result = {**described, **rows[0]} if args.trace else {**described, "traces": rows}
        write_json(result, args.json_path)
        return 0

    try:
        worlds = worlds_from(args.world, setup)
    except (KeyError, FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    described["tpot_noise_sigma"] = TPOT_NOISE_SIGMA
    per_world: list[dict[str, Any]] = []
    for world in worlds:
        rows = run(traces, setup, args.seed, world, policy=args.policy, lengths_out=args.lengths_out)
        print(_format_world_table(world.name, rows), file=table_out)
        per_world.append({"world": world.name, "traces": rows})
    if len(per_world) == 1:
        only = per_world[0]
        result = {**described, "world": only["world"], **(only["traces"][0] if args.trace else only)}
    else:
        result = {**described, "worlds": per_world}
    write_json(result, args.json_path)
    return 0


def worlds_main(argv: list[str]) -> int:
    """The calibrated policy in every shipped world and the roofline, over the shipped traces."""
    return main(["--world", "all", "--policy", "calibrated", *argv])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
