"""A speculation policy that decides from the calibrated model instead of the bare roofline.

Each decision:

1. adds the last interval's sample (batch, length in force, per-token latency, alpha) to
   the calibration (`calibration.update`), and smooths alpha (kept while off);
2. predicts the best length at the observed batch from the calibrated model (the roofline
   prior where nothing has been measured);
3. decides on/off from the expected gain of speculating over the *recent load mix*, not the
   current batch alone: a decayed histogram of batch (half-life `load_half_life_s`) weighs
   the calibrated best speedup at each batch octave. A switch is a commitment for at
   least `min_dwell_s`, so what matters is the load it will meet, and a burst of a few
   minutes past break-even in otherwise low load does not make leaving speculation off
   the better bet. The expected gain must stay past the threshold (off below `1 + margin`,
   on above `1 + margin + hysteresis`) for `switch_evidence` speedup-seconds (a one-sided
   CUSUM). The dwell bounds switches to 3600 / min_dwell_s per hour whatever the load does;
4. otherwise moves the length one step toward the best;
5. runs bounded probes (`calibration.plan_probe`): while off, a spell on where the model is
   unsure or near break-even; while on, a spell off to keep plain speed known. A probe is
   not the policy's choice: it does not count as a switch and does not reset the dwell.

Pure: the clock is passed in as seconds, the state is a small value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from specops.domain.calibration import (
    N_BUCKETS,
    CalibratedModel,
    CalibrationConfig,
    CalibrationState,
    ProbeConfig,
    ProbeLedger,
    StepSample,
    account,
    bucket_of,
    budget_allows,
    max_speedup,
    plan_probe,
    start_probe,
    update,
)
from specops.domain.perf import ModelSetup

PRIOR_ALPHA = 0.7


@dataclass(frozen=True)
class CalibratedPolicyConfig:
    setup: ModelSetup  # the roofline prior, from the spec
    min_length: int = 1
    max_length: int = 8
    initial_length: int = 4
    margin: float = 0.03  # off below 1 + margin ...
    hysteresis: float = 0.05  # ... on above 1 + margin + hysteresis
    min_dwell_s: float = 600.0  # at most six switches an hour
    switch_evidence: float = 5.0  # speedup-seconds past the threshold before a switch
    load_half_life_s: float = 120.0  # how fast the recent load mix forgets
    max_evidence_step_s: float = 60.0  # seconds counted per decision at most (restarts, gaps)
    alpha_smoothing: float = 0.3
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    probes: ProbeConfig = field(default_factory=ProbeConfig)


@dataclass(frozen=True)
class CalibratedPolicyState:
    enabled: bool  # the policy's own choice (a probe does not change it)
    draft_length: int  # the length used while on
    alpha: float | None = None
    calibration: CalibrationState = field(default_factory=CalibrationState)
    ledger: ProbeLedger = field(default_factory=ProbeLedger)
    probe_length: int | None = None  # the length of the probe in progress, if any
    last_toggle_s: float | None = None
    evidence: float = 0.0
    last_decision_s: float | None = None
    # decayed seconds spent, and seconds x log(batch), per batch octave: the recent load mix
    load_weight: tuple[float, ...] = (0.0,) * N_BUCKETS
    load_log_batch: tuple[float, ...] = (0.0,) * N_BUCKETS
    # batch octave of the last on-probe taken while off since the last switch: switching on
    # needs one near the current batch, so a gain is measured there, not only predicted
    confirmed_on_bucket: int | None = None


@dataclass(frozen=True)
class CalibratedDecision:
    state: CalibratedPolicyState
    num_draft_tokens: int  # what the pods run over the next interval
    probe: bool  # that setting is a probe, not the policy's choice
    predicted_speedup: float
    reason: str


@dataclass(frozen=True)
class Measurement:
    """One interval as the operator saw it, and the draft length that was in force."""

    batch: float
    draft_length: int
    tpot_s: float | None
    alpha: float | None
    context_tokens: float | None = None


def model_of(config: CalibratedPolicyConfig, state: CalibratedPolicyState) -> CalibratedModel:
    return CalibratedModel(config.setup, state.calibration, config.calibration)


def decide(
    config: CalibratedPolicyConfig, state: CalibratedPolicyState, seen: Measurement, now_s: float
) -> CalibratedDecision:
    """The next state and what the pods should run over the next interval (0 = off)."""
    lo, hi = max(1, config.min_length), max(config.min_length, config.max_length)
    dt = 0.0 if state.last_decision_s is None else max(0.0, now_s - state.last_decision_s)
    calibration = state.calibration
    if seen.tpot_s is not None:
        sample = StepSample(seen.batch, seen.draft_length, seen.tpot_s, seen.alpha, seen.context_tokens)
        calibration = update(calibration, sample, config.setup, now_s, config.calibration)
    alpha = state.alpha
    if seen.alpha is not None and seen.draft_length > 0:
        a = min(1.0, max(0.0, seen.alpha))
        alpha = a if alpha is None else (1 - config.alpha_smoothing) * alpha + config.alpha_smoothing * a
    ledger = account(state.ledger, now_s, dt, probing=state.probe_length is not None)
    confirmed = state.confirmed_on_bucket
    if seen.draft_length > 0 and not state.enabled:
        confirmed = bucket_of(seen.batch)
    probe_length = state.probe_length if ledger.probing_until_s is not None else None
    state = replace(
        state,
        calibration=calibration,
        alpha=alpha,
        ledger=ledger,
        probe_length=probe_length,
        last_decision_s=now_s,
        confirmed_on_bucket=confirmed,
    )
    state = _add_load(state, seen.batch, max(dt, 1.0), dt, config.load_half_life_s)
    model = model_of(config, state)
    use_alpha = alpha if alpha is not None else PRIOR_ALPHA
    # the length that loses least where none gains: staying on through a burst, use it
    target = max(
        range(lo, hi + 1), key=lambda g: model.predict_speedup(use_alpha, g, seen.batch, seen.context_tokens)
    )
    best_s = expected_speedup(model, state, use_alpha, (lo, hi))

    # on/off: sustained evidence, then the dwell
    counted = min(dt, config.max_evidence_step_s)
    if state.enabled:
        push = (1.0 + config.margin) - best_s
    else:
        push = best_s - (1.0 + config.margin + config.hysteresis)
    evidence = max(0.0, state.evidence + push * counted)
    dwell_ok = state.last_toggle_s is None or now_s - state.last_toggle_s >= config.min_dwell_s
    reason: str
    here = bucket_of(seen.batch)
    unconfirmed = not state.enabled and (confirmed is None or abs(confirmed - here) > 1)
    if evidence >= config.switch_evidence and dwell_ok and unconfirmed:
        # The model says on; measure it at this load first (one probe, within the budget).
        state = replace(state, evidence=evidence)
        if state.probe_length is None and budget_allows(state.ledger, now_s, config.probes, urgent=True):
            state = replace(
                state, ledger=start_probe(state.ledger, now_s, config.probes), probe_length=target
            )
            return CalibratedDecision(state, target, True, best_s, "Probe: confirming a predicted gain")
        reason = "HeldAwaitingMeasurement"
    elif evidence >= config.switch_evidence and dwell_ok:
        enabled = not state.enabled
        state = replace(state, enabled=enabled, last_toggle_s=now_s, evidence=0.0, confirmed_on_bucket=None)
        reason = "SpeculationEnabled" if enabled else "SpeculationDisabledMeasured"
        if enabled:
            state = replace(state, draft_length=target)
    else:
        state = replace(state, evidence=evidence)
        reason = "Held" if evidence > 0 else "BestCalibratedSpeedup"
    if state.enabled:
        step = 1 if target > state.draft_length else -1 if target < state.draft_length else 0
        state = replace(state, draft_length=state.draft_length + step)

    chosen = state.draft_length if state.enabled else 0
    if state.probe_length is not None:
        return CalibratedDecision(state, state.probe_length, True, best_s, "Probing")
    if state.last_toggle_s is not None and now_s - state.last_toggle_s < config.probes.min_spacing_s:
        # just switched on the strength of measurements: no probe back at once
        predicted = model.predict_speedup(use_alpha, chosen, seen.batch, seen.context_tokens)
        return CalibratedDecision(state, chosen, False, predicted, reason)
    plan = plan_probe(
        model,
        state.ledger,
        now_s,
        enabled=state.enabled,
        alpha=use_alpha,
        batch=seen.batch,
        bounds=(lo, hi),
        current_length=chosen,
        config=config.probes,
    )
    if plan.probe and plan.draft_length != chosen:
        ledger = start_probe(state.ledger, now_s, config.probes)
        state = replace(state, ledger=ledger, probe_length=plan.draft_length)
        return CalibratedDecision(state, plan.draft_length, True, best_s, f"Probe: {plan.reason}")
    predicted = model.predict_speedup(use_alpha, chosen, seen.batch, seen.context_tokens)
    return CalibratedDecision(state, chosen, False, predicted, reason)


def expected_speedup(
    model: CalibratedModel, state: CalibratedPolicyState, alpha: float, bounds: tuple[int, int]
) -> float:
    """Mean best predicted speedup (below 1 too) over the recent load mix."""
    total = sum(state.load_weight)
    if total <= 0:
        return 1.0
    value = 0.0
    for weight, log_sum in zip(state.load_weight, state.load_log_batch, strict=True):
        if weight > 0:
            value += weight * max_speedup(model, alpha, math.exp(log_sum / weight), bounds)
    return value / total


def _add_load(
    state: CalibratedPolicyState, batch: float, weight: float, dt: float, half_life_s: float
) -> CalibratedPolicyState:
    factor = 0.5 ** (dt / half_life_s)
    weights = [w * factor for w in state.load_weight]
    logs = [v * factor for v in state.load_log_batch]
    bucket = bucket_of(batch)
    weights[bucket] += weight
    logs[bucket] += weight * math.log(max(1.0, batch))
    return replace(state, load_weight=tuple(weights), load_log_batch=tuple(logs))
