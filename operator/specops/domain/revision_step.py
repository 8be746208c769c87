"""The control loop's one pure step: what revision the stable pods should run, and why.

``step(config, state, inputs, model, now) -> Decision``. The engine applies its schedule at
every iteration; this step only learns where the curve lies (the model comes in fitted) and
picks the revision, which is rare because each change restarts pods:

- Baseline, two or more replicas: all pods but one run the prior's schedule (capped at
  ``draftLength.initial``) beside one plain holdback pod, for ``rollout.baseline``; it ends
  early on a measured slowdown, and measures on (up to three baselines) while the speculating
  pods measure within the margin of plain. Its end picks what every pod runs (Dynamic).
- Baseline, one replica: plain for ``rollout.baseline``; then the first speculating revision
  (Fixed), which soaks for ``rollout.soak`` (ended early when measured slower than plain).
- Dynamic: the best schedule for the fitted curve at the smoothed acceptance
  (revision_policy.best_schedule) is proposed, or plain when that schedule, on the batches the
  deployment saw and with K=0's cost inside a speculating engine, is predicted no faster than
  plain; it rolls out when it pays for the restarts (revision_policy.verdict). A revision the
  model, fed by measurements, now finds slower than plain on the load seen skips the minimum
  interval. Where the load sits at batches no plain pod measured, before a change that rests on
  them (or, once the soak allows, when the pods run K=0 there), one pod is held back plain again
  (MeasuringPlain, back to Baseline).
- Speculation off (``mode: off``, a draft that has not passed its lossless check, or a stale
  draft with ``retraining.whileStale: off``): plain pods, at once.

A resource whose inputs did not move takes the same path and returns the same decision
(nothing is written); there is no second decision path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from specops.api.models import DraftSpec, SpeculativeDeploymentSpec
from specops.api.units import parse_duration
from specops.domain import drafts, perf
from specops.domain.engines import engine_for
from specops.domain.engines.schedule import PLAIN, Revision, Schedule
from specops.domain.records import replace
from specops.domain.revision_policy import (
    BAND_EDGES,
    DEFAULT_K0_COST,
    SpeedupModel,
    best_schedule,
    expected_speedup,
    exploring,
    measured_speedup,
    verdict,
)

Phase = Literal["Baseline", "Fixed", "Dynamic"]
PRIOR_ALPHA = 0.7
"""Acceptance assumed until one is measured: middling for a same-family draft."""
ALPHA_WEIGHT = 0.2
"""Weight of a new acceptance measurement in the smoothed value."""
BASELINE_SAMPLES = 3
"""Plain measurements the Baseline phase waits for, besides its duration."""
EXPLORE_CREDIT = 0.005
"""What an unmeasured loaded band's K=1 is credited above paying (revision_policy.Evidence)."""
K0_WEIGHT = 0.2
"""Weight of a new K=0 cost reading in the smoothed value."""
K0_COST_MAX = 1.0


@dataclass(frozen=True)
class StepConfig:
    mode: Literal["auto", "on", "off"]
    method: str
    draft: str | None
    """The stable draft's identity (None for methods without a checkpoint)."""
    min_k: int
    max_k: int
    initial_k: int
    baseline_s: float
    soak_s: float
    min_gain: float
    min_interval_s: float
    margin: float
    half_life_s: float
    setup: perf.ModelSetup
    off_reason: str | None = None
    """Why speculation must stay off now (an unchecked or stale draft), or None."""
    fixed_k: bool = False
    """The engine runs one K at every batch for this method (SGLang adapts only EAGLE methods):
    revisions are a constant K, chosen on the load seen."""
    slowdown_guard: bool = True
    """A revision measured slower than plain is replaced at once (spec.speculation.calibration
    .slowdownGuard); False: it waits for the soak and the minimum interval like any change."""
    replicas: int = 1
    """Stable pods (spec.serving.replicas)."""
    restarts_down: bool = False
    """A rollout takes pods out of service while they restart (serving.maxUnavailable > 0); with
    surge only, the old pods serve until the new ones are Ready and a restart costs no capacity."""
    holdback: bool = False
    """One pod may be held back plain beside the others (two or more replicas: ``holds_back``)."""


@dataclass(frozen=True)
class Baseline:
    p50_s: float | None = None
    p95_s: float | None = None
    p99_s: float | None = None
    tokens_per_s: float | None = None
    samples: int = 0


@dataclass(frozen=True)
class StepState:
    phase: Phase
    phase_since: datetime
    revision: Revision
    last_change: datetime | None = None
    alpha: float | None = None
    batch_seconds: tuple[float, ...] = ()
    decided_at: datetime | None = None
    baseline: Baseline = Baseline()
    k0_cost: float | None = None
    """What K=0 inside a speculating engine costs per token against plain, as measured (None: the
    assumed DEFAULT_K0_COST)."""
    holdback: bool = False
    """One pod runs plain beside the others, which run ``revision`` (the Baseline phase with two or
    more replicas)."""


@dataclass(frozen=True)
class StepInputs:
    batch: float | None
    alpha: float | None
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_p99_s: float | None = None
    tokens_per_s: float | None = None
    rollout_running: bool = False
    canary_running: bool = False
    k0_ratios: tuple[float, ...] = ()
    """Speculating pods at K=0: their latency over the fitted plain latency at their batch."""
    plain_tpot_p50_s: float | None = None
    """The plain pods' own per-token latency (the holdback pod's while one is held back)."""
    restart_s: float | None = None
    """How long the pods took from creation to Ready (None: unknown): what a restart costs."""


@dataclass(frozen=True)
class Decision:
    state: StepState
    proposed: Revision
    reason: str
    message: str
    gain: float | None = None
    predicted_speedup: float | None = None
    changed: bool = False
    """The revision changes: a rollout starts (an Event names the evidence)."""
    warning: bool = False


def config_from_spec(
    spec: SpeculativeDeploymentSpec, draft: DraftSpec, *, off_reason: str | None = None
) -> StepConfig:
    speculation = spec.speculation
    length = speculation.draft_length
    setup = perf.ModelSetup(
        gpu=perf.GPUS[spec.serving.gpu.type],
        target_params=spec.target.active_parameter_count,
        draft_params=draft.parameter_count_for(spec.target.active_parameter_count),
        bytes_per_param=perf.BYTES_PER_PARAM[spec.target.precision],
        tensor_parallel=spec.serving.tensor_parallel,
        context_tokens=perf.DEFAULT_CONTEXT_TOKENS,
    )
    return StepConfig(
        mode=speculation.mode,
        method=draft.method,
        draft=drafts.draft_identity(draft) if draft.uri else None,
        min_k=length.min,
        max_k=length.max,
        initial_k=length.initial,
        baseline_s=parse_duration(speculation.rollout.baseline),
        soak_s=parse_duration(speculation.rollout.soak),
        min_gain=speculation.reconfigure.min_gain,
        min_interval_s=parse_duration(speculation.reconfigure.min_interval),
        margin=speculation.reconfigure.margin,
        half_life_s=parse_duration(speculation.calibration.half_life),
        setup=setup,
        off_reason=off_reason,
        slowdown_guard=speculation.calibration.slowdown_guard,
        replicas=spec.serving.replicas,
        restarts_down=spec.serving.max_unavailable > 0,
        holdback=holds_back(spec),
        fixed_k=draft.method not in engine_for(spec.serving.backend).scheduled_methods,
    )


def speculating(config: StepConfig, schedule: Schedule) -> Revision:
    return Revision(mode="spec", method=config.method, draft=config.draft, schedule=schedule)  # type: ignore[arg-type]


def initial_state(config: StepConfig, model: SpeedupModel, now: datetime) -> StepState:
    """A new resource: the first speculating revision beside one plain holdback pod for its baseline
    (two or more replicas), plain for its baseline (one replica), or the first speculating revision
    at once (no baseline)."""
    if config.mode == "off" or config.off_reason:
        return StepState(phase="Baseline", phase_since=now, revision=PLAIN)
    if config.baseline_s > 0 and config.holdback:
        first = first_revision(config, model)
        return StepState(phase="Baseline", phase_since=now, revision=first, last_change=now, holdback=True)
    if config.baseline_s > 0:
        return StepState(phase="Baseline", phase_since=now, revision=PLAIN)
    return StepState(phase="Fixed", phase_since=now, revision=first_revision(config, model), last_change=now)


def first_revision(
    config: StepConfig, model: SpeedupModel, load: Mapping[float, float] | None = None
) -> Revision:
    """The prior's schedule capped at draftLength.initial (at least K=initial at batch 1); with the
    load seen in the baseline, its unmeasured loaded bands explored (revision_policy.Evidence)."""
    if config.fixed_k:
        return speculating(config, Schedule.constant(config.initial_k))
    if load:
        model = exploring(model, load, credit=1.0 + config.margin + config.min_gain + EXPLORE_CREDIT)
    schedule = best_schedule(
        model, PRIOR_ALPHA, config.initial_k, min_k=config.min_k, margin=config.margin, load=load or None
    )
    if schedule is None:
        schedule = Schedule.of([[1, config.initial_k], [None, 0]]) if config.mode == "on" else None
    if schedule is None:
        schedule = Schedule.of([[1, config.initial_k], [None, 0]])
    return speculating(config, schedule)


def _band(batch: float) -> int:
    for index, edge in enumerate(BAND_EDGES):
        if batch <= edge:
            return index
    return len(BAND_EDGES) - 1


def track_batches(state: StepState, batch: float | None, half_life_s: float, now: datetime) -> StepState:
    """Decay the seconds per band by the half-life and add the time since the last decision."""
    seconds = list(state.batch_seconds) or [0.0] * len(BAND_EDGES)
    if len(seconds) != len(BAND_EDGES):
        seconds = [0.0] * len(BAND_EDGES)
    dt = 0.0 if state.decided_at is None else max(0.0, (now - state.decided_at).total_seconds())
    if dt and half_life_s > 0:
        factor = 0.5 ** (dt / half_life_s)
        seconds = [s * factor for s in seconds]
    if batch is not None and batch > 0 and dt:
        seconds[_band(batch)] += dt
    return replace(state, batch_seconds=tuple(round(s, 3) for s in seconds), decided_at=now)


def batches_seen(state: StepState, current_batch: float | None) -> dict[float, float]:
    """The load a revision is judged on: decayed seconds per band (the current batch while empty)."""
    seen = {
        float(edge): weight
        for edge, weight in zip(BAND_EDGES, state.batch_seconds, strict=False)
        if weight > 0
    }
    if not seen and current_batch:
        seen = {float(current_batch): 1.0}
    return seen


def _accumulate(baseline: Baseline, inputs: StepInputs) -> Baseline:
    if inputs.tpot_p50_s is None:
        return baseline
    n = baseline.samples

    def mean(old: float | None, new: float | None) -> float | None:
        if new is None or not math.isfinite(new):
            return old
        return new if old is None or n == 0 else (old * n + new) / (n + 1)

    return Baseline(
        p50_s=mean(baseline.p50_s, inputs.tpot_p50_s),
        p95_s=mean(baseline.p95_s, inputs.tpot_p95_s),
        p99_s=mean(baseline.p99_s, inputs.tpot_p99_s),
        tokens_per_s=mean(baseline.tokens_per_s, inputs.tokens_per_s),
        samples=n + 1,
    )


def step(
    config: StepConfig, state: StepState, inputs: StepInputs, model: SpeedupModel, now: datetime
) -> Decision:
    """The next state and the revision the stable pods should run (see the module docstring)."""
    state = track_batches(state, inputs.batch, config.half_life_s, now)
    if inputs.alpha is not None and state.revision.mode == "spec":
        smoothed = (
            inputs.alpha
            if state.alpha is None
            else (1 - ALPHA_WEIGHT) * state.alpha + ALPHA_WEIGHT * inputs.alpha
        )
        state = replace(state, alpha=round(smoothed, 4))
    for ratio in inputs.k0_ratios:
        cost = min(K0_COST_MAX, max(0.0, ratio - 1.0))
        previous = state.k0_cost if state.k0_cost is not None else DEFAULT_K0_COST
        state = replace(state, k0_cost=round((1 - K0_WEIGHT) * previous + K0_WEIGHT * cost, 4))
    alpha = state.alpha if state.alpha is not None else PRIOR_ALPHA
    seen = batches_seen(state, inputs.batch)
    current = state.revision
    k0_cost = state.k0_cost if state.k0_cost is not None else DEFAULT_K0_COST

    def predicted(revision: Revision) -> float:
        return expected_speedup(model, alpha, revision.schedule, seen, k0_cost)

    if config.mode == "off" or config.off_reason:
        reason = "SpeculationOff" if config.mode == "off" else "SpeculationHeld"
        message = (
            "spec.speculation.mode is off: the pods run plain"
            if config.mode == "off"
            else str(config.off_reason)
        )
        if current.mode == "plain":
            return Decision(state, PLAIN, reason, message, predicted_speedup=1.0)
        if inputs.rollout_running:
            return Decision(
                state, PLAIN, "RolloutRunning", f"plain waits for the rollout in progress ({message})"
            )
        moved = replace(state, revision=PLAIN, last_change=now, holdback=False)
        return Decision(moved, PLAIN, reason, message, predicted_speedup=1.0, changed=True)

    if state.phase == "Baseline" and state.holdback:
        return _held_back(config, state, inputs, model, now)
    if (
        state.phase == "Baseline"
        and config.holdback
        and config.baseline_s > 0
        and not (inputs.canary_running or inputs.rollout_running)
    ):
        # plain until now (speculation was held): the baseline starts again with a holdback pod
        first = first_revision(config, model)
        moved = replace(
            state, phase_since=now, revision=first, last_change=now, holdback=True, baseline=Baseline()
        )
        return Decision(
            moved,
            first,
            "Baseline",
            f"{config.replicas - 1} of {config.replicas} pods start {first.describe()} beside a plain "
            "holdback pod measuring plain speed",
            predicted_speedup=predicted(first),
            changed=True,
        )
    if state.phase == "Baseline":
        if current.mode == "spec":  # speculating pods with a Baseline phase: start it plain
            return Decision(
                replace(state, revision=PLAIN, last_change=now),
                PLAIN,
                "Baseline",
                "measuring plain speed first",
                changed=True,
            )
        if not inputs.rollout_running:
            state = replace(state, baseline=_accumulate(state.baseline, inputs))
        elapsed = (now - state.phase_since).total_seconds()
        if _measuring(config, state, now):
            return Decision(
                state,
                PLAIN,
                "Baseline",
                f"measuring plain speed ({state.baseline.samples} samples, {elapsed:.0f} s of {config.baseline_s:.0f} s)",
                predicted_speedup=1.0,
            )
        if inputs.canary_running or inputs.rollout_running:
            return Decision(
                state,
                PLAIN,
                "Baseline",
                "the first speculating revision waits for the rollout or canary in progress",
                predicted_speedup=1.0,
            )
        first = first_revision(config, model, seen)
        moved = replace(state, phase="Fixed", phase_since=now, revision=first, last_change=now)
        p50 = state.baseline.p50_s
        baseline_text = (
            f"plain p50 {p50 * 1000:.2f} ms/token" if p50 is not None else "no plain latency measured"
        )
        return Decision(
            moved,
            first,
            "BaselineRecorded",
            f"{baseline_text}; rolling out {first.describe()}",
            predicted_speedup=predicted(first),
            changed=True,
        )

    if state.phase == "Fixed":
        measured = measured_speedup(model, alpha, current.schedule, seen, state.k0_cost)
        slower = config.slowdown_guard and measured is not None and measured < 1.0 - config.margin
        if (now - state.phase_since).total_seconds() < config.soak_s and not slower:
            return Decision(
                state,
                current,
                "Soaking",
                f"{current.describe()} soaks before the loop tunes it",
                predicted_speedup=predicted(current),
            )
        state = replace(state, phase="Dynamic", phase_since=now)

    proposed, explorer = _propose(config, model, alpha, seen, k0_cost)
    current_speed = predicted(current)
    proposed_speed = expected_speedup(explorer, alpha, proposed.schedule, seen, k0_cost)
    measured = measured_speedup(model, alpha, current.schedule, seen, state.k0_cost)
    slowdown = config.slowdown_guard and measured is not None and measured < 1.0 - config.margin
    first_change = state.last_change is not None and state.last_change < state.phase_since
    result = verdict(
        current.schedule,
        proposed.schedule,
        current_speed,
        proposed_speed,
        # a gain must pay its restarts back; leaving a measured slowdown need not
        min_gain=config.min_gain
        if slowdown
        else max(config.min_gain, restart_cost(config, config.replicas, inputs.restart_s)),
        # the revision set before this phase began was judged by its soak: the first change is free
        min_interval_s=0.0 if slowdown or first_change else config.min_interval_s,
        last_change=state.last_change,
        now=now,
        canary_running=inputs.canary_running,
        # a revision measured slower than plain is replaced mid-rollout (its pods restart again)
        rollout_running=inputs.rollout_running and not slowdown,
    )
    # the load sits where no pod measured plain speed: measured before a change that rests on it, or
    # as soon as the soak allows where the pods run K=0 there (its cost is unknown, its gain none);
    # plain pods measure plain themselves
    unmeasured: list[float] = []
    if config.holdback and current.mode == "spec":
        bands = _plain_unmeasured(model, seen)
        settled = (
            state.last_change is None or (now - state.last_change).total_seconds() >= config.soak_s
        ) and not (inputs.rollout_running or inputs.canary_running)
        if result.roll or (settled and _idle(current, bands, seen)):
            unmeasured = bands
    if proposed != current and unmeasured:
        # the load sits where no pod measured plain speed, so no decision there rests on evidence:
        # one pod runs plain beside the others first (one restart, not every pod's)
        near = ", ".join(f"{edge:g}" for edge in unmeasured)
        moved = replace(
            state, phase="Baseline", phase_since=now, holdback=True, baseline=Baseline(), last_change=now
        )
        return Decision(
            moved,
            current,
            "MeasuringPlain",
            f"plain speed was not measured near batch {near}, where the load is: one pod runs plain "
            f"beside the others to measure it",
            predicted_speedup=current_speed,
            changed=True,
        )
    if proposed == current or not result.roll:
        reason = result.reason if proposed != current else "AlreadyServing"
        return Decision(
            state, proposed, reason, result.message, gain=result.gain, predicted_speedup=current_speed
        )
    reason = "MeasuredSlowdown" if slowdown else result.reason
    message = (
        f"{current.describe()} measured {(measured or 1.0) - 1:+.1%} against plain on the batches seen "
        f"(alpha {alpha:.2f}); {result.message}"
        if slowdown
        else f"{result.message} (alpha {alpha:.2f})"
    )
    moved = replace(state, revision=proposed, last_change=now)
    return Decision(
        moved,
        proposed,
        reason,
        message,
        gain=result.gain,
        predicted_speedup=proposed_speed,
        changed=True,
        warning=slowdown,
    )


DEFAULT_RESTART_S = 120.0
"""A pod's restart (creation to Ready) assumed until the pods say how long theirs took."""


def restart_cost(config: StepConfig, restarting: int, restart_s: float | None) -> float:
    """The share of the fleet's pod-time over the next minimum interval that ``restarting`` pods
    spend down: a rollout's predicted gain must exceed it (and minGain) to pay its restarts back.
    0 where rollouts surge (the old pods serve until the new ones are Ready)."""
    if not config.restarts_down or config.min_interval_s <= 0 or config.replicas <= 0 or restarting <= 0:
        return 0.0
    seconds = DEFAULT_RESTART_S if restart_s is None else restart_s
    return seconds * restarting / (config.replicas * config.min_interval_s)


def _propose(
    config: StepConfig, model: SpeedupModel, alpha: float, seen: Mapping[float, float], k0_cost: float
) -> tuple[Revision, SpeedupModel]:
    """The best revision for the fitted curve on the load seen, and the model it was judged on
    (unmeasured loaded bands explored)."""
    explorer = exploring(model, seen, credit=1.0 + config.margin + config.min_gain + EXPLORE_CREDIT)
    schedule = best_schedule(
        explorer, alpha, config.max_k, min_k=config.min_k, margin=config.margin, load=seen
    )
    if config.fixed_k and schedule is not None:
        # one K at every batch: the one with the best expected speedup on the load seen
        constants = [Schedule.constant(k) for k in range(max(1, config.min_k), config.max_k + 1)]
        schedule = max(constants, key=lambda c: expected_speedup(explorer, alpha, c, seen, k0_cost))
    if schedule is None and config.mode == "on":
        schedule = (
            Schedule.constant(config.min_k) if config.fixed_k else Schedule.of([[1, config.min_k], [None, 0]])
        )
    proposed = PLAIN if schedule is None else speculating(config, schedule)
    if (
        config.mode != "on"
        and proposed.mode == "spec"
        and expected_speedup(explorer, alpha, proposed.schedule, seen, k0_cost) <= 1.0 + config.margin
    ):
        # the bands that pay see too little of the load to outweigh K=0's cost on the rest
        proposed = PLAIN
    return proposed, explorer


def _measuring(config: StepConfig, state: StepState, now: datetime) -> bool:
    """A baseline still measuring plain: before rollout.baseline, or short of BASELINE_SAMPLES
    readings for up to three times that."""
    elapsed = (now - state.phase_since).total_seconds()
    return elapsed < config.baseline_s or (
        state.baseline.samples < BASELINE_SAMPLES and elapsed < 3 * config.baseline_s
    )


def holds_back(spec: SpeculativeDeploymentSpec) -> bool:
    """Whether a baseline may hold one pod back plain: two or more replicas. Traffic reaches it
    through the shared Service (an even share), or through the HTTPRoute, on which the control loop
    weights the holdback Service beside the stable one (``routes_holdback``)."""
    return spec.serving.replicas >= 2


def routes_holdback(spec: SpeculativeDeploymentSpec) -> bool:
    """Whether the holdback's share of traffic is a route weight (an HTTPRoute names the stable
    Service), moved every interval; otherwise it is its even share of the shared Service."""
    return spec.canary.traffic_routing.gateway_api is not None


def _held_back(
    config: StepConfig, state: StepState, inputs: StepInputs, model: SpeedupModel, now: datetime
) -> Decision:
    """Baseline with a holdback: all pods but one run the first speculating revision, one runs plain.
    Its end (or a measured slowdown) picks the revision every pod then runs; when that is the one
    already speculating, only the holdback pod restarts."""
    current = state.revision
    held = f"{config.replicas - 1} of {config.replicas} pods run {current.describe()} beside a plain holdback pod"
    if inputs.rollout_running and not state.baseline.samples:
        # the baseline's time counts from when its pods serve (a pod starts in minutes)
        return Decision(
            replace(state, phase_since=now),
            current,
            "Baseline",
            f"{held}; the baseline starts once they serve",
        )
    if not inputs.rollout_running:
        plain = StepInputs(batch=inputs.batch, alpha=None, tpot_p50_s=inputs.plain_tpot_p50_s)
        state = replace(state, baseline=_accumulate(state.baseline, plain))
    alpha = state.alpha if state.alpha is not None else PRIOR_ALPHA
    seen = batches_seen(state, inputs.batch)
    k0_cost = state.k0_cost if state.k0_cost is not None else DEFAULT_K0_COST
    measured = measured_speedup(model, alpha, current.schedule, seen, state.k0_cost)
    slower = (
        config.slowdown_guard
        and measured is not None
        and measured < 1.0 - config.margin
        and state.baseline.samples >= BASELINE_SAMPLES  # the holdback pod serves and was measured
    )
    elapsed = (now - state.phase_since).total_seconds()
    # within the margin of plain either way the evidence is not yet clear: measured on (up to three
    # baselines) rather than restarting the holdback pod into a revision that may have to go
    unclear = measured is not None and measured < 1.0 + config.margin
    if not slower and (_measuring(config, state, now) or (unclear and elapsed < 3 * config.baseline_s)):
        return Decision(
            state,
            current,
            "Baseline",
            f"{held}, measuring plain speed ({state.baseline.samples} samples, "
            f"{elapsed:.0f} s of {config.baseline_s:.0f} s)",
            predicted_speedup=expected_speedup(model, alpha, current.schedule, seen, k0_cost),
        )
    if inputs.canary_running or inputs.rollout_running:
        return Decision(
            state, current, "Baseline", f"{held}; the baseline ends after the rollout or canary in progress"
        )
    proposed, explorer = _propose(config, model, alpha, seen, k0_cost)
    current_speed = expected_speedup(explorer, alpha, current.schedule, seen, k0_cost)
    proposed_speed = expected_speedup(explorer, alpha, proposed.schedule, seen, k0_cost)
    gain = proposed_speed / current_speed - 1.0 if current_speed > 0 else 0.0
    needed = max(config.min_gain, restart_cost(config, config.replicas - 1, inputs.restart_s))
    chosen = proposed if slower or gain > needed else current
    p50 = state.baseline.p50_s
    found = (
        f"plain p50 {p50 * 1000:.2f} ms/token on the holdback pod"
        if p50 is not None
        else "no plain latency measured"
    )
    if measured is not None:
        found += f"; {current.describe()} measured {measured - 1:+.1%} against plain on the batches seen"
    change = f" (predicted {gain:+.1%})" if chosen != current else ""
    moved = replace(state, phase="Dynamic", phase_since=now, revision=chosen, last_change=now, holdback=False)
    return Decision(
        moved,
        chosen,
        "MeasuredSlowdown" if slower else "BaselineRecorded",
        f"{found} (alpha {alpha:.2f}); every pod now runs {chosen.describe()}{change}",
        gain=gain if chosen != current else None,
        predicted_speedup=proposed_speed if chosen != current else current_speed,
        changed=True,
        warning=slower,
    )


PLAIN_REACH = 0.35
"""How far (in log batch: one half-octave band) a plain measurement speaks for plain speed."""
PLAIN_LOAD_SHARE = 0.1
"""Share of the load seen a band must carry for its unmeasured plain speed to matter."""


def _plain_unmeasured(model: SpeedupModel, seen: Mapping[float, float]) -> list[float]:
    """Loaded bands (upper edges) with no plain pod measured near them (a speculating pod at K=0 says
    plain only up to K=0's cost, which is learnt where both ran); none for a model without
    measurements (calibration off)."""
    anchors = getattr(model, "anchors", None)
    if not isinstance(anchors, Mapping):
        return []
    plain = [math.log(edge) for edge, anchor in anchors.items() if anchor.plain_s]
    total = sum(seen.values())
    return sorted(
        edge
        for edge, weight in seen.items()
        if weight >= PLAIN_LOAD_SHARE * total
        and not any(abs(math.log(max(1.0, edge)) - at) <= PLAIN_REACH for at in plain)
    )


IDLE_SHARE = 0.25
"""Share of the load seen at K=0 with plain unmeasured there that has a plain pod measure it."""


def _idle(current: Revision, unmeasured: Sequence[float], seen: Mapping[float, float]) -> bool:
    """Whether the ``unmeasured`` bands (no plain pod near them) where ``current`` runs K=0 carry
    IDLE_SHARE of the load seen."""
    total = sum(seen.values())
    if current.schedule is None or total <= 0:
        return False
    idle = sum(seen[edge] for edge in unmeasured if current.schedule.k_at(edge) == 0)
    return idle >= IDLE_SHARE * total
