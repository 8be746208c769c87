"""The control loop's pure edges: status <-> step state, decision -> status, conditions.

The step (domain.revision_step) works on dataclasses; the resource keeps the same state in its
typed status (api.status). These functions are the only translation between the two, so a
restart resumes exactly from what status recorded.
"""

from __future__ import annotations

import functools
from datetime import datetime

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import SpeculativeDeploymentSpec
from specops.api.status import (
    BaselineStatus,
    HoldbackStatus,
    ObservedStatus,
    PodsApplied,
    RevisionStatus,
    RolloutStatus,
    ScheduleBand,
    SpeculationStatus,
)
from specops.api.units import parse_duration
from specops.domain.engines.schedule import PLAIN, Revision, Schedule, ScheduleError
from specops.domain.learning import LearningConfig
from specops.domain.learning import learning_config as _learning_config
from specops.domain.metrics import Measurement
from specops.domain.revision_policy import SpeedupModel
from specops.domain.revision_step import Baseline, Decision, StepConfig, StepInputs, StepState, initial_state


def learning_config(spec: SpeculativeDeploymentSpec, rate_window_s: float) -> LearningConfig:
    """Calibration as the spec sets it (settle time from the metrics interval and the rate window)."""
    speculation = spec.speculation
    return _learning_config(
        enabled=speculation.calibration.enabled,
        guard=speculation.calibration.slowdown_guard,
        half_life_s=parse_duration(speculation.calibration.half_life),
        interval_s=parse_duration(spec.metrics.interval),
        rate_window_s=rate_window_s,
    )


@functools.lru_cache(maxsize=4096)
def revision_to_status(revision: Revision) -> RevisionStatus:
    """status' form of a revision (one model per revision, shared: statuses are copied, never changed
    in place)."""
    return RevisionStatus(
        digest=revision.digest,
        mode=revision.mode,
        method=revision.method,
        draft=revision.draft,
        schedule=[
            ScheduleBand(max_batch=edge, k=k)
            for edge, k in (revision.schedule.bands if revision.schedule else ())
        ],
        description=revision.describe(),
    )


def revision_from_status(recorded: RevisionStatus | None) -> Revision | None:
    """The revision a status block describes; None when unreadable (the caller starts afresh)."""
    if recorded is None:
        return None
    if recorded.mode == "plain":
        return PLAIN
    try:
        schedule = Schedule.of([[band.max_batch, band.k] for band in recorded.schedule])
        return Revision(mode="spec", method=recorded.method, draft=recorded.draft, schedule=schedule)  # type: ignore[arg-type]
    except (ScheduleError, ValueError, TypeError):
        return None


def for_draft(revision: Revision, draft: str | None) -> Revision:
    """The revision with the stable draft's identity: a promoted draft keeps the schedule it was
    judged on, and the pods (which already load the new checkpoint) keep their revision label."""
    if revision.mode != "spec" or revision.draft == draft:
        return revision
    return Revision(mode="spec", method=revision.method, draft=draft, schedule=revision.schedule)


def state_from_status(
    speculation: SpeculationStatus,
    baseline: BaselineStatus,
    config: StepConfig,
    model: SpeedupModel,
    now: datetime,
) -> StepState:
    """Rebuild the step state persisted in status; a fresh resource starts as initial_state says."""
    revision = revision_from_status(speculation.revision)
    if speculation.control_phase is None or speculation.phase_since is None or revision is None:
        return initial_state(config, model, now)
    revision = for_draft(revision, config.draft)
    recorded = Baseline()
    if baseline.samples:
        recorded = Baseline(
            p50_s=baseline.per_token_latency_p50,
            p95_s=baseline.per_token_latency_p95,
            p99_s=baseline.per_token_latency_p99,
            tokens_per_s=baseline.tokens_per_second,
            samples=baseline.samples,
        )
    return StepState(
        phase=speculation.control_phase,
        phase_since=speculation.phase_since,
        revision=revision,
        last_change=speculation.last_change_time,
        alpha=speculation.smoothed_alpha,
        batch_seconds=tuple(speculation.batch_seconds),
        decided_at=speculation.last_decision_time,
        baseline=recorded,
        k0_cost=speculation.k0_cost,
        holdback=speculation.holdback is not None and config.holdback,
    )


def inputs_from(
    measurement: Measurement,
    *,
    rollout_running: bool,
    canary_running: bool,
    k0_ratios: tuple[float, ...] = (),
    plain_tpot_p50_s: float | None = None,
    restart_s: float | None = None,
) -> StepInputs:
    return StepInputs(
        batch=measurement.batch,
        alpha=measurement.alpha,
        tpot_p50_s=measurement.tpot_mean_s if measurement.tpot_p50_s is None else measurement.tpot_p50_s,
        tpot_p95_s=measurement.tpot_p95_s,
        tpot_p99_s=measurement.tpot_p99_s,
        tokens_per_s=measurement.tokens_per_s,
        rollout_running=rollout_running,
        canary_running=canary_running,
        k0_ratios=k0_ratios,
        plain_tpot_p50_s=plain_tpot_p50_s,
        restart_s=restart_s,
    )


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def measured_speedup(baseline: Baseline, tpot_p50_s: float | None) -> float | None:
    if baseline.p50_s is None or not tpot_p50_s:
        return None
    return baseline.p50_s / tpot_p50_s


def speculation_status(
    decision: Decision,
    inputs: StepInputs,
    now: datetime,
    pods: PodsApplied,
    rollout: RolloutStatus | None,
    calibration: object | None = None,
    replicas: int = 1,
    holdback_weight: int | None = None,
) -> SpeculationStatus:
    """status.speculation for a decision (calibration is set by the caller); ``holdback_weight``:
    the holdback's route weight (None: its even share behind the shared Service)."""
    state = decision.state
    revision = state.revision
    speedup = measured_speedup(state.baseline, inputs.tpot_p50_s) if revision.mode == "spec" else None
    return SpeculationStatus(
        state="on" if revision.mode == "spec" else "off",
        draft_length=revision.schedule.max_k if revision.schedule else 0,
        schedule=revision.describe(),
        revision=revision_to_status(revision),
        proposed=revision_to_status(decision.proposed),
        predicted_gain=_round(decision.gain, 4),
        control_phase=state.phase,
        phase_since=state.phase_since,
        reason=decision.reason,
        message=decision.message,
        predicted_speedup=_round(decision.predicted_speedup),
        measured_speedup=_round(speedup),
        smoothed_alpha=_round(state.alpha, 4),
        last_change_time=state.last_change,
        last_decision_time=now,
        pods=pods,
        rollout=rollout,
        batch_seconds=list(state.batch_seconds),
        k0_cost=state.k0_cost,
        holdback=holdback_status(decision.state, replicas, decision.predicted_speedup, holdback_weight),
    )


def holdback_status(
    state: StepState, replicas: int, predicted_speedup: float | None, weight: int | None = None
) -> HoldbackStatus | None:
    """status.speculation.holdback for ``state``: None unless a pod is held back. ``weight``: the
    percent of traffic the holdback carries (None: its even share behind the shared Service)."""
    if not state.holdback or replicas < 2:
        return None
    share = 1.0 / replicas if weight is None else weight / 100.0
    cost = None if predicted_speedup is None else round(max(0.0, predicted_speedup - 1.0) * share, 4)
    shown = round(100 / replicas) if weight is None else weight
    return HoldbackStatus(pods=1, since=state.phase_since, cost=cost, weight=shown)


def baseline_status(state: StepState, current: BaselineStatus) -> BaselineStatus:
    baseline = state.baseline
    if not baseline.samples:
        return current
    return BaselineStatus(
        per_token_latency_p50=baseline.p50_s,
        per_token_latency_p95=baseline.p95_s,
        per_token_latency_p99=baseline.p99_s,
        tokens_per_second=_round(baseline.tokens_per_s, 1),
        samples=baseline.samples,
    )


def observed_status(measurement: Measurement) -> ObservedStatus:
    return ObservedStatus(
        alpha=_round(measurement.alpha, 4),
        acceptance_rate=_round(measurement.acceptance_rate, 4),
        batch=_round(measurement.batch, 2),
        per_token_latency_p99=measurement.tpot_p99_s,
        request_rate=_round(measurement.request_rate),
        at=measurement.at,
    )


def acceptance_condition(state: StepState, min_acceptance: float) -> ConditionUpdate:
    """AcceptanceBelowSLO: the smoothed alpha against slo.minAcceptance, judged only while speculating."""
    alpha = state.alpha
    if alpha is None or state.revision.mode != "spec":
        return ConditionUpdate(
            cond.ACCEPTANCE_BELOW_SLO, "Unknown", Reason.NOT_SPECULATING, "no acceptance measured now"
        )
    if alpha < min_acceptance:
        return ConditionUpdate(
            cond.ACCEPTANCE_BELOW_SLO,
            "True",
            Reason.ACCEPTANCE_BELOW_SLO,
            f"per-token acceptance {alpha:.2f} < slo.minAcceptance {min_acceptance:.2f}",
        )
    return ConditionUpdate(
        cond.ACCEPTANCE_BELOW_SLO,
        "False",
        Reason.ACCEPTANCE_OK,
        f"per-token acceptance {alpha:.2f} >= slo.minAcceptance {min_acceptance:.2f}",
    )


def applied_condition(desired: int, applied: int, revision: Revision) -> ConditionUpdate:
    """SpeculationApplied: whether every serving pod runs the revision in force (a rollout shows)."""
    if desired == 0:
        return ConditionUpdate(
            cond.SPECULATION_APPLIED, "Unknown", Reason.WAITING_FOR_PODS, "no ready serving pod"
        )
    text = f"revision {revision.digest} ({revision.describe()})"
    if applied >= desired:
        return ConditionUpdate(
            cond.SPECULATION_APPLIED, "True", Reason.ALL_PODS_APPLIED, f"{text} on {applied}/{desired} pods"
        )
    return ConditionUpdate(
        cond.SPECULATION_APPLIED,
        "False",
        Reason.PARTIALLY_APPLIED,
        f"{text} on {applied}/{desired} pods: a rollout is under way",
    )
