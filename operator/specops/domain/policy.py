"""The speculation policy: when to speculate and with how many draft tokens.

The rollout follows three phases:

- Baseline: speculation off for `baseline_duration_s` while the plain per-token latency
  (p50/p95/p99) and throughput are recorded, so later gains can be measured, not assumed;
- Fixed: speculation on at `initial_length` for `soak_duration_s`, so the acceptance
  (alpha) settles before it steers anything;
- Dynamic: every decision picks the draft length with the best modelled speedup
  (`PolicyConfig.model`: in the operator the roofline calibrated by the deployment's own
  measurements, domain.learning; else `perf.speedup`) at the smoothed alpha and the
  observed batch, and moves to it for a gain of `clear_length_gain` or more, else one step
  toward it when the previous decision wanted the same way too. Speculation goes off when even
  the best length is predicted to gain less than `margin`, and back on only above
  `margin + hysteresis`, never toggling twice within `min_dwell_s`.

Switching back on also needs evidence: while off, each decision adds (predicted best
speedup - on threshold) x seconds since the previous decision to a running sum floored at
zero (a one-sided CUSUM), and speculation returns only once the sum reaches
`enable_evidence`. A clear gain (2x after a burst) qualifies at the next decision; a
marginal one near break-even must persist for minutes, which is what keeps noisy load
around break-even from flapping (`specops bench policy` measures it).

The rules of thumb this replaces ("gains vanish at large batch", "4-8 draft tokens",
"acceptance below 50 % means recalibrate") are all consequences of the same model, so
the policy evaluates the model instead of hard-coding thresholds. `off_above_batch` /
`on_below_batch` let an operator pin the on/off choice to measured batch sizes instead.

Pure: no I/O and no clock; `now` is passed in and the whole state is a small,
serialisable value, kept in the resource's status but for the switch budget and the length
vote, which live in the operator's memory (a restart starts them afresh).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from specops.domain.perf import ModelSetup, speedup
from specops.domain.records import replace

Mode = Literal["auto", "on", "off"]


class SpeedupModel(Protocol):
    """Predicted speedup of draft length g at a batch (1.0 for g = 0)."""

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float: ...


Phase = Literal["Baseline", "Fixed", "Dynamic"]

# Used until the first acceptance is measured. 0.7 is a middling per-token acceptance for a
# same-family draft of 5-10 % of the target's size: high enough to try short lengths at low
# batch, low enough not to promise long ones.
PRIOR_ALPHA = 0.7


@dataclass(frozen=True)
class PolicyConfig:
    """What the spec asks for, plus the performance model of this deployment."""

    mode: Mode
    initial_length: int
    min_length: int
    max_length: int  # already clipped to the engine's max_draft_len by the caller
    baseline_duration_s: float  # Baseline phase: speculation off, recording
    soak_duration_s: float  # Fixed phase at initial_length
    setup: ModelSetup
    margin: float = 0.05  # off when the best predicted speedup < 1 + margin
    hysteresis: float = 0.10  # on again only above 1 + margin + hysteresis
    # a length change only for a modelled gain over the current length of more than this share:
    # near its best the speedup is flat in the length, and noise moved the best back and forth;
    # every change is a reload of each pod's settings, a status write and an Event (3 %, not 1 %:
    # over the policy worlds 5.6 changes an hour instead of 9.0, mean ratio 0.982 against 0.983)
    length_margin: float = 0.03
    # ... and a change for a gain below this share waits for a second decision in a row that wants
    # the same way (`_confirmed_step`); a clear gain (a burst, a ramp) steps at once
    clear_length_gain: float = 0.10
    min_dwell_s: float = 60.0  # minimum time between two on/off toggles
    off_above_batch: float | None = None  # explicit override of the model's on/off choice
    on_below_batch: float | None = None  # (either alone serves as both limits)
    alpha_smoothing: float = 0.3  # EWMA weight of a new alpha sample
    min_acceptance: float | None = None  # SLO floor on alpha; only changes the reported reason
    # Off for low acceptance this long: switch on at the shortest length to measure alpha again.
    reprobe_after_s: float = 600.0
    enable_evidence: float = 5.0  # speedup-seconds above the on threshold needed to switch back on
    # The draft is stale for the target in service and spec.retraining.whileStale is off.
    draft_stale_off: bool = False
    # The draft in service has not passed its lossless check (a resource's first draft).
    draft_unchecked_off: bool = False
    # The speedup model the decisions use; None = the roofline of `setup` (domain.calibration
    # supplies one corrected by the deployment's own measurements).
    model: SpeedupModel | None = None
    # The gain a switch on counts as assured where the budget could not pay the way back off (the
    # calibrated fit's lower bound, `CalibratedModel.assured`): a length or batch the fit barely
    # measured must not lock speculation on. None = `model`.
    assured_model: SpeedupModel | None = None
    # Switch budget: at most this many on/off switches in any window of 60 x min_dwell_s (an hour
    # at the default dwell): a bucket of `switch_burst` credits refilling at the rest's rate; a
    # switch off also keeps one credit to come back on. None disables it.
    max_switches_per_window: float | None = 6.0
    switch_burst: float = 3.0
    # Switching on when the budget could not pay the way back off needs this much more gain:
    # speculation stuck on through a burst costs more than a marginal gain returns.
    locked_on_gain: float = 0.2


@dataclass(frozen=True)
class Baseline:
    """Plain-decoding reference recorded in the Baseline phase (running means of the samples)."""

    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    tokens_per_s: float | None
    samples: int


@dataclass(frozen=True)
class Observation:
    """One fresh measurement of one variant; stale or missing data never reaches `decide`."""

    batch: float
    alpha: float | None
    tpot_p50_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_p99_s: float | None = None
    tokens_per_s: float | None = None
    context_tokens: float | None = None


@dataclass(frozen=True)
class PolicyState:
    """Everything the policy remembers between decisions; persisted in the resource's status."""

    phase: Phase
    phase_since: datetime
    enabled: bool
    draft_length: int
    alpha: float | None
    last_toggle: datetime | None
    baseline: Baseline | None
    enable_evidence: float = 0.0  # CUSUM of predicted gain above the on threshold while off
    evidence_at: datetime | None = None  # when enable_evidence was last updated
    switch_credit: float | None = None  # switch budget left at credit_at (None = full)
    credit_at: datetime | None = None
    # +1 / -1: the last decision, speculating, wanted a longer / shorter draft; 0: neither. A length
    # steps only when a second decision in a row wants the same way (`_confirmed_step`). Kept in
    # the operator's memory, not in status: a restart forgets it and costs one decision's delay.
    length_vote: int = 0


@dataclass(frozen=True)
class Decision:
    """The next state, what every pod should run now, and why (`changed` => emit an Event)."""

    state: PolicyState
    num_draft_tokens: int
    reason: str
    message: str
    predicted_speedup: float
    changed: bool


def initial_state(config: PolicyConfig, now: datetime) -> PolicyState:
    """A fresh resource starts recording its baseline with speculation off."""
    return PolicyState(
        phase="Baseline",
        phase_since=now,
        enabled=False,
        draft_length=_clamp(config.initial_length, *_length_bounds(config)),
        alpha=None,
        last_toggle=None,
        baseline=None,
    )


def measured_speedup(baseline: Baseline | None, observation: Observation) -> float | None:
    """Baseline p50 TPOT / current p50 TPOT: >1 means tokens now stream faster than without speculation.

    It compares two moments, so a changed load confounds it; it is reported next to the
    modelled speedup as evidence, and never drives the decision.
    """
    if baseline is None or baseline.p50_s is None or observation.tpot_p50_s is None:
        return None
    if baseline.p50_s <= 0 or observation.tpot_p50_s <= 0:
        return None
    return baseline.p50_s / observation.tpot_p50_s


STEADY_REASONS = frozenset(
    {"BestModelledSpeedup", "SpeculationDisabledHighBatch", "SpeculationDisabledNoMeasuredGain"}
)
"""Decisions that hold by themselves while their inputs hold: on at the modelled best length, or off
because the batch is past break-even. Every other reason waits on a clock (a dwell, a budget's
credit, evidence accruing, a re-probe, a phase) or on a second vote."""

REST_LATENCY_TOLERANCE = 0.10
"""A token latency up to this much slower than at a steady decision is noise (see ``slower``)."""


WAITING_REASONS = frozenset({"HeldAwaitingEvidence", "HeldSwitchBudget", "HeldMinDwell"})
"""Decisions that change nothing while they wait on a clock: evidence accruing, a switch budget's
credit, the minimum dwell. Each decision moves the clock and says the same until the wait is over."""


def steady(decision: Decision, *, voting: bool = False, waiting: bool = False) -> bool:
    """Whether a Dynamic decision would come out the same for the same inputs at any later moment:
    it changed nothing, is one of STEADY_REASONS, and holds no pending length vote or evidence.

    `voting`: a pending length vote is allowed too. Such a decision is a rest's to keep: the next
    decision either confirms the vote (a length change, which a look hands to a full tick) or
    drops it, and until then a full tick writes and applies nothing a rest does not.

    `waiting`: so are the WAITING_REASONS, and evidence accrued or draining while speculation
    is off. Such a decision is the same each time until its clock runs out, and then it switches:
    a rest's look decides again every interval (its clock moved, as at a full tick) and hands the
    switch to a full tick. Deciding these in full every interval was most of the full ticks of a
    fleet at rest (`specops bench tick`: 325 of 808 in 40 cycles of 200 resources paced as 2,000)."""
    state = decision.state
    if decision.changed or state.phase != "Dynamic" or not (voting or state.length_vote == 0):
        return False
    if waiting:
        return decision.reason in STEADY_REASONS or decision.reason in WAITING_REASONS
    return decision.reason in STEADY_REASONS and state.enable_evidence == 0.0


def slower(decided_s: float | None, now_s: float | None) -> bool:
    """Whether the token latency reads slower than at a decision by more than its noise (or
    appeared where the decision had none): what the measured-slowdown guard watches, so a tick must
    look, whatever the policy alone would decide. A faster reading threatens nothing a decision
    guards against, and neither does a reading gone: no request finished in the window (an idle
    pod), and a full tick could judge nothing either (learning and the guard wait for a reading).

    The latency is the one learning and the guard read (`ControlLoop`'s ``_seen``): the mean where
    the engine measures one (the histogram's sum over its count, exact), else the median. The
    median is interpolated within a histogram bucket, and a bucket's edges are further apart
    than the tolerance: at 2,000 noisy pods, comparing medians ended 50 rests a cycle, half of
    all the rests that ended, on readings whose mean had not moved."""
    if now_s is None:
        return False
    if decided_s is None:
        return True
    return now_s > decided_s * (1.0 + REST_LATENCY_TOLERANCE)


def decide(config: PolicyConfig, state: PolicyState, observation: Observation, now: datetime) -> Decision:
    """The next state and the draft length every pod should run now (0 = speculation off)."""
    if config.mode == "off" or config.draft_stale_off or config.draft_unchecked_off:
        return _forced_off(config, state, observation, now)
    if config.mode == "on":
        return _forced_on(config, state, observation, now)
    if state.phase == "Baseline":
        return _baseline(config, state, observation, now)
    if state.phase == "Fixed":
        return _fixed(config, state, observation, now)
    return _dynamic(config, state, observation, now, entered_dynamic=False)


# --- phases -------------------------------------------------------------------------------------


def _baseline(config: PolicyConfig, state: PolicyState, obs: Observation, now: datetime) -> Decision:
    baseline = _accumulate(state.baseline, obs)
    elapsed = _seconds(now, state.phase_since)
    if elapsed < config.baseline_duration_s:
        next_state = replace(state, enabled=False, baseline=baseline)
        return _decision(
            state,
            next_state,
            "BaselineRecording",
            f"Recording the baseline with speculation off: {elapsed:.0f}/{config.baseline_duration_s:.0f} s, "
            f"{baseline.samples} samples{_p50_text(baseline)}.",
            1.0,
        )
    length = _clamp(config.initial_length, *_length_bounds(config))
    next_state = replace(
        state,
        phase="Fixed",
        phase_since=now,
        enabled=True,
        draft_length=length,
        last_toggle=now,
        baseline=baseline,
    )
    alpha = state.alpha if state.alpha is not None else PRIOR_ALPHA
    return _decision(
        state,
        next_state,
        "FixedSoak",
        f"Baseline recorded ({baseline.samples} samples{_p50_text(baseline)}); "
        f"speculating at the initial draft length {length} for {config.soak_duration_s:.0f} s.",
        _speedup(config, obs, alpha, obs.batch, length),
    )


def _fixed(config: PolicyConfig, state: PolicyState, obs: Observation, now: datetime) -> Decision:
    alpha, _ = _smooth_alpha(state.alpha, obs.alpha, config.alpha_smoothing)
    elapsed = _seconds(now, state.phase_since)
    if elapsed >= config.soak_duration_s:
        entered = replace(state, phase="Dynamic", phase_since=now)
        return _dynamic(config, entered, obs, now, entered_dynamic=True, previous=state)
    length = _clamp(config.initial_length, *_length_bounds(config))
    next_state = replace(state, enabled=True, draft_length=length, alpha=alpha)
    shown_alpha = alpha if alpha is not None else PRIOR_ALPHA
    return _decision(
        state,
        next_state,
        "FixedSoak",
        f"Soaking draft length {length}: {elapsed:.0f}/{config.soak_duration_s:.0f} s, "
        f"smoothed alpha {_alpha_text(alpha)}.",
        _speedup(config, obs, shown_alpha, obs.batch, length),
    )


def _dynamic(
    config: PolicyConfig,
    state: PolicyState,
    obs: Observation,
    now: datetime,
    *,
    entered_dynamic: bool,
    previous: PolicyState | None = None,
) -> Decision:
    before = previous if previous is not None else state
    alpha, prior_note = _smooth_alpha(state.alpha, obs.alpha, config.alpha_smoothing)
    use_alpha = alpha if alpha is not None else PRIOR_ALPHA
    lo, hi = _length_bounds(config)
    target, target_speedup = _best_length(config, obs, use_alpha, obs.batch, lo, hi)
    current = _clamp(state.draft_length, lo, hi)
    vote = state.length_vote  # counts only between two decisions in a row that both speculate
    state = replace(state, alpha=alpha, draft_length=current, length_vote=0)
    state = _update_evidence(config, state, target_speedup, now)
    prefix = "Entered the dynamic phase. " if entered_dynamic else ""
    facts = f"batch {obs.batch:.0f}, alpha {use_alpha:.2f}{prior_note}"

    def hold(reason: str, message: str) -> Decision:
        length = current if state.enabled else 0
        return _decision(
            before, state, reason, prefix + message, _speedup(config, obs, use_alpha, obs.batch, length)
        )

    want_on, why = _wants_on(config, state.enabled, obs.batch, target_speedup)
    if (
        want_on
        and not state.enabled
        and not _overridden(config)
        and state.enable_evidence < config.enable_evidence
    ):
        return hold(
            "HeldAwaitingEvidence",
            f"Speculation stays off until the gain persists ({why}; evidence "
            f"{state.enable_evidence:.1f}/{config.enable_evidence:.1f} speedup-seconds; {facts}).",
        )
    if want_on != state.enabled:
        since = None if state.last_toggle is None else _seconds(now, state.last_toggle)
        if since is not None and since < config.min_dwell_s:
            return hold(
                "HeldMinDwell",
                f"Would switch speculation {'on' if want_on else 'off'} ({why}; {facts}) but the last "
                f"switch was {since:.0f} s ago, less than the {config.min_dwell_s:.0f} s minimum dwell.",
            )
        credit = _switch_credit(config, state, now)
        needed = 1.0 if want_on else 2.0  # off keeps one credit to come back on
        if (
            want_on
            and credit is not None
            and credit < 3.0
            and _assured(config, obs, use_alpha, lo, hi, target_speedup)
            < 1.0 + config.margin + config.hysteresis + config.locked_on_gain
        ):
            needed = 3.0  # on with no credit left to go off again: only for a clear gain
        if credit is not None and credit < needed and not _overridden(config):
            # held on where no length pays: at least run the length that loses least
            length = _step_toward(current, target) if state.enabled else 0
            return _decision(
                before,
                replace(state, draft_length=length if state.enabled else current),
                "HeldSwitchBudget",
                f"{prefix}Would switch speculation {'on' if want_on else 'off'} ({why}; {facts}) but the "
                f"switch budget ({config.max_switches_per_window:.0f} per {60 * config.min_dwell_s:.0f} s) "
                f"has {credit:.2f} credits, {needed:.0f} needed.",
                _speedup(config, obs, use_alpha, obs.batch, length),
            )
        if credit is not None:
            state = replace(state, switch_credit=credit - 1.0, credit_at=now)
        if want_on:
            length = _step_toward(current, target)
            next_state = replace(
                state,
                enabled=True,
                draft_length=length,
                last_toggle=now,
                enable_evidence=0.0,
                evidence_at=None,
            )
            return _decision(
                before,
                next_state,
                "SpeculationEnabledLowBatch",
                f"{prefix}Speculation on at draft length {length} ({why}; {facts}).",
                _speedup(config, obs, use_alpha, obs.batch, length),
            )
        next_state = replace(state, enabled=False, last_toggle=now, enable_evidence=0.0, evidence_at=now)
        return _decision(
            before,
            next_state,
            _off_reason(config, obs, use_alpha, lo, hi),
            f"{prefix}Speculation off ({why}; {facts}).",
            1.0,
        )

    if not state.enabled:
        off_reason = _off_reason(config, obs, use_alpha, lo, hi)
        off_for = None if state.last_toggle is None else _seconds(now, state.last_toggle)
        if (
            off_reason == "SpeculationDisabledLowAcceptance"
            and not _overridden(config)
            and off_for is not None
            and off_for >= config.reprobe_after_s
            and _speedup(config, obs, PRIOR_ALPHA, obs.batch, lo) > 1.0 + config.margin + config.hysteresis
        ):
            # Alpha cannot be measured while speculation is off; without a probe a passing dip in
            # acceptance would keep it off for good. Forget the old estimate and measure again.
            next_state = replace(
                state,
                enabled=True,
                draft_length=lo,
                alpha=None,
                last_toggle=now,
                enable_evidence=0.0,
                evidence_at=None,
            )
            return _decision(
                before,
                next_state,
                "ProbingAcceptance",
                f"Speculation was off for low acceptance for {off_for:.0f} s; probing at draft length {lo} "
                f"to measure acceptance again ({facts}).",
                _speedup(config, obs, PRIOR_ALPHA, obs.batch, lo),
            )
        return hold(off_reason, f"Speculation stays off ({why}; {facts}).")

    current_speedup = _speedup(config, obs, use_alpha, obs.batch, current)
    if target != current and target_speedup < current_speedup * (1.0 + config.length_margin):
        target = current  # within the margin of the modelled best: not worth a change
    clear = target_speedup >= current_speedup * (1.0 + config.clear_length_gain)
    length, vote = _confirmed_step(vote, current, target, clear=clear)
    next_state = replace(state, draft_length=length, length_vote=vote)
    predicted = current_speedup if length == current else _speedup(config, obs, use_alpha, obs.batch, length)
    if length != current:
        reason = "DraftLengthIncreased" if length > current else "DraftLengthDecreased"
        message = (
            f"{prefix}Draft length {current} -> {length} toward the modelled best {target} "
            f"({target_speedup:.2f}x; {facts})."
        )
    elif config.min_acceptance is not None and use_alpha < config.min_acceptance:
        reason = "AcceptanceBelowSLO"
        message = (
            f"{prefix}Smoothed alpha {use_alpha:.2f} is below the {config.min_acceptance:.2f} floor; "
            f"the draft needs recalibration. Keeping draft length {length} ({predicted:.2f}x; {facts})."
        )
    elif target != current:  # the reason stays: a vote alone is no news worth a status write
        reason = "BestModelledSpeedup"
        message = (
            f"{prefix}Draft length {length} kept ({predicted:.2f}x): the modelled best {target} "
            f"({target_speedup:.2f}x) must win the next decision too before a change ({facts})."
        )
    else:
        reason = "BestModelledSpeedup"
        message = f"{prefix}Draft length {length} is the modelled best ({predicted:.2f}x; {facts})."
    return _decision(before, next_state, reason, message, predicted)


def _update_evidence(
    config: PolicyConfig, state: PolicyState, best_speedup: float, now: datetime
) -> PolicyState:
    """While off, add (best speedup - on threshold) x elapsed seconds, floored at 0 (one-sided CUSUM).

    Elapsed time is capped at `min_dwell_s` so a long gap between decisions (an operator
    restart) does not count as sustained evidence.
    """
    if state.enabled:
        return replace(state, enable_evidence=0.0, evidence_at=None)
    elapsed = 0.0 if state.evidence_at is None else _seconds(now, state.evidence_at)
    elapsed = min(max(0.0, elapsed), config.min_dwell_s)
    on_threshold = 1.0 + config.margin + config.hysteresis
    evidence = max(0.0, state.enable_evidence + (best_speedup - on_threshold) * elapsed)
    return replace(state, enable_evidence=evidence, evidence_at=now)


def switch_allowed(config: PolicyConfig, state: PolicyState, now: datetime, *, on: bool) -> bool:
    """Whether the switch budget allows switching on (one credit) or off (two: one stays to return)."""
    credit = _switch_credit(config, state, now)
    return credit is None or _overridden(config) or credit >= (1.0 if on else 2.0)


def spend_switch(config: PolicyConfig, state: PolicyState, now: datetime) -> PolicyState:
    """The state after one switch made outside `decide` (the measured-slowdown guard's)."""
    credit = _switch_credit(config, state, now)
    return state if credit is None else replace(state, switch_credit=credit - 1.0, credit_at=now)


def _switch_credit(config: PolicyConfig, state: PolicyState, now: datetime) -> float | None:
    """Switch credits available now: the bucket refilled since the last switch (None: no budget)."""
    if config.max_switches_per_window is None:
        return None
    burst = min(config.switch_burst, config.max_switches_per_window)
    if state.switch_credit is None or state.credit_at is None:
        return burst
    window = max(1e-9, 60.0 * config.min_dwell_s)
    rate = max(0.0, config.max_switches_per_window - burst) / window
    return min(burst, state.switch_credit + rate * max(0.0, _seconds(now, state.credit_at)))


def _forced_off(config: PolicyConfig, state: PolicyState, obs: Observation, now: datetime) -> Decision:
    """Speculation off by request. The rollout is suspended; a Baseline phase keeps recording
    (its conditions hold), a Fixed soak restarts once auto resumes."""
    if state.phase == "Baseline":
        next_state = replace(state, enabled=False, baseline=_accumulate(state.baseline, obs))
    else:
        phase_since = now if state.phase == "Fixed" else state.phase_since
        next_state = replace(state, enabled=False, phase_since=phase_since)
    if state.enabled:
        next_state = replace(next_state, last_toggle=now)
    if config.mode != "off" and config.draft_unchecked_off:
        return _decision(
            state,
            next_state,
            "SpeculationOffDraftUnchecked",
            "the draft has not passed its lossless check (golden prompts with speculation on and off); "
            "speculation off until it does",
            1.0,
        )
    if config.mode != "off":  # the stale-draft rule, not the spec's mode
        return _decision(
            state,
            next_state,
            "SpeculationOffDraftStale",
            "draft is stale for this target version; speculation off until a retrained draft is promoted",
            1.0,
        )
    return _decision(
        state, next_state, "ForcedOff", "Speculation is off because the spec says mode: off.", 1.0
    )


def _forced_on(config: PolicyConfig, state: PolicyState, obs: Observation, now: datetime) -> Decision:
    """Speculation on by request, at the model's best length (never 0). The Baseline and Fixed
    clocks restart, since neither phase's conditions hold while forced on."""
    alpha, prior_note = _smooth_alpha(state.alpha, obs.alpha, config.alpha_smoothing)
    use_alpha = alpha if alpha is not None else PRIOR_ALPHA
    lo, hi = _length_bounds(config)
    length, predicted = _best_length(config, obs, use_alpha, obs.batch, lo, hi)
    phase_since = now if state.phase in ("Baseline", "Fixed") else state.phase_since
    next_state = replace(
        state,
        enabled=True,
        draft_length=length,
        alpha=alpha,
        phase_since=phase_since,
        last_toggle=state.last_toggle if state.enabled else now,
    )
    return _decision(
        state,
        next_state,
        "ForcedOn",
        f"Speculation is on because the spec says mode: on; draft length {length} is the modelled best "
        f"({predicted:.2f}x; batch {obs.batch:.0f}, alpha {use_alpha:.2f}{prior_note}).",
        predicted,
    )


# --- helpers ------------------------------------------------------------------------------------


def _assured(
    config: PolicyConfig, obs: Observation, alpha: float, lo: int, hi: int, predicted: float
) -> float:
    """The best gain any length in [lo, hi] has by the assured model (its lower bound: a length the
    fit measured here counts, one it only extrapolates to does not), else the predicted best."""
    if config.assured_model is None:
        return predicted
    model = config.assured_model
    best = max(model.predict_speedup(alpha, g, obs.batch, obs.context_tokens) for g in range(lo, hi + 1))
    return min(predicted, best)


def _overridden(config: PolicyConfig) -> bool:
    return config.off_above_batch is not None or config.on_below_batch is not None


def _wants_on(config: PolicyConfig, enabled: bool, batch: float, best_speedup: float) -> tuple[bool, str]:
    """The on/off choice and why; explicit batch limits replace the model's choice when set."""
    if _overridden(config):
        off_above = config.off_above_batch if config.off_above_batch is not None else config.on_below_batch
        on_below = config.on_below_batch if config.on_below_batch is not None else config.off_above_batch
        assert off_above is not None and on_below is not None
        if batch > off_above:
            return False, f"batch above the configured {off_above:.0f}"
        if batch < on_below:
            return True, f"batch below the configured {on_below:.0f}"
        return enabled, f"batch between the configured {on_below:.0f} and {off_above:.0f}"
    off_below = 1.0 + config.margin
    on_above = off_below + config.hysteresis
    if enabled:
        if best_speedup < off_below:
            return False, f"best predicted speedup {best_speedup:.2f}x < {off_below:.2f}x"
        return True, f"best predicted speedup {best_speedup:.2f}x >= {off_below:.2f}x"
    if best_speedup > on_above:
        return True, f"best predicted speedup {best_speedup:.2f}x > {on_above:.2f}x"
    return False, f"best predicted speedup {best_speedup:.2f}x <= {on_above:.2f}x"


def _off_reason(config: PolicyConfig, obs: Observation, alpha: float, lo: int, hi: int) -> str:
    """High batch when speculation would still pay unbatched at this alpha; with a calibrated model
    that finds no gain even unbatched where the roofline would, no measured gain (the engine's
    costs, not the acceptance); low acceptance otherwise."""
    if _overridden(config):
        return "SpeculationDisabledHighBatch"
    _, unbatched = _best_length(config, obs, alpha, 1.0, lo, hi)
    if unbatched >= 1.0 + config.margin:
        return "SpeculationDisabledHighBatch"
    if config.model is not None:
        roofline = max(speedup(_setup_for(config, obs), alpha, 1.0, g) for g in range(lo, hi + 1))
        if roofline >= 1.0 + config.margin:
            return "SpeculationDisabledNoMeasuredGain"
    return "SpeculationDisabledLowAcceptance"


def _best_length(
    config: PolicyConfig, obs: Observation, alpha: float, batch: float, lo: int, hi: int
) -> tuple[int, float]:
    """The length in [lo, hi] with the highest modelled speedup (ties to the shorter), and that speedup.

    A model that tabulates (`CalibratedModel.speedup_table`) is asked for its table once, not once
    per length: this is most of a decision's cost, and a decision is most of a resting tick's."""
    table = getattr(config.model, "speedup_table", None)
    if table is not None and (lo, hi) == _length_bounds(config):
        speedups: Sequence[float] = table(alpha, batch, lo, hi, obs.context_tokens)
    else:
        speedups = [_speedup(config, obs, alpha, batch, g) for g in range(lo, hi + 1)]
    best_g, best_s = lo, speedups[0]
    for g, s in enumerate(speedups[1:], start=lo + 1):
        if s > best_s:
            best_g, best_s = g, s
    return best_g, best_s


def _confirmed_step(vote: int, current: int, target: int, *, clear: bool) -> tuple[int, int]:
    """The length after this decision, and its vote: `target` itself when the gain is `clear`, one
    step toward it when the previous decision wanted the same way too.

    The best length follows each decision's batch reading, and where the speedup is flat in the
    length a few per cent of noise moves it back and forth: every step is an Event, a status write
    and a settings reload on every pod. A real change of load keeps wanting the same way and pays
    one decision's delay at most. A clear gain goes all the way in one change: walked one length
    at a time, a move from 6 to 2 took four changes, each with its Event, write and reload, and
    four settle windows at lengths the model already ranked worse (over the policy worlds the
    worst seed's ratio to the oracle rose from 0.888 to 0.946, length changes fell from 14.1 to
    8.8 an hour)."""
    way = (target > current) - (target < current)
    if way and clear:
        return target, way
    if way and vote == way:
        return _step_toward(current, target), way
    return current, way


def _smooth_alpha(smoothed: float | None, sample: float | None, weight: float) -> tuple[float | None, str]:
    """EWMA of alpha; a missing sample (nothing drafted) keeps the old value. The note flags the prior."""
    if sample is None:
        if smoothed is None:
            return None, f" (prior, nothing measured yet: {PRIOR_ALPHA:.2f})"
        return smoothed, ""
    sample = min(1.0, max(0.0, sample))
    if smoothed is None:
        return sample, ""
    return (1.0 - weight) * smoothed + weight * sample, ""


def _accumulate(baseline: Baseline | None, obs: Observation) -> Baseline:
    """Running means of the plain-decoding latency percentiles and throughput."""
    old = baseline if baseline is not None else Baseline(None, None, None, None, 0)
    n = old.samples

    def mean(previous: float | None, sample: float | None) -> float | None:
        if sample is None:
            return previous
        if previous is None:
            return sample
        return previous + (sample - previous) / (n + 1)

    return Baseline(
        p50_s=mean(old.p50_s, obs.tpot_p50_s),
        p95_s=mean(old.p95_s, obs.tpot_p95_s),
        p99_s=mean(old.p99_s, obs.tpot_p99_s),
        tokens_per_s=mean(old.tokens_per_s, obs.tokens_per_s),
        samples=n + 1,
    )


def _decision(
    before: PolicyState, after: PolicyState, reason: str, message: str, predicted: float
) -> Decision:
    tokens = _draft_tokens(after)
    changed = tokens != _draft_tokens(before) or after.phase != before.phase
    return Decision(after, tokens, reason, message, predicted, changed)


def _draft_tokens(state: PolicyState) -> int:
    return state.draft_length if state.enabled else 0


def _speedup(config: PolicyConfig, obs: Observation, alpha: float, batch: float, length: int) -> float:
    """Modelled speedup of `length` at `batch`: the configured model, else the roofline.

    A model that tabulates every length at a batch in one pass (`CalibratedModel.speedup_table`)
    is asked for its table: a decision evaluates each length at the same batch and alpha."""
    model = config.model
    if model is not None:
        lo, hi = _length_bounds(config)
        table = getattr(model, "speedup_table", None)
        if table is not None and lo <= length <= hi:
            speedups: tuple[float, ...] = table(alpha, batch, lo, hi, obs.context_tokens)
            return speedups[length - lo]
        return model.predict_speedup(alpha, length, batch, obs.context_tokens)
    return speedup(_setup_for(config, obs), alpha, batch, length)


def _setup_for(config: PolicyConfig, obs: Observation) -> ModelSetup:
    if obs.context_tokens is None:
        return config.setup
    return config.setup.with_context(obs.context_tokens)


def _length_bounds(config: PolicyConfig) -> tuple[int, int]:
    """[lo, hi] of lengths used while on; 0 is never a length, it is 'off'."""
    lo = max(1, config.min_length)
    return lo, max(lo, config.max_length)


def _clamp(value: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, value))


def _step_toward(current: int, target: int) -> int:
    if target > current:
        return current + 1
    if target < current:
        return current - 1
    return current


def _seconds(now: datetime, since: datetime) -> float:
    return (now - since).total_seconds()


def _alpha_text(alpha: float | None) -> str:
    return f"{alpha:.2f}" if alpha is not None else f"not measured yet (prior {PRIOR_ALPHA:.2f})"


def _p50_text(baseline: Baseline) -> str:
    return f", p50 TPOT {baseline.p50_s * 1000:.1f} ms" if baseline.p50_s is not None else ""
