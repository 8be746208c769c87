"""`specops bench policy`: replay load traces through the operator's control loop and its alternatives.

A trace is a CSV with header `t_seconds,batch,alpha` (optional `context_tokens`): the true
mean running requests per pod and per-token acceptance over each interval. Each interval is
one scrape-and-decide period. The realised speedup of an interval is the world's speedup at
the true alpha and batch for the draft length in force; results are time-weighted means.

What each strategy sees:
- the operator: its own control loop, `services.control.ControlLoop.tick` (`policy.decide`,
  calibration from `domain.learning` / `domain.calibration`, the measured-slowdown guard,
  probes), one tick per interval on a simulated clock, against in-memory pods
  (`SimulatedPods`: its metrics source and model control). The resource is a
  SpeculativeDeployment with the spec's defaults and the prior from the flags; it starts in
  the Dynamic phase (baseline and soak done) at the initial length. At interval i it reads the
  measurement of interval i-1 (one scrape of delay, spanning that interval) with noise:
  batch x (1 + N(0, 0.05)), alpha + N(0, 0.02) while speculating (none while off), p50 TPOT
  from the world x (1 + N(0, 0.03)). The operator reads no context length (a trace's
  `context_tokens` reaches only the world). `--policy roofline` is the same loop with
  `calibration.enabled: false` (the bare prior: no samples, probes or guard);
- oracle: the best length in {0} U [1, 8] for the true batch and alpha of each interval;
- always-on: the initial length throughout (`ALWAYS_ON_LENGTH` = 3 in a world); always-off:
  1.0 by definition;
- threshold rule: the folklore controller, draft length +1 when the measured acceptance rate
  (accepted / drafted, what engines export) was above 0.7, -1 below 0.4, clamped to
  [1, 8], never off; it sees the same delayed, noisy measurements.

Worlds (`--world NAME|FILE`, repeatable, or `--world all`): the true speedup and TPOT of an
interval come from a serving profile (`specops.profiles`) instead of the roofline, hidden from
the operator. A profile with an alpha shifts the trace's acceptance so that its mean is the
profile's (drift and noise kept). The result adds the share of time slower than plain
(`slowdown_time_fraction`, realised speedup < 0.98), the world's and the prior's break-even
batch (no length in 1..8 beats plain at the trace's mean alpha; null when none up to 1024) and
the operator's learned one (status.speculation.calibration.breakEvenBatch at the end).
Probe intervals are reported apart (`probe_cost_fraction`) and do not count as toggles.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import os
import random
import sys
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from specops import profiles
from specops.api.models import SpeculativeDeployment
from specops.api.status import CalibrationStatus, SpeculationStatus, SpeculativeDeploymentStatus
from specops.cli_output import write_json
from specops.domain.acceptance import acceptance_rate_from_alpha
from specops.domain.discovery import PodEndpoint
from specops.domain.metrics import REASON_PENDING, Measurement
from specops.domain.names import STABLE
from specops.domain.perf import GPUS, ModelSetup, best_length_break_even_batch, per_token_latency, speedup
from specops.domain.policy import Observation
from specops.domain.profile import ServingProfile
from specops.ports import ApplyResult, BlsSettings, FleetResult, GenerateResult
from specops.services.control import ControlLoop

BATCH_NOISE_SIGMA = 0.05  # relative: a rate() over one scrape window of a running-requests gauge
ALPHA_NOISE_SIGMA = 0.02  # absolute: accepted/drafted counters over one window at ~1e4 drafted tokens
TPOT_NOISE_SIGMA = 0.03  # relative: a p50 from one scrape window of the per-token latency histogram
SLOWDOWN_BELOW = 0.98  # an interval counts as slower than plain below this realised speedup
ALWAYS_ON_LENGTH = 3  # the fixed length "leave speculation on" is compared at in a world
MAX_BREAK_EVEN_BATCH = 1024
POLICIES = ("calibrated", "roofline")
# Decisions that moved the draft length while speculating: each is an Event, a status write and a
# settings reload on every pod, so a length that steps with the noise costs the fleet.
LENGTH_STEP_REASONS = frozenset({"DraftLengthIncreased", "DraftLengthDecreased"})
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


def bench_resource(
    setup: ModelSetup, interval_s: float, *, calibrated: bool, initial_length: int = 4
) -> SpeculativeDeployment:
    """The SpeculativeDeployment the replayed operator controls: the prior as the flags give it,
    the spec's defaults otherwise (lengths 1..8 from 4, batchGuard, exploration), calibration
    on or off."""
    gpus = {gpu: name for name, gpu in GPUS.items()}
    body: dict[str, Any] = {
        "apiVersion": "specops.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": "bench", "namespace": "bench", "uid": "bench"},
        "spec": {
            "target": {
                "model": "target",
                "version": "1",
                "parameters": f"{setup.target_params / 1e9:g}B",
                "engine": {"uri": "pvc://engines/target", "maxDraftLen": 8},
            },
            "draft": {
                "model": "draft",
                "version": "1",
                "kind": "standalone",
                "parameters": f"{setup.draft_params / 1e9:g}B",
                "engine": {"uri": "pvc://engines/draft"},
            },
            "serving": {
                "image": "tritonserver:bench",
                "replicas": 1,
                "gpu": {"type": gpus[setup.gpu], "count": setup.tensor_parallel},
                "tensorParallel": setup.tensor_parallel,
            },
            "speculation": {
                "draftLength": {"initial": initial_length, "min": 1, "max": 8},
                "calibration": {"enabled": calibrated},
            },
            "metrics": {"interval": f"{interval_s:g}s"},
        },
    }
    return SpeculativeDeployment.model_validate(body)


def replay(
    trace: list[TracePoint],
    setup: ModelSetup,
    seed: int = 0,
    batch_noise_sigma: float = BATCH_NOISE_SIGMA,
    alpha_noise_sigma: float = ALPHA_NOISE_SIGMA,
    world: World | None = None,
    policy: str = "calibrated",
    replicas: int = 1,
) -> dict[str, float | None]:
    """Mean speedups of the operator and the reference strategies over one trace (see `replay_lengths`)."""
    return replay_lengths(
        trace,
        setup,
        seed,
        batch_noise_sigma,
        alpha_noise_sigma,
        world=world,
        policy=policy,
        replicas=replicas,
    ).result


@dataclass(frozen=True)
class Replayed:
    """A replay's results, and per interval the length each pod ran and whether it was a probe."""

    result: dict[str, float | None]
    lengths: list[list[int]]  # per interval, one length per pod
    probes: list[bool]
    reasons: list[str]  # per interval, the operator's reason (status.speculation.reason)


class SimulatedPods:
    """The operator's view of the world (its MetricsSource and ModelControl ports), in memory.

    `lookup` answers with the measurement the replay staged for this tick; `apply_*` record
    what each pod was told to run, which is what the world then serves.
    """

    def __init__(self, endpoints: Sequence[PodEndpoint], initial_length: int) -> None:
        self.lengths = {e.name: initial_length for e in endpoints}
        self.measurement: Measurement | None = None

    # MetricsSource
    def register(self, key: Hashable, url: str, backend: str, interval_s: float) -> None:
        pass

    def unregister(self, key: Hashable) -> None:
        pass

    def lookup(
        self,
        url: str,
        backend: str,
        namespace: str,
        name: str,
        variant: str,
        now: datetime,
        draft_length: int | None = None,
        draft: str | None = None,
    ) -> Measurement:
        if self.measurement is None:
            return Measurement.failed(now, REASON_PENDING, "no scrape yet")
        return self.measurement

    async def close(self) -> None:
        pass

    # ModelControl (what the control loop calls)
    async def apply_bls_settings(
        self,
        endpoint: PodEndpoint,
        *,
        num_draft_tokens: int | None = None,
        draft_model_name: str | None = None,
    ) -> ApplyResult:
        changed = num_draft_tokens is not None and self.lengths.get(endpoint.name) != num_draft_tokens
        if num_draft_tokens is not None:
            self.lengths[endpoint.name] = num_draft_tokens
        return ApplyResult(pod=endpoint.name, ok=True, changed=changed)

    async def read_bls_settings(self, endpoint: PodEndpoint) -> ApplyResult:
        length = self.lengths.get(endpoint.name)
        return ApplyResult(pod=endpoint.name, ok=True, settings=BlsSettings(length, None))

    async def load_model(
        self, endpoint: PodEndpoint, name: str, config: Mapping[str, object] | None = None
    ) -> ApplyResult:
        return ApplyResult(pod=endpoint.name, ok=True)

    async def unload_model(self, endpoint: PodEndpoint, name: str) -> ApplyResult:
        return ApplyResult(pod=endpoint.name, ok=True)

    async def is_ready(self, endpoint: PodEndpoint, model: str | None = None) -> bool:
        return True

    async def generate(
        self, endpoint: PodEndpoint, prompt: str, max_tokens: int, num_draft_tokens: int | None = None
    ) -> GenerateResult:
        return GenerateResult(pod=endpoint.name, ok=False, message="the bench serves no tokens")

    async def apply_to_all(
        self,
        endpoints: Sequence[PodEndpoint],
        *,
        num_draft_tokens: int | None = None,
        draft_model_name: str | None = None,
        retries: int = 2,
        backoff_s: float = 0.2,
    ) -> FleetResult:
        results = [await self.apply_bls_settings(e, num_draft_tokens=num_draft_tokens) for e in endpoints]
        changed = sum(1 for r in results if r.changed)
        return FleetResult(desired=len(endpoints), applied=len(endpoints), changed=changed, results=results)


def replay_lengths(
    trace: list[TracePoint],
    setup: ModelSetup,
    seed: int = 0,
    batch_noise_sigma: float = BATCH_NOISE_SIGMA,
    alpha_noise_sigma: float = ALPHA_NOISE_SIGMA,
    world: World | None = None,
    policy: str = "calibrated",
    replicas: int = 1,
    rest_limit: int = 0,
) -> Replayed:
    """Mean speedups of the operator and the reference strategies over one trace.

    The operator is the real control loop (`services.control.ControlLoop.tick`: `policy.decide`,
    learning, the slowdown guard and probes), ticking once per interval on a simulated clock
    against in-memory pods. `policy` is "calibrated" (the spec's defaults) or "roofline"
    (`calibration.enabled: false`: the bare roofline, no samples, probes or guard).
    Without a world the trace is replayed in the roofline of `setup` and always-on runs at the
    initial length; with one, in that world at `ALWAYS_ON_LENGTH`.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    return asyncio.run(
        _replay(
            trace,
            setup,
            seed,
            batch_noise_sigma,
            alpha_noise_sigma,
            world,
            policy,
            max(1, replicas),
            max(0, rest_limit),
        )
    )


async def _replay(
    trace: list[TracePoint],
    setup: ModelSetup,
    seed: int,
    batch_noise_sigma: float,
    alpha_noise_sigma: float,
    world: World | None,
    policy: str,
    replicas: int,
    rest_limit: int = 0,
) -> Replayed:
    in_world = world is not None
    truth = world if world is not None else World("roofline", setup)
    trace = truth.adapt(trace)
    rng = random.Random(seed)
    batch_noise = [rng.gauss(0.0, batch_noise_sigma) for _ in trace]
    alpha_noise = [rng.gauss(0.0, alpha_noise_sigma) for _ in trace]
    tpot_noise = [rng.gauss(0.0, TPOT_NOISE_SIGMA) for _ in trace]
    weights = _interval_weights(trace)
    interval_s = trace[1].t_seconds - trace[0].t_seconds
    resource = bench_resource(setup, interval_s, calibrated=policy == "calibrated")
    lo, hi, initial = 1, 8, resource.spec.speculation.draft_length.initial
    always_on = min(hi, max(lo, ALWAYS_ON_LENGTH)) if in_world else initial
    endpoints = [PodEndpoint(f"pod{k}", "bench", "127.0.0.1", 8000 + k, STABLE) for k in range(replicas)]
    pods = SimulatedPods(endpoints, initial)
    # One measurement spans one interval (the noise above is that of one scrape window).
    loop = ControlLoop(pods, pods, rate_window_s=interval_s)

    def measured(i: int, lengths: Sequence[int], now: datetime) -> Measurement:
        """Interval i as the operator reads it: the pods' mean, with the issue's noise."""
        point = trace[i]
        on = [g for g in lengths if g > 0]
        alpha = min(1.0, max(0.0, point.alpha + alpha_noise[i])) if on else None
        tpot = sum(truth.tpot_s(point, g) for g in lengths) / len(lengths)
        return Measurement(
            phase="Ok",
            at=now,
            alpha=alpha,
            batch=max(0.0, point.batch * (1.0 + batch_noise[i])),
            tpot_p50_s=tpot * (1.0 + tpot_noise[i]),
            pods_reporting=len(lengths),
        )

    def observed(i: int, length: int) -> Observation:
        m = measured(i, [length], EPOCH)
        return Observation(batch=m.batch or 0.0, alpha=m.alpha, tpot_p50_s=m.tpot_p50_s)

    def realised(i: int, length: int) -> float:
        return truth.speedup(trace[i], length)

    start = EPOCH + timedelta(seconds=trace[0].t_seconds)
    first = measured(0, [initial], start)
    # Baseline and soak are done: the operator starts in the Dynamic phase at the initial length.
    status = SpeculativeDeploymentStatus(
        phase="Dynamic",
        speculation=SpeculationStatus(
            state="on",
            draft_length=initial,
            tuned_length=initial,
            control_phase="Dynamic",
            phase_since=start,
            smoothed_alpha=first.alpha,
            calibration=CalibrationStatus(applied_length=initial, applied_since=start),
        ),
    )
    policy_lengths = [[initial] * replicas]
    probes = [False]
    reasons = [""]
    choices = [True]  # the operator's own on/off choice, probes aside
    threshold_lengths = [initial]
    rested = 0
    rests = [False]
    for i in range(1, len(trace)):
        now = EPOCH + timedelta(seconds=trace[i].t_seconds)
        pods.measurement = measured(i - 1, policy_lengths[-1], now)  # one scrape late
        if rested < rest_limit and loop.rest(resource, endpoints, now) is not None:
            rested += 1  # at rest, as a fleet's tick is (services.tick.SETTLED_DECISIONS_PER_S)
            reason = ""
            rests.append(True)
        else:
            rested = 0
            tick = await loop.tick(resource, status, endpoints, now, draft_stale=False)
            status = tick.status
            reason = status.speculation.reason or ""
            rests.append(False)
        policy_lengths.append([pods.lengths[e.name] for e in endpoints])
        probes.append(status.speculation.calibration.probing)
        reasons.append(reason)
        choices.append(status.speculation.state == "on")
        threshold_lengths.append(
            _threshold_step(observed(i - 1, threshold_lengths[-1]), threshold_lengths[-1], lo, hi)
        )

    def mean(values: Iterable[float]) -> float:
        return sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)

    policy_speedups = [
        sum(realised(i, g) for g in lengths) / len(lengths) for i, lengths in enumerate(policy_lengths)
    ]
    policy_mean = mean(policy_speedups)
    oracle = mean(max([1.0, *(realised(i, g) for g in range(lo, hi + 1))]) for i in range(len(trace)))
    toggles = sum(1 for a, b in itertools.pairwise(choices) if a != b)
    length_steps = sum(1 for reason in reasons if reason in LENGTH_STEP_REASONS)
    hours = sum(weights) / 3600.0
    off_share = [sum(1 for g in lengths if g == 0) / len(lengths) for lengths in policy_lengths]
    result: dict[str, float | None] = {
        "policy_speedup": policy_mean,
        "oracle_speedup": oracle,
        "always_on_speedup": mean(realised(i, always_on) for i in range(len(trace))),
        "always_off_speedup": 1.0,
        "threshold_rule_speedup": mean(realised(i, g) for i, g in enumerate(threshold_lengths)),
        "ratio_to_oracle": policy_mean / oracle,
        "toggles_per_hour": toggles / hours,
        "length_steps_per_hour": length_steps / hours,
        "slowdown_time_fraction": mean(1.0 if v < SLOWDOWN_BELOW else 0.0 for v in policy_speedups),
        "intervals": float(len(trace)),
        "hours": hours,
        "policy_time_off_fraction": mean(off_share),
        "probe_cost_fraction": mean(1.0 if p else 0.0 for p in probes),
        "rested_fraction": mean(1.0 if r else 0.0 for r in rests),
    }
    if in_world:
        mean_alpha = sum(p.alpha for p in trace) / len(trace)
        prior = World("prior", setup)
        learned = status.speculation.calibration
        result["always_on_length"] = float(always_on)
        result["world_break_even_batch"] = _optional(truth.break_even_batch(mean_alpha, hi))
        result["prior_break_even_batch"] = _optional(prior.break_even_batch(mean_alpha, hi))
        result["learned_break_even_batch"] = _optional(learned.break_even_batch)
    return Replayed(result, policy_lengths, probes, reasons)


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
    policy: str = "calibrated",
    lengths_out: Path | None = None,
    replicas: int = 1,
    rest_limit: int = 0,
) -> list[dict[str, Any]]:
    """Replay every trace; with `lengths_out`, also write each interval's length(s) and probe flag."""
    rows = []
    for name, path in traces.items():
        trace = load_trace(path)
        replayed = replay_lengths(
            trace, setup, seed=seed, world=world, policy=policy, replicas=replicas, rest_limit=rest_limit
        )
        rows.append({"trace": name, **replayed.result})
        if lengths_out is not None:
            _write_lengths(lengths_out, trace, replayed)
    return rows


def _write_lengths(path: Path, trace: list[TracePoint], replayed: Replayed) -> None:
    """One replica: t_seconds,num_draft_tokens,probe; several: t_seconds,pod0,pod1,...,probe."""
    replicas = len(replayed.lengths[0])
    columns = ["num_draft_tokens"] if replicas == 1 else [f"pod{k}" for k in range(replicas)]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_seconds", *columns, "probe"])
        for point, lengths, probe in zip(trace, replayed.lengths, replayed.probes, strict=True):
            writer.writerow([f"{point.t_seconds:g}", *lengths, int(probe)])


def _add_rest_limit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rest-limit",
        type=int,
        default=0,
        metavar="N",
        help="rest up to N ticks in a row while the last decision is steady and the policy decides the "
        "same, as the operator does at fleet scale (services.tick.SETTLED_DECISIONS_PER_S: 53 at 2,000 "
        "resources and 15 s); default 0, a decision every interval",
    )


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
        description="Replay load traces through the operator's control loop, an oracle and simple rules.",
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
        default="calibrated",
        help="the operator as the spec sets it by default (calibrated: it learns the world), or with "
        "calibration.enabled: false (roofline: the bare prior)",
    )
    parser.add_argument(
        "--replicas", type=int, default=1, help="serving pods, each at the trace's batch (default 1)"
    )
    _add_rest_limit(parser)
    parser.add_argument(
        "--lengths-out",
        type=Path,
        metavar="CSV",
        help="with --trace: write t_seconds,num_draft_tokens,probe per interval "
        "(several replicas: t_seconds,pod0,pod1,...,probe)",
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
        "replicas": args.replicas,
        "rest_limit": args.rest_limit,
    }
    table_out = sys.stderr if args.json_path == "-" else sys.stdout
    result: dict[str, Any]
    if not args.world:
        rows = run(
            traces,
            setup,
            args.seed,
            policy=args.policy,
            lengths_out=args.lengths_out,
            replicas=args.replicas,
            rest_limit=args.rest_limit,
        )
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
        rows = run(
            traces,
            setup,
            args.seed,
            world,
            args.policy,
            lengths_out=args.lengths_out,
            replicas=args.replicas,
            rest_limit=args.rest_limit,
        )
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
    """Before and after: the operator with calibration off (the roofline) and on (its defaults), in
    every shipped world and the roofline, over the shipped traces; prints one table of both."""
    parser = argparse.ArgumentParser(
        prog="specops bench policy-worlds",
        description="The operator with and without calibration in every shipped world, over the shipped traces.",
    )
    parser.add_argument("--json", dest="json_path", help="write results as JSON to PATH ('-' for stdout)")
    parser.add_argument(
        "--seeds",
        default=os.environ.get("SPECOPS_POLICY_SEEDS", "0,1,2"),
        metavar="N,...",
        help="seeds of the measurement noise; each pair's figures are the mean over them, with the worst "
        "seed beside (default 0,1,2; also $SPECOPS_POLICY_SEEDS): one seed is one draw of the noise",
    )
    parser.add_argument("--seed", type=int, help="one seed only (same as --seeds N)")
    _add_rest_limit(parser)
    parser.add_argument(
        "--traces",
        default=os.environ.get("SPECOPS_POLICY_TRACES", ""),
        metavar="NAME,...",
        help="only these shipped traces (default: all; also $SPECOPS_POLICY_TRACES)",
    )
    args = parser.parse_args(argv)
    try:
        seeds = [args.seed] if args.seed is not None else [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds takes integers separated by commas, not {args.seeds!r}")
    if not seeds:
        parser.error("--seeds names no seed")
    setup = ModelSetup(GPUS["H100"], 70e9, 7e9)
    traces = shipped_traces()
    if args.traces:
        wanted = set(args.traces.split(","))
        traces = {name: path for name, path in traces.items() if name in wanted}
        if not traces:
            parser.error(f"no shipped trace among {args.traces!r}")
    worlds = worlds_from(["all"], setup)
    policies: dict[str, Any] = {}
    for policy in ("roofline", "calibrated"):
        by_seed = [
            [
                {
                    "world": world.name,
                    "traces": run(traces, setup, seed, world, policy, rest_limit=args.rest_limit),
                }
                for world in worlds
            ]
            for seed in seeds
        ]
        per_world = by_seed[0] if len(seeds) == 1 else combine_seeds(by_seed)
        policies[policy] = {"worlds": per_world, "summary": summarise(per_world)}
        if len(seeds) > 1:
            policies[policy]["by_seed"] = {
                str(seed): {"worlds": runs, "summary": summarise(runs)}
                for seed, runs in zip(seeds, by_seed, strict=True)
            }
    table_out = sys.stderr if args.json_path == "-" else sys.stdout
    print(
        format_before_after(policies["roofline"]["worlds"], policies["calibrated"]["worlds"]), file=table_out
    )
    result = {
        "benchmark": "policy-worlds",
        "gpu": "H100",
        "target_params": 70e9,
        "draft_params": 7e9,
        "seed": seeds[0],
        "seeds": seeds,
        "rest_limit": args.rest_limit,
        "batch_noise_sigma": BATCH_NOISE_SIGMA,
        "alpha_noise_sigma": ALPHA_NOISE_SIGMA,
        "tpot_noise_sigma": TPOT_NOISE_SIGMA,
        "policies": policies,
    }
    write_json(result, args.json_path)
    return 0


WORST_OF_SEEDS = {
    "ratio_to_oracle": min,
    "slowdown_time_fraction": max,
    "toggles_per_hour": max,
    "length_steps_per_hour": max,
    "probe_cost_fraction": max,
}
"""The figures a target bounds, and which end of the seeds is the worst for each."""


def combine_seeds(by_seed: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One table from several seeds' tables (same worlds and traces): each number is the mean over
    the seeds (a figure missing in any seed keeps the first seed's), and for every bounded figure
    the worst seed's value beside it as `<key>_worst_seed`."""
    combined: list[dict[str, Any]] = []
    for worlds in zip(*by_seed, strict=True):
        rows: list[dict[str, Any]] = []
        for same_pair in zip(*(world["traces"] for world in worlds), strict=True):
            row = dict(same_pair[0])
            for key, value in same_pair[0].items():
                values = [r.get(key) for r in same_pair]
                if isinstance(value, int | float) and all(isinstance(v, int | float) for v in values):
                    row[key] = sum(values) / len(values)
            for key, worst in WORST_OF_SEEDS.items():
                row[f"{key}_worst_seed"] = worst(float(r[key]) for r in same_pair)
            rows.append(row)
        combined.append({"world": worlds[0]["world"], "traces": rows})
    return combined


def summarise(per_world: list[dict[str, Any]]) -> dict[str, float]:
    """Means and extremes over every world x trace pair: what the targets are stated in. Over
    several seeds the pairs are the seeds' means, and `*_any_seed` the worst single draw."""
    rows = [row for world in per_world for row in world["traces"]]

    def values(key: str) -> list[float]:
        return [float(row[key]) for row in rows]

    summary = {
        "pairs": float(len(rows)),
        "mean_ratio_to_oracle": sum(values("ratio_to_oracle")) / len(rows),
        "min_ratio_to_oracle": min(values("ratio_to_oracle")),
        "mean_slowdown_time_fraction": sum(values("slowdown_time_fraction")) / len(rows),
        "max_slowdown_time_fraction": max(values("slowdown_time_fraction")),
        "max_toggles_per_hour": max(values("toggles_per_hour")),
        "mean_length_steps_per_hour": sum(values("length_steps_per_hour")) / len(rows),
        "max_length_steps_per_hour": max(values("length_steps_per_hour")),
        "max_probe_cost_fraction": max(values("probe_cost_fraction")),
        "mean_rested_fraction": sum(values("rested_fraction")) / len(rows),
    }
    if rows and "ratio_to_oracle_worst_seed" in rows[0]:
        summary["min_ratio_to_oracle_any_seed"] = min(values("ratio_to_oracle_worst_seed"))
        summary["max_slowdown_time_fraction_any_seed"] = max(values("slowdown_time_fraction_worst_seed"))
        summary["max_toggles_per_hour_any_seed"] = max(values("toggles_per_hour_worst_seed"))
        summary["max_probe_cost_fraction_any_seed"] = max(values("probe_cost_fraction_worst_seed"))
    return summary


def format_before_after(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    """One Markdown table: world x trace, roofline (before) / calibrated (after) side by side."""

    def batch(value: float | None) -> str:
        return "none" if value is None else f"{value:.0f}"

    lines = [
        "| world | trace | ratio before / after | slower before / after | toggles/h before / after "
        "| length steps/h after | probe cost | break-even world / learned |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for world_before, world_after in zip(before, after, strict=True):
        for b, a in zip(world_before["traces"], world_after["traces"], strict=True):
            worst_ratio = worst_slower = ""
            if "ratio_to_oracle_worst_seed" in a:  # several seeds: means, and the worst seed after
                worst_ratio = f" ({a['ratio_to_oracle_worst_seed']:.3f})"
                worst_slower = f" ({a['slowdown_time_fraction_worst_seed']:.1%})"
            lines.append(
                f"| {world_after['world']} | {a['trace']} "
                f"| {b['ratio_to_oracle']:.3f} / {a['ratio_to_oracle']:.3f}{worst_ratio} "
                f"| {b['slowdown_time_fraction']:.1%} / {a['slowdown_time_fraction']:.1%}{worst_slower} "
                f"| {b['toggles_per_hour']:.1f} / {a['toggles_per_hour']:.1f} "
                f"| {a['length_steps_per_hour']:.1f} "
                f"| {a['probe_cost_fraction']:.1%} "
                f"| {batch(a['world_break_even_batch'])} / {batch(a['learned_break_even_batch'])} |"
            )
    for name, per_world in (("before (roofline)", before), ("after (calibrated)", after)):
        m = summarise(per_world)
        lines.append(
            f"\n{name}: mean ratio {m['mean_ratio_to_oracle']:.3f} (worst {m['min_ratio_to_oracle']:.3f}), "
            f"slower than plain {m['mean_slowdown_time_fraction']:.1%} of the time on average "
            f"(worst {m['max_slowdown_time_fraction']:.1%}), toggles/h at most {m['max_toggles_per_hour']:.1f}, "
            f"length steps/h {m['mean_length_steps_per_hour']:.1f} on average (at most "
            f"{m['max_length_steps_per_hour']:.1f}), probe cost at most {m['max_probe_cost_fraction']:.1%}, "
            f"at rest {m['mean_rested_fraction']:.1%} of the intervals on average"
        )
        if "min_ratio_to_oracle_any_seed" in m:
            lines.append(
                f"  the worst single seed of any pair: ratio {m['min_ratio_to_oracle_any_seed']:.3f}, "
                f"slower {m['max_slowdown_time_fraction_any_seed']:.1%}, "
                f"toggles/h {m['max_toggles_per_hour_any_seed']:.1f}, "
                f"probe cost {m['max_probe_cost_fraction_any_seed']:.1%}"
            )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
