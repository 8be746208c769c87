"""The control loop's pure edges: spec -> policy config, status <-> policy state, decision -> status.

The policy (domain.policy) works on dataclasses; the resource keeps the same state in its
typed status (api.status). These functions are the only translation between the two, so a
restart resumes the policy exactly from what status recorded.
"""

from __future__ import annotations

from datetime import datetime

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import SpeculativeDeploymentSpec
from specops.api.status import BaselineStatus, ObservedStatus, PodsApplied, SpeculationStatus
from specops.api.units import parse_duration
from specops.domain import perf
from specops.domain.learning import LearningConfig
from specops.domain.learning import learning_config as _learning_config
from specops.domain.metrics import Measurement
from specops.domain.policy import (
    Baseline,
    Decision,
    Observation,
    PolicyConfig,
    PolicyState,
    initial_state,
    measured_speedup,
)


def policy_config(
    spec: SpeculativeDeploymentSpec, *, draft_stale: bool = False, draft_unchecked: bool = False
) -> PolicyConfig:
    """The policy's view of a spec: bounds clipped to the engine, the performance model of this setup.

    `draft_stale` is the retraining verdict for the draft in service; with
    retraining.whileStale: off it switches speculation off until a retrained draft is promoted.
    `draft_unchecked`: the stable draft has not passed its lossless check; speculation stays off.
    """
    speculation, guard = spec.speculation, spec.speculation.batch_guard
    engine_max = spec.target.engine.max_draft_len
    setup = perf.ModelSetup(
        gpu=perf.GPUS[spec.serving.gpu.type],
        target_params=spec.target.active_parameter_count,
        draft_params=spec.draft.parameter_count,
        bytes_per_param=perf.BYTES_PER_PARAM[spec.target.precision],
        tensor_parallel=spec.serving.tensor_parallel,
        context_tokens=perf.DEFAULT_CONTEXT_TOKENS,
    )
    return PolicyConfig(
        mode=speculation.mode,
        initial_length=min(speculation.draft_length.initial, engine_max),
        min_length=min(speculation.draft_length.min, engine_max),
        max_length=min(speculation.draft_length.max, engine_max),
        baseline_duration_s=parse_duration(speculation.rollout.baseline),
        soak_duration_s=parse_duration(speculation.rollout.soak),
        setup=setup,
        margin=guard.margin,
        hysteresis=guard.hysteresis,
        min_dwell_s=parse_duration(guard.min_dwell),
        off_above_batch=guard.off_above,
        on_below_batch=guard.on_below,
        min_acceptance=spec.slo.min_acceptance,
        draft_stale_off=draft_stale and spec.retraining.while_stale == "off",
        draft_unchecked_off=draft_unchecked,
    )


def learning_config(spec: SpeculativeDeploymentSpec, rate_window_s: float) -> LearningConfig:
    """Calibration, probes and the slowdown guard as the spec sets them (probe timing from the
    metrics interval and the rate window one measurement spans)."""
    speculation = spec.speculation
    return _learning_config(
        enabled=speculation.calibration.enabled,
        guard=speculation.calibration.slowdown_guard,
        half_life_s=parse_duration(speculation.calibration.half_life),
        max_probe_fraction=speculation.exploration.max_probe_fraction,
        min_spacing_s=parse_duration(speculation.exploration.min_spacing),
        interval_s=parse_duration(spec.metrics.interval),
        rate_window_s=rate_window_s,
    )


def state_from_status(
    speculation: SpeculationStatus, baseline: BaselineStatus, config: PolicyConfig, now: datetime
) -> PolicyState:
    """Rebuild the policy state persisted in status; a fresh resource starts in Baseline."""
    if speculation.control_phase is None or speculation.phase_since is None:
        return initial_state(config, now)
    recorded = None
    if baseline.samples:
        recorded = Baseline(
            p50_s=baseline.per_token_latency_p50,
            p95_s=baseline.per_token_latency_p95,
            p99_s=baseline.per_token_latency_p99,
            tokens_per_s=baseline.tokens_per_second,
            samples=baseline.samples,
        )
    return PolicyState(
        phase=speculation.control_phase,
        phase_since=speculation.phase_since,
        enabled=speculation.state == "on",
        draft_length=speculation.tuned_length or config.initial_length,
        alpha=speculation.smoothed_alpha,
        last_toggle=speculation.last_toggle_time,
        baseline=recorded,
        enable_evidence=speculation.enable_evidence or 0.0,
        evidence_at=speculation.evidence_at,
    )


def observation_from(measurement: Measurement) -> Observation:
    return Observation(
        batch=measurement.batch or 0.0,
        alpha=measurement.alpha,
        tpot_p50_s=measurement.tpot_p50_s,
        tpot_p95_s=measurement.tpot_p95_s,
        tpot_p99_s=measurement.tpot_p99_s,
        tokens_per_s=measurement.tokens_per_s,
    )


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def speculation_status(
    decision: Decision, observation: Observation, now: datetime, pods: PodsApplied
) -> SpeculationStatus:
    """status.speculation for a decision."""
    state = decision.state
    speedup = measured_speedup(state.baseline, observation) if decision.num_draft_tokens else None
    return SpeculationStatus(
        state="on" if decision.num_draft_tokens > 0 else "off",
        draft_length=decision.num_draft_tokens,
        tuned_length=state.draft_length,
        control_phase=state.phase,
        phase_since=state.phase_since,
        reason=decision.reason,
        message=decision.message,
        predicted_speedup=_round(decision.predicted_speedup),
        measured_speedup=_round(speedup),
        smoothed_alpha=_round(state.alpha, 4),
        enable_evidence=_round(state.enable_evidence, 3),
        evidence_at=state.evidence_at,
        last_toggle_time=state.last_toggle,
        last_decision_time=now,
        pods=pods,
    )


def baseline_status(state: PolicyState, current: BaselineStatus) -> BaselineStatus:
    baseline = state.baseline
    if baseline is None:
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


def acceptance_condition(decision: Decision, min_acceptance: float) -> ConditionUpdate:
    """AcceptanceBelowSLO: the smoothed alpha against slo.minAcceptance, judged only while speculating."""
    alpha = decision.state.alpha
    if alpha is None or decision.num_draft_tokens == 0:
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


def applied_condition(
    desired: int, applied: int, errors: dict[str, str], num_draft_tokens: int
) -> ConditionUpdate:
    """SpeculationApplied: whether every ready pod runs the decided setting (partial stays visible)."""
    if desired == 0:
        return ConditionUpdate(
            cond.SPECULATION_APPLIED, "Unknown", Reason.WAITING_FOR_PODS, "no ready serving pod"
        )
    if applied == desired:
        return ConditionUpdate(
            cond.SPECULATION_APPLIED,
            "True",
            Reason.ALL_PODS_APPLIED,
            f"num_draft_tokens={num_draft_tokens} on {applied}/{desired} pods",
        )
    failing = ", ".join(f"{pod}: {message}" for pod, message in sorted(errors.items()))
    return ConditionUpdate(
        cond.SPECULATION_APPLIED,
        "False",
        Reason.PARTIALLY_APPLIED,
        f"num_draft_tokens={num_draft_tokens} on {applied}/{desired} pods; failing: {failing}"[:1000],
    )
