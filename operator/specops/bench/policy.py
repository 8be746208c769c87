"""`specops bench policy`: the operator's revision decisions replayed against a world it is never shown.

    specops bench policy --world FILE --trace FILE --backend B --replicas N --interval 15s
        [--gpu G --tensor-parallel T --target-params P --draft-params P] [--seed S]
        --timeline-out CSV --configs-out JSONL --json OUT
    specops bench policy --all [--replicas N] [--json OUT]

The contract (docs/benchmarks.md):

- **World**: a serving profile (docs/profiles.md); `roofline` tabulates the prior of the flags
  themselves. K=0 inside a speculating engine costs `k0_ms` (default `plain_ms`); a pod whose
  revision changes is down for `restart_s` (default 120 s).
- **Trace**: `t_seconds,batch,alpha`, one row per second (a coarser trace is held per second):
  `batch` is the running requests per replica with traffic split evenly over N replicas, so the
  fleet carries N x batch. Each second every serving pod carries its share of that load and its
  engine applies its revision's schedule at the batch it carries: the pods are behind an HTTPRoute,
  a plain holdback pod carries the weight the operator sets on its Service (every interval), the
  stable pods share the rest evenly, and a pod that is down leaves the split.
- **The operator** is production's decision: a SpeculativeDeployment built from the flags (the
  prior; the spec's defaults otherwise) gives the step's config, and `control_step.step`, the
  pure step `ControlLoop.tick` calls (learning from each pod's window, the fitted model, the
  revision step), decides every `--interval` on a snapshot of the pods and their readings. It
  sees, one scrape late (the window that ended one interval before the decision), per pod: batch
  x (1 + N(0, 0.05)), acceptance + N(0, 0.02) while drafting, mean per-token latency
  x (1 + N(0, 0.03)); the variant's measurement is their mean over the pods that served.
- **Rollout**: a new revision rolls pod by pod, one down at a time (maxUnavailable 1, no surge).
- **Speedup** of a second: the all-plain fleet's per-token latency at the trace's batch over the
  fleet's batch-weighted per-token latency; 0 when no pod serves. **Oracle**: the best of plain
  and K = 1..8 at the trace's batch and alpha, K=0 free, no restarts.

The reference rows run every pod on one revision for the whole trace, never restarted: plain,
K=3 at every batch, TensorRT-LLM's documented {4: 4, 8: 2, 32: 1}, and the best schedule for the
world's own curve at its alpha (per band of `revision_policy.BAND_EDGES`, the K with the best
speedup at the band's geometric middle, K=0 valued at plain / k0, K never growing with batch).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from specops import profiles
from specops.api.models import SpeculativeDeployment
from specops.api.status import SpeculativeDeploymentStatus
from specops.api.units import parse_duration
from specops.cli_output import write_json
from specops.domain import control_status, control_step, learning, revision_step
from specops.domain.discovery import PodEndpoint
from specops.domain.engines.schedule import PLAIN, Revision, Schedule
from specops.domain.metrics import REASON_PENDING, Measurement, PodMeasurement
from specops.domain.names import HOLDBACK, STABLE
from specops.domain.perf import GPUS, ModelSetup, expected_tokens
from specops.domain.profile import ServingProfile, profile_from_setup
from specops.domain.revision_policy import BAND_EDGES

BATCH_NOISE_SIGMA = 0.05
ALPHA_NOISE_SIGMA = 0.02
TPOT_NOISE_SIGMA = 0.03
SLOWDOWN_BELOW = 0.98
MAX_BREAK_EVEN_BATCH = 1024
MAX_LENGTH = 8
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
BACKENDS = ("triton", "trtllm-serve", "vllm", "sglang")
STATIC_K3 = Schedule.constant(3)
DOC_SCHEDULE = Schedule.of([[4, 4], [8, 2], [32, 1], [None, 0]])
"""TensorRT-LLM's documented draft_len_schedule example {4: 4, 8: 2, 32: 1}: K=0 above 32."""

RESULT_KEYS = (
    "policy_speedup",
    "oracle_speedup",
    "ratio_to_oracle",
    "slowdown_time_fraction",
    "restarts_per_pod_hour",
    "weight_changes_per_hour",
    "plain_speedup",
    "static_k3_speedup",
    "doc_schedule_speedup",
    "oracle_schedule_speedup",
    "holdback_cost_fraction",
    "learned_break_even_batch",
    "world_break_even_batch",
)
REFERENCES = ("plain", "static_k3", "doc_schedule", "oracle_schedule")


# ------------------------------------------------------------------ traces


@dataclass(frozen=True)
class TracePoint:
    t_seconds: float
    batch: float
    alpha: float


def parse_trace(lines: Iterable[str]) -> list[TracePoint]:
    """One point per second: a row holds until the next (traces coarser than 1 s are held)."""
    rows = [
        TracePoint(float(row["t_seconds"]), float(row["batch"]), float(row["alpha"]))
        for row in csv.DictReader(lines)
    ]
    if len(rows) < 2:
        raise ValueError("a trace needs at least two rows")
    points: list[TracePoint] = []
    for index, row in enumerate(rows):
        end = rows[index + 1].t_seconds if index + 1 < len(rows) else row.t_seconds + 1
        seconds = max(1, round(end - row.t_seconds))
        points.extend(TracePoint(row.t_seconds + s, row.batch, row.alpha) for s in range(seconds))
    return points


def load_trace(path: Path, limit_s: int | None = None) -> list[TracePoint]:
    with path.open(newline="") as handle:
        points = parse_trace(handle)
    return points if limit_s is None else points[:limit_s]


def shipped_traces() -> dict[str, Path]:
    """The traces packaged with specops, by name (file stem)."""
    folder = resources.files("specops.bench").joinpath("traces")
    return {
        Path(entry.name).stem: Path(str(entry))
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".csv")
    }


# ------------------------------------------------------------------ the world


@dataclass(frozen=True)
class World:
    """A serving profile as the truth of a deployment: per-token latency of a pod each second."""

    profile: ServingProfile
    flags: dict[str, Any] = field(default_factory=dict)
    """The flags a spec of this deployment would give (the profile's ``setup`` key): `--all` starts
    the operator's prior from them; never the world itself."""

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def restart_s(self) -> int:
        return round(self.profile.restart_seconds)

    def tpot_ms(self, revision: Revision, k: int, batch: float, alpha: float) -> float:
        """ms between a request's tokens on a pod running ``revision`` with K = ``k`` at ``batch``."""
        b = max(1.0, batch)
        if revision.mode == "plain":
            return self.profile.plain_ms_at(b)
        if k == 0:
            return self.profile.k0_ms_at(b)
        return self.profile.round_ms_at(k, b) / expected_tokens(alpha, k)

    def best_speedup(self, batch: float, alpha: float) -> float:
        """The oracle: the best of plain and K = 1..max at this batch and alpha (no K=0 cost)."""
        return max(1.0, self.profile.best_length(alpha, max(1.0, batch), MAX_LENGTH)[1])

    def best_schedule(self, alpha: float) -> Schedule:
        """The best schedule for this world's own curve at ``alpha`` (see the module docstring)."""
        bands: list[list[int | None]] = []
        ceiling, low = MAX_LENGTH, 1.0
        for edge in BAND_EDGES:
            batch = math.sqrt(low * edge)
            low = float(edge)
            plain = self.profile.plain_ms_at(batch)
            best_k, best = 0, plain / self.profile.k0_ms_at(batch)
            for k in range(1, min(ceiling, self.profile.max_length) + 1):
                speed = self.profile.speedup(alpha, k, batch)
                if speed > best or (not bands and best_k == 0):
                    best_k, best = k, speed
            bands.append([edge, best_k])
            ceiling = best_k
        bands[-1][0] = None
        return Schedule.of(bands)


def world_from(name: str, setup: ModelSetup) -> World:
    """A builtin profile name, a profile file, or ``roofline`` (the flags' own prior as the truth)."""
    if name == "roofline":
        return World(profile_from_setup("roofline", setup, max_length=MAX_LENGTH))
    profile = profiles.resolve(name)
    if name in profiles.list_builtin():
        text = resources.files("specops.profiles").joinpath(f"{name}.json").read_text()
    else:
        text = Path(name).read_text()
    flags = json.loads(text).get("setup") or {}
    return World(profile, dict(flags) if isinstance(flags, dict) else {})


def setup_of(world: World, default: ModelSetup, gpu: str) -> tuple[ModelSetup, str]:
    """The prior's setup for ``world`` in the table: its ``setup`` flags, else the command line's."""
    flags = world.flags
    if not flags:
        return default, gpu
    name = str(flags.get("gpu", gpu))
    setup = ModelSetup(
        GPUS[name],
        float(flags.get("target_params", default.target_params)),
        float(flags.get("draft_params", default.draft_params)),
        tensor_parallel=int(flags.get("tensor_parallel", default.tensor_parallel)),
    )
    return setup, name


# ------------------------------------------------------------------ the operator's resource


def bench_resource(
    setup: ModelSetup,
    backend: str,
    replicas: int,
    interval_s: float,
    gpu: str,
    speculation: dict[str, Any] | None = None,
) -> SpeculativeDeployment:
    """The SpeculativeDeployment the replayed operator serves: the prior as the flags give it, the
    spec's defaults otherwise (baseline, soak, minGain, minInterval, margin, draft lengths 1..8)."""
    body: dict[str, Any] = {
        "apiVersion": "specops.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": "bench", "namespace": "bench", "uid": "bench"},
        "spec": {
            "target": {
                "model": "target",
                "version": "1",
                "parameters": f"{setup.target_params / 1e9:g}B",
                "uri": "pvc://models/target",
            },
            "draft": {
                "model": "draft",
                "version": "1",
                "method": "draftModel",
                "parameters": f"{setup.draft_params / 1e9:g}B",
                "uri": "pvc://models/draft",
            },
            "serving": {
                "backend": backend,
                "replicas": replicas,
                # the replay's rollout: pod by pod, one down at a time, no spare GPUs to surge on
                "maxSurge": 0,
                "maxUnavailable": 1,
                "gpu": {"type": gpu, "count": setup.tensor_parallel},
                "tensorParallel": setup.tensor_parallel,
            },
            "metrics": {"interval": f"{interval_s:g}s"},
        },
    }
    if speculation:
        body["spec"]["speculation"] = speculation
    return SpeculativeDeployment.model_validate(body)


# ------------------------------------------------------------------ the replay


@dataclass
class Pod:
    revision: Revision
    ready_at: int = 0
    """The first second it serves (a restart makes it later)."""


@dataclass
class Second:
    """What one pod did in one second."""

    mode: str  # plain | spec | down
    k: int | None
    batch: float
    tpot_ms: float | None
    alpha: float | None  # the acceptance it drafted at (None unless K > 0)


@dataclass
class Run:
    """One replay: per second and pod what happened, the revisions, and the operator's end state."""

    world: World
    trace: list[TracePoint]
    replicas: int
    seconds: list[list[Second]] = field(default_factory=list)
    configs: list[list[str]] = field(default_factory=list)
    speedups: list[float] = field(default_factory=list)
    revisions: dict[str, Revision] = field(default_factory=dict)
    restarts: int = 0
    weight_changes: int = 0
    holdback_seconds: float = 0.0
    decisions: list[tuple[int, str, str]] = field(default_factory=list)
    learned_break_even: int | None = None


def _speedup(world: World, point: TracePoint, loads: Sequence[tuple[float, float]]) -> float:
    """Plain fleet's per-token latency at the trace's batch over the batch-weighted latency of ``loads``
    ((batch, tpot ms) per serving pod); 0 when nobody serves, 1 when there is no load."""
    if point.batch <= 0:
        return 1.0
    total = sum(b for b, _ in loads)
    if not loads or total <= 0:
        return 0.0
    mean_tpot = sum(b * t for b, t in loads) / total
    return world.profile.plain_ms_at(max(1.0, point.batch)) / mean_tpot


def fixed_speedup(world: World, trace: Sequence[TracePoint], schedule: Schedule | None) -> float:
    """Mean speedup of every pod on one revision for the whole trace (a reference row)."""
    revision = PLAIN if schedule is None else Revision("spec", "draftModel", "draft", schedule)
    total = 0.0
    for point in trace:
        k = schedule.k_at(point.batch) if schedule else 0
        total += _speedup(world, point, [(point.batch, world.tpot_ms(revision, k, point.batch, point.alpha))])
    return total / len(trace)


def hindsight_bound(run: Run) -> dict[str, float]:
    """What restarts alone cost: from the fleet the operator started with, every pod rolled at once
    (pod by pod, as a rollout goes) to the best fixed fleet in hindsight for this trace (plain, the
    best schedule for the world's curve at the trace's mean alpha, or K=3 everywhere; a pod already
    on it stays), with no time to learn and no change after. A policy that has to restart pods to
    leave its first fleet does no better on a trace it serves with one fleet throughout."""
    world, trace, replicas = run.world, run.trace, run.replicas
    first = [run.revisions[digest] for digest in run.configs[0]]
    # the draft and method the run speculated with (a one-pod fleet starts plain)
    model = next((r for r in (*first, *run.revisions.values()) if r.mode == "spec"), None)
    mean_alpha = sum(p.alpha for p in trace) / len(trace)
    candidates = [PLAIN]
    if model is not None:
        for schedule in (world.best_schedule(mean_alpha), STATIC_K3):
            candidates.append(Revision("spec", model.method, model.draft, schedule, model.engine_args))
    oracle = sum(world.best_speedup(p.batch, p.alpha) for p in trace) / len(trace)
    best: tuple[float, float, int] | None = None
    for target in candidates:
        speedups, restarts = _rolled(world, trace, first, target, replicas)
        mean = sum(speedups) / len(speedups)
        if best is None or mean > best[0]:
            best = (mean, sum(1 for x in speedups if x < SLOWDOWN_BELOW) / len(speedups), restarts)
    assert best is not None
    hours = len(trace) / 3600.0
    return {
        "ratio_to_oracle": round(best[0] / oracle, 4),
        "slowdown_time_fraction": round(best[1], 4),
        "restarts_per_pod_hour": round(best[2] / (replicas * hours), 3),
    }


def _rolled(
    world: World, trace: Sequence[TracePoint], first: Sequence[Revision], target: Revision, replicas: int
) -> tuple[list[float], int]:
    """Each second's speedup while ``first`` rolls to ``target`` from second 0, as ``replay`` rolls."""
    revisions, ready = list(first), [0] * replicas
    speedups: list[float] = []
    restarts = 0
    for s, point in enumerate(trace):
        if not any(r > s for r in ready):
            for i in range(replicas):
                if revisions[i] != target:
                    revisions[i], ready[i] = target, s + world.restart_s
                    restarts += 1
                    break
        serving = [i for i in range(replicas) if ready[i] <= s]
        shares = _shares(replicas * max(0.0, point.batch), serving, replicas, False, 0)
        loads = []
        for i in serving:
            revision, share = revisions[i], shares[i]
            k = revision.schedule.k_at(share) if revision.schedule else 0
            loads.append((share, world.tpot_ms(revision, k, share, point.alpha)))
        speedups.append(_speedup(world, point, loads))
    return speedups, restarts


def _window_measurement(
    run: Run, pods: Sequence[int], start: int, end: int, rng: random.Random
) -> tuple[float | None, float | None, float | None]:
    """The variant's (batch, alpha, mean per-token latency s) over seconds [start, end): per pod
    that served, noisy as the contract says; then their mean (latency weighted by batch)."""
    batches: list[float] = []
    alphas: list[float] = []
    tpots: list[tuple[float, float]] = []
    for i in pods:
        served = [run.seconds[s][i] for s in range(max(0, start), end) if run.seconds[s][i].mode != "down"]
        if not served:
            continue
        load = sum(x.batch for x in served)
        batch = load / len(served)
        batches.append(batch * (1 + rng.gauss(0.0, BATCH_NOISE_SIGMA)))
        if load > 0:
            tpot = sum(x.batch * (x.tpot_ms or 0.0) for x in served) / load
            tpots.append((batch, tpot * (1 + rng.gauss(0.0, TPOT_NOISE_SIGMA)) / 1e3))
        drafted = [x.alpha for x in served if x.alpha is not None]
        if drafted:
            alpha = sum(drafted) / len(drafted) + rng.gauss(0.0, ALPHA_NOISE_SIGMA)
            alphas.append(min(0.99, max(0.0, alpha)))
    if not batches:
        return None, None, None
    weight = sum(b for b, _ in tpots)
    tpot_s = sum(b * t for b, t in tpots) / weight if weight > 0 else None
    return (
        max(0.0, sum(batches) / len(batches)),
        sum(alphas) / len(alphas) if alphas else None,
        tpot_s,
    )


def _pod_readings(
    run: Run, pods: Sequence[Pod], window: range, alpha: float | None, rng: random.Random
) -> list[learning.PodReading]:
    """Each pod's own window (seconds it served on its revision), noisy as the contract says."""
    readings = []
    for i, pod in enumerate(pods):
        served = [
            run.seconds[t][i]
            for t in range(max(0, window.start), window.stop)
            if run.seconds[t][i].mode != "down" and run.configs[t][i] == pod.revision.digest
        ]
        if len(served) < len(window):
            continue  # down or on another revision for part of the window
        load = sum(x.batch for x in served)
        if load <= 0:
            continue
        batch = load / len(served) * (1 + rng.gauss(0.0, BATCH_NOISE_SIGMA))
        tpot = sum(x.batch * (x.tpot_ms or 0.0) for x in served) / load
        tpot_s = tpot * (1 + rng.gauss(0.0, TPOT_NOISE_SIGMA)) / 1e3
        drafted = alpha if pod.revision.mode == "spec" else None
        readings.append(learning.PodReading(f"pod-{i}", pod.revision, max(0.0, batch), tpot_s, drafted))
    return readings


def _per_pod(readings: Sequence[learning.PodReading], pods: Iterable[int]) -> dict[str, PodMeasurement]:
    """Each pod's own reading (every pod has series; one down or on another revision for part of
    the window reads no batch, as a pod without a whole window reads in its own rate)."""
    return {
        f"pod-{i}": next(
            (PodMeasurement(r.batch, r.tpot_s) for r in readings if r.pod == f"pod-{i}"), PodMeasurement()
        )
        for i in pods
    }


def _wanted(state: revision_step.StepState, pod: int, replicas: int) -> Revision:
    """The revision pod ``pod`` should run: the last pod is the plain holdback while one is held."""
    return PLAIN if state.holdback and pod == replicas - 1 else state.revision


def _shares(load: float, serving: Sequence[int], replicas: int, held: bool, weight: int) -> dict[int, float]:
    """Each serving pod's batch: the holdback pod (the last, while one is held) carries ``weight`` %
    of the fleet's ``load`` (the route's weight of its Service), the stable pods share the rest
    evenly; a variant with no pod serving leaves its share to the other (and so does a weight of 0)."""
    holdback = replicas - 1 if held and weight > 0 else None
    stable = [i for i in serving if i != holdback]
    plain = [i for i in serving if i == holdback]
    if not stable or not plain:
        each = round(load / len(serving), 3) if serving else 0.0
        return {i: each for i in serving}
    held_load = load * weight / 100.0
    return {
        **{i: round((load - held_load) / len(stable), 3) for i in stable},
        **{i: round(held_load / len(plain), 3) for i in plain},
    }


def replay(
    world: World,
    trace: Sequence[TracePoint],
    *,
    setup: ModelSetup,
    backend: str = "vllm",
    replicas: int = 4,
    interval_s: float = 15.0,
    gpu: str = "H100",
    seed: int = 0,
    speculation: dict[str, Any] | None = None,
) -> Run:
    """Replay ``trace`` in ``world`` with the operator's production step deciding every interval.
    ``speculation``: spec.speculation of the resource (its defaults when None)."""
    resource = bench_resource(setup, backend, replicas, interval_s, gpu, speculation)
    spec = resource.spec
    config = revision_step.config_from_spec(spec, spec.draft)
    learn = control_status.learning_config(spec, rate_window_s=interval_s)
    snapshot = control_step.Snapshot(
        uid="bench",
        config=config,
        learn=learn,
        status=SpeculativeDeploymentStatus(),
        measurement=Measurement.failed(EPOCH, REASON_PENDING, "no poll yet"),
        pods=(),
        replicas=replicas,
        weighted=True,
        min_acceptance=spec.slo.min_acceptance,
    )
    record, first = control_step.step(None, snapshot, EPOCH)  # the first revision, recorded
    snapshot = replace(snapshot, status=first.status or snapshot.status)
    run = Run(world, list(trace), replicas)
    rng = random.Random(seed)
    step_every = max(1, round(interval_s))
    restart_s = world.restart_s
    weight = 0  # the holdback's route weight in force (0: no holdback backend on the route)

    pods = [Pod(_wanted(record.decision, i, replicas)) for i in range(replicas)]
    run.revisions.update((pod.revision.digest, pod.revision) for pod in pods)
    for s, point in enumerate(trace):
        now = EPOCH + timedelta(seconds=s)
        if s % step_every == 0 and s > 0:
            window = range(s - 2 * step_every, s - step_every)
            # the stable variant as the operator reads it; a holdback pod is a variant of its own
            held = record.decision.holdback
            stable = range(replicas - 1) if held else range(replicas)
            batch, alpha, tpot_s = _window_measurement(run, stable, window.start, window.stop, rng)
            # each pod's own window, as the operator reads it per pod
            readings = _pod_readings(run, pods, window, alpha, rng)
            measurement = Measurement(
                phase="Ok",
                at=now,
                alpha=alpha,
                batch=batch,
                tpot_p50_s=tpot_s,
                per_pod=_per_pod(readings, stable),
            )
            plain = None
            if held:
                plain_batch, _, plain_tpot = _window_measurement(
                    run, [replicas - 1], window.start, window.stop, rng
                )
                plain = Measurement(
                    phase="Ok",
                    at=now,
                    batch=plain_batch,
                    tpot_p50_s=plain_tpot,
                    per_pod=_per_pod(readings, [replicas - 1]),
                )
            ready = [
                PodEndpoint(
                    f"pod-{i}",
                    "bench",
                    "127.0.0.1",
                    0,
                    HOLDBACK if held and i == replicas - 1 else STABLE,
                    revision=p.revision.digest,
                    start_s=float(restart_s),  # creation to Ready, as the pod's conditions tell
                )
                for i, p in enumerate(pods)
                if p.ready_at <= s
            ]
            snapshot = replace(
                snapshot,
                measurement=measurement,
                pods=tuple(p for p in ready if p.variant == STABLE),
                held=tuple(p for p in ready if p.variant == HOLDBACK),
                plain=plain,
            )
            record, actions = control_step.step(record, snapshot, now)
            if actions.weight is not None:  # the route carries it from now on
                record = record.weighted(actions.weight)
                if actions.weight != weight:
                    run.weight_changes += weight > 0 or actions.weight > 0
                    weight = actions.weight
            if actions.status is not None:
                snapshot = replace(snapshot, status=actions.status)
            if actions.roll_to is not None:
                decided = snapshot.status.speculation
                run.revisions[actions.roll_to.digest] = actions.roll_to
                run.decisions.append((s, decided.reason or "", decided.message or ""))
        # the rollout: one pod at a time, the next once the previous serves again
        if not any(p.ready_at > s for p in pods):
            for i, pod in enumerate(pods):
                wanted = _wanted(record.decision, i, replicas)
                if pod.revision != wanted:
                    run.revisions[wanted.digest] = wanted
                    pod.revision, pod.ready_at = wanted, s + restart_s
                    run.restarts += 1
                    break
        if record.decision.holdback and pods[-1].revision.mode == "plain" and pods[-1].ready_at <= s:
            run.holdback_seconds += 1
        serving = [i for i, p in enumerate(pods) if p.ready_at <= s]
        shares = _shares(
            replicas * max(0.0, point.batch), serving, replicas, record.decision.holdback, weight
        )
        row: list[Second] = []
        loads: list[tuple[float, float]] = []
        for i, pod in enumerate(pods):
            if i not in serving:
                row.append(Second("down", None, 0.0, None, None))
                continue
            share = shares[i]
            revision = pod.revision
            k = revision.schedule.k_at(share) if revision.schedule else 0
            tpot = world.tpot_ms(revision, k, share, point.alpha)
            if revision.mode == "spec":
                row.append(Second("spec", k, share, tpot, point.alpha if k > 0 else None))
            else:
                row.append(Second("plain", None, share, tpot, None))
            loads.append((share, tpot))
        run.seconds.append(row)
        run.configs.append([p.revision.digest for p in pods])
        run.speedups.append(_speedup(world, point, loads))

    shown = snapshot.status.speculation.calibration
    run.learned_break_even = shown.break_even_batch if learn.enabled and shown.break_even_known else None
    return run


# ------------------------------------------------------------------ results


def result(run: Run) -> dict[str, Any]:
    """The contract's JSON keys for one replay."""
    world, trace = run.world, run.trace
    n = len(trace)
    hours = n / 3600.0
    oracle = sum(world.best_speedup(p.batch, p.alpha) for p in trace) / n
    policy = sum(run.speedups) / n
    mean_alpha = sum(p.alpha for p in trace) / n
    world_alpha = world.profile.alpha if world.profile.alpha is not None else mean_alpha
    return {
        "policy_speedup": round(policy, 4),
        "oracle_speedup": round(oracle, 4),
        "ratio_to_oracle": round(policy / oracle, 4),
        "slowdown_time_fraction": round(sum(1 for x in run.speedups if x < SLOWDOWN_BELOW) / n, 4),
        "restarts_per_pod_hour": round(run.restarts / (run.replicas * hours), 3),
        "weight_changes_per_hour": round(run.weight_changes / hours, 3),
        "plain_speedup": round(fixed_speedup(world, trace, None), 4),
        "static_k3_speedup": round(fixed_speedup(world, trace, STATIC_K3), 4),
        "doc_schedule_speedup": round(fixed_speedup(world, trace, DOC_SCHEDULE), 4),
        "oracle_schedule_speedup": round(fixed_speedup(world, trace, world.best_schedule(world_alpha)), 4),
        "holdback_cost_fraction": round(run.holdback_seconds / (run.replicas * n), 4),
        "learned_break_even_batch": run.learned_break_even,
        "world_break_even_batch": world.profile.break_even_batch(
            mean_alpha, MAX_LENGTH, MAX_BREAK_EVEN_BATCH
        ),
    }


def write_timeline(run: Run, path: Path) -> None:
    header = ["t_seconds"]
    for i in range(run.replicas):
        header += [f"mode{i}", f"k{i}", f"batch{i}", f"config{i}"]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        for point, row, configs in zip(run.trace, run.seconds, run.configs, strict=True):
            cells: list[str] = [f"{point.t_seconds:g}"]
            for second, config in zip(row, configs, strict=True):
                k = "" if second.mode != "spec" or second.k is None else str(second.k)
                cells += [second.mode, k, f"{second.batch:.3f}", config]
            writer.writerow(cells)


def write_configs(run: Run, path: Path) -> None:
    with path.open("w") as handle:
        for digest, revision in run.revisions.items():
            schedule = revision.schedule.canonical() if revision.schedule else [[None, 0]]
            line = {"config": digest, "mode": revision.mode, "draft_len_schedule": schedule}
            handle.write(json.dumps(line) + "\n")


# ------------------------------------------------------------------ the table


DEFAULT_WORLDS = (*profiles.list_builtin(), "roofline")


def table(
    worlds: Sequence[str],
    traces: dict[str, Path],
    *,
    setup: ModelSetup,
    backend: str,
    replicas: int,
    interval_s: float,
    gpu: str,
    seed: int,
    limit_s: int | None = None,
    speculation: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    rows = []
    for name in worlds:
        world = world_from(name, setup)
        world_setup, world_gpu = setup_of(world, setup, gpu)
        for trace_name, path in traces.items():
            run = replay(
                world,
                load_trace(path, limit_s),
                setup=world_setup,
                backend=backend,
                replicas=replicas,
                interval_s=interval_s,
                gpu=world_gpu,
                seed=seed,
                speculation=speculation,
            )
            bound = {f"hindsight_{k}": v for k, v in hindsight_bound(run).items()}
            rows.append({"world": world.name, "trace": trace_name, **result(run), **bound})
    return rows


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    def mean(key: str) -> float:
        return round(sum(r[key] for r in rows) / len(rows), 4)

    keys = [k for k in RESULT_KEYS if not k.endswith("break_even_batch")]
    summary = {f"mean_{k}": mean(k) for k in keys}
    summary["min_ratio_to_oracle"] = min(r["ratio_to_oracle"] for r in rows)
    summary["max_slowdown_time_fraction"] = max(r["slowdown_time_fraction"] for r in rows)
    summary["pairs_below_static_k3"] = sum(
        1 for r in rows if r["policy_speedup"] < r["static_k3_speedup"] - 0.02
    )
    summary["pairs_below_doc_schedule"] = sum(
        1 for r in rows if r["policy_speedup"] < r["doc_schedule_speedup"] - 0.02
    )
    for key in ("ratio_to_oracle", "slowdown_time_fraction", "restarts_per_pod_hour"):
        if all(f"hindsight_{key}" in r for r in rows):
            summary[f"mean_hindsight_{key}"] = mean(f"hindsight_{key}")
    return summary


def format_table(rows: Sequence[dict[str, Any]], summary: dict[str, float]) -> str:
    head = (
        f"{'world':<32} {'trace':<18} {'policy':>6} {'oracle':>6} {'ratio':>6} {'slow':>5} "
        f"{'rst/h':>5} {'K3':>6} {'doc':>6} {'best':>6} {'learnBE':>7} {'worldBE':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['world'][:32]:<32} {r['trace'][:18]:<18} {r['policy_speedup']:6.3f} {r['oracle_speedup']:6.3f} "
            f"{r['ratio_to_oracle']:6.3f} {r['slowdown_time_fraction']:5.3f} {r['restarts_per_pod_hour']:5.2f} "
            f"{r['static_k3_speedup']:6.3f} {r['doc_schedule_speedup']:6.3f} {r['oracle_schedule_speedup']:6.3f} "
            f"{_be(r['learned_break_even_batch']):>7} {_be(r['world_break_even_batch']):>7}"
        )
    lines.append("-" * len(head))
    lines.append(
        f"{'mean':<51} {summary['mean_policy_speedup']:6.3f} {summary['mean_oracle_speedup']:6.3f} "
        f"{summary['mean_ratio_to_oracle']:6.3f} {summary['mean_slowdown_time_fraction']:5.3f} "
        f"{summary['mean_restarts_per_pod_hour']:5.2f} {summary['mean_static_k3_speedup']:6.3f} "
        f"{summary['mean_doc_schedule_speedup']:6.3f} {summary['mean_oracle_schedule_speedup']:6.3f}"
    )
    lines.append(
        "reference rows (mean speedup): "
        + ", ".join(f"{name} {summary[f'mean_{name}_speedup']:.3f}" for name in REFERENCES)
        + f"; oracle {summary['mean_oracle_speedup']:.3f}; operator {summary['mean_policy_speedup']:.3f}"
    )
    lines.append(
        f"min ratio {summary['min_ratio_to_oracle']:.3f}, max slowdown {summary['max_slowdown_time_fraction']:.3f}, "
        f"pairs below K3 - 0.02: {summary['pairs_below_static_k3']}, "
        f"below doc - 0.02: {summary['pairs_below_doc_schedule']}"
    )
    if "mean_hindsight_ratio_to_oracle" in summary:
        lines.append(
            "hindsight with restarts (from the first fleet, the best fixed fleet rolled out at once): "
            f"ratio {summary['mean_hindsight_ratio_to_oracle']:.3f}, "
            f"slowdown {summary['mean_hindsight_slowdown_time_fraction']:.3f}, "
            f"restarts {summary['mean_hindsight_restarts_per_pod_hour']:.2f}"
        )
    return "\n".join(lines)


def _be(value: int | None) -> str:
    return "none" if value is None else str(value)


# ------------------------------------------------------------------ command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specops bench policy",
        description="Replay a load trace in a serving-profile world through the operator's revision step.",
    )
    parser.add_argument(
        "--world", metavar="FILE|NAME", help="serving profile file, builtin name or 'roofline'"
    )
    parser.add_argument(
        "--trace", metavar="FILE|NAME", help="trace CSV t_seconds,batch,alpha (or a shipped name)"
    )
    parser.add_argument("--all", action="store_true", help="every shipped world x every shipped trace")
    parser.add_argument("--backend", choices=BACKENDS, default="vllm")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--interval", default="15s", help="decision interval (duration, default 15s)")
    parser.add_argument("--gpu", choices=sorted(GPUS), default="H100")
    parser.add_argument("--tensor-parallel", type=int, default=1)
    parser.add_argument("--target-params", type=float, default=70e9)
    parser.add_argument("--draft-params", type=float, default=7e9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--speculation",
        type=json.loads,
        default=None,
        metavar="JSON",
        help='spec.speculation of the replayed resource, e.g. \'{"rollout": {"baseline": "0s"}}\' '
        "(default: the spec's defaults)",
    )
    parser.add_argument("--limit-seconds", type=int, default=None, help="replay only the first seconds")
    parser.add_argument("--timeline-out", type=Path, metavar="CSV")
    parser.add_argument("--configs-out", type=Path, metavar="JSONL")
    parser.add_argument("--json", dest="json_path", metavar="OUT", help="result JSON ('-': stdout)")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    setup = ModelSetup(
        GPUS[args.gpu], args.target_params, args.draft_params, tensor_parallel=args.tensor_parallel
    )
    interval_s = parse_duration(args.interval)
    described = {
        "benchmark": "policy",
        "backend": args.backend,
        "replicas": args.replicas,
        "interval_s": interval_s,
        "gpu": args.gpu,
        "tensor_parallel": args.tensor_parallel,
        "target_params": args.target_params,
        "draft_params": args.draft_params,
        "seed": args.seed,
        "speculation": args.speculation,
    }
    out = sys.stderr if args.json_path == "-" else sys.stdout
    if args.all or (args.world is None and args.trace is None):
        rows = table(
            DEFAULT_WORLDS,
            shipped_traces(),
            setup=setup,
            backend=args.backend,
            replicas=args.replicas,
            interval_s=interval_s,
            gpu=args.gpu,
            seed=args.seed,
            limit_s=args.limit_seconds,
            speculation=args.speculation,
        )
        summary = summarise(rows)
        print(format_table(rows, summary), file=out)
        write_json(
            {**described, "summary": summary, "rows": rows}, args.json_path or "bench-results/policy.json"
        )
        return 0
    if args.world is None or args.trace is None:
        parser.error("--world and --trace go together (or --all)")
    traces = shipped_traces()
    trace_path = traces[args.trace] if args.trace in traces else Path(args.trace)
    try:
        world = world_from(args.world, setup)
    except (KeyError, FileNotFoundError, ValueError) as error:
        parser.error(str(error))
    run = replay(
        world,
        load_trace(trace_path, args.limit_seconds),
        setup=setup,
        backend=args.backend,
        replicas=args.replicas,
        interval_s=interval_s,
        gpu=args.gpu,
        seed=args.seed,
        speculation=args.speculation,
    )
    if args.timeline_out:
        write_timeline(run, args.timeline_out)
    if args.configs_out:
        write_configs(run, args.configs_out)
    row = result(run)
    print(json.dumps(row, indent=2), file=out)
    for second, reason, message in run.decisions:
        print(f"  t={second}s {reason}: {message}", file=out)
    write_json(row, args.json_path)  # exactly the contract's keys
    return 0


def worlds_main(argv: list[str]) -> int:
    """The table at --replicas 1 (`make bench` runs it beside the 4-replica one)."""
    return main(["--all", "--replicas", "1", *argv])
