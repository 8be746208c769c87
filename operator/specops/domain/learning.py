"""The control loop's learning: calibration from its own measurements, bounded probes, the slowdown guard.

Each decision of the control loop in the Dynamic phase goes through three steps here, around
`policy.decide`:

1. `observe`: the stable variant's measurement (batch per pod, per-token latency p50,
   alpha) becomes one calibration sample (`calibration.update`) of the setting the pods
   ran, but only once that setting has held for a full rate window plus scrape lag
   (`settle_s`), so no sample mixes two settings;
2. the policy decides from `model(...)`, the roofline prior corrected by those samples;
3. `guard` switches speculation off when measurements show it slower than plain at the
   current load with confidence, whatever the model says; `explore` may then replace the
   decision for one probe duration by a probe (on while off, off while on) within the
   budget of `spec.speculation.exploration`. A probe is not a toggle: the policy's own
   state does not change.

Pure: times come in as datetimes (seconds since the Unix epoch inside the calibration).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from specops.api.status import CalibrationStatistics, CalibrationStatus, ProbeLedgerStatus
from specops.domain.calibration import (
    N_BUCKETS,
    N_PARAMS,
    CalibratedModel,
    CalibrationConfig,
    CalibrationState,
    ProbeConfig,
    ProbeLedger,
    StepSample,
    account,
    budget_allows,
    plan_probe,
    start_probe,
    update,
)
from specops.domain.perf import ModelSetup
from specops.domain.records import replace

BREAK_EVEN_CHANGE = 0.25  # an Event when calibration moves the break-even by more than this share
NO_BREAK_EVEN = 2048  # "none up to 1024" counts as this in that comparison
GUARD_MARGIN = 0.03  # the guard acts below 1 - this measured speedup ...
GUARD_MIN_OFF_SAMPLES = 2.0  # ... when plain speed near the batch rests on this many samples ...
GUARD_STREAK = 3  # ... for this many measurements in a row
GUARD_RELEASE = 0.8  # the guard's hold ends when the batch falls below this share of its batch
MEASURED_FIRST = 2.0  # effective samples of the setting in force near the batch before probing the other
LOAD_SPREAD = 2.0  # a measurement counts only while max/min of the batch over its window stays below this


@dataclass(frozen=True)
class LearningConfig:
    enabled: bool = True  # False: the roofline alone decides, nothing is probed
    guard: bool = True
    settle_s: float = 12.0  # a setting's samples count only after it held this long
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    probes: ProbeConfig = field(default_factory=ProbeConfig)


def settle_seconds(rate_window_s: float, interval_s: float) -> float:
    """How long a new setting holds before a measurement sees only it: one rate window plus two
    decisions (the window's end is one decision old when read)."""
    return rate_window_s + 2.0 * interval_s


def learning_config(
    *,
    enabled: bool,
    guard: bool,
    half_life_s: float,
    max_probe_fraction: float,
    min_spacing_s: float,
    interval_s: float,
    rate_window_s: float,
) -> LearningConfig:
    """A probe lasts one rate window plus three decisions (so it yields clean samples); the budget's
    window is at least one hour and long enough for one probe at the configured fraction."""
    settle = settle_seconds(rate_window_s, interval_s)
    duration = settle + interval_s
    window = 3600.0 if max_probe_fraction <= 0 else duration / max_probe_fraction
    return LearningConfig(
        enabled=enabled,
        guard=guard,
        settle_s=settle,
        calibration=CalibrationConfig(half_life_s=half_life_s),
        probes=ProbeConfig(
            max_fraction=max_probe_fraction,
            budget_window_s=window,
            min_spacing_s=min_spacing_s,
            probe_duration_s=duration,
        ),
    )


@dataclass(frozen=True)
class LearningState:
    """What learning keeps between decisions; persisted in status.speculation.calibration."""

    calibration: CalibrationState = field(default_factory=CalibrationState)
    ledger: ProbeLedger = field(default_factory=ProbeLedger)
    applied_length: int | None = None
    applied_since: datetime | None = None
    probe_length: int | None = None
    last_probe_at: datetime | None = None
    last_probe_length: int | None = None
    last_probe_reason: str | None = None
    slowdown_streak: int = 0
    slowdown_batch: float | None = None
    announced: int | None = None  # break-even at the last announcement (NO_BREAK_EVEN = none)
    announced_known: bool = False
    decided_at: datetime | None = None  # the last decision (for the probe ledger's clock)
    # (seconds since the epoch, batch) of the decisions within the last settle window; kept in
    # memory only (after a restart, measurements wait one window for it to fill again)
    recent_batches: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Observed:
    """The stable variant's measurement, as learning uses it."""

    batch: float
    tpot_s: float | None  # mean per-token latency (p50 where the mean is not measured)
    alpha: float | None
    context_tokens: float | None = None


def model(setup: ModelSetup, state: LearningState, config: LearningConfig) -> CalibratedModel:
    """The calibrated model of this deployment (the roofline exactly while nothing is measured)."""
    return CalibratedModel(setup, state.calibration, config.calibration)


def settled(state: LearningState, config: LearningConfig, now: datetime) -> bool:
    """Whether the last measurement saw only the setting in force (it held a full rate window)."""
    if state.applied_length is None or state.applied_since is None:
        return False
    return (now - state.applied_since).total_seconds() >= config.settle_s


def track_load(state: LearningState, batch: float, config: LearningConfig, now: datetime) -> LearningState:
    """Remember the batch of this decision among those of the last settle window."""
    now_s = now.timestamp()
    settle_s = config.settle_s
    kept = [p for p in state.recent_batches if now_s - p[0] <= settle_s and p[0] < now_s]
    return replace(state, recent_batches=(*kept, (now_s, batch)))


def load_held(state: LearningState, config: LearningConfig, now: datetime) -> bool:
    """Whether this measurement's latency can be paired with its batch.

    The batch is an instant gauge while per-token latency is a rate over the window: right after
    the load moves, the two describe different loads, and pairing them would teach the fit a
    latency the pods never had at that batch. So a measurement counts only when the decisions
    of the window (half of it covered, at least) saw the batch within a factor LOAD_SPREAD.
    """
    points = state.recent_batches
    if not points or now.timestamp() - points[0][0] < config.settle_s / 2:
        return False
    batches = [b for _, b in points]
    low, high = min(batches), max(batches)
    return low > 0 and high / low <= LOAD_SPREAD


def observe(
    state: LearningState, seen: Observed, setup: ModelSetup, config: LearningConfig, now: datetime
) -> LearningState:
    """Add the measurement as a calibration sample when the setting in force has settled and the
    load held over the window (see load_held)."""
    if (
        not config.enabled
        or not settled(state, config, now)
        or not load_held(state, config, now)
        or seen.tpot_s is None
    ):
        return state
    assert state.applied_length is not None
    if state.applied_length > 0 and seen.alpha is None:
        return state
    if seen.batch <= 0:
        return state
    sample = StepSample(seen.batch, state.applied_length, seen.tpot_s, seen.alpha, seen.context_tokens)
    calibration = update(state.calibration, sample, setup, now.timestamp(), config.calibration)
    return replace(state, calibration=calibration)


@dataclass(frozen=True)
class GuardVerdict:
    state: LearningState
    fired: bool = False
    evidence: str = ""
    blind: bool = False
    """Speculation ran settled at a held load, but plain speed near this batch rests on too few
    samples to compare with: a slowdown here is one the guard cannot see (only a new solve of the
    model, with this sample, might)."""


def guard(
    state: LearningState,
    fitted: CalibratedModel,
    seen: Observed,
    decided_length: int,
    config: LearningConfig,
    now: datetime,
) -> GuardVerdict:
    """Measured slowdown: speculation on (not a probe), yet slower than plain at this batch.

    Plain speed comes from the fit where at least GUARD_MIN_OFF_SAMPLES effective samples with
    speculation off lie near this batch; GUARD_STREAK settled measurements in a row below
    1 - GUARD_MARGIN fire it.
    """
    if state.slowdown_batch is not None and seen.batch < GUARD_RELEASE * state.slowdown_batch:
        state = replace(state, slowdown_batch=None)
    length = state.applied_length
    if (
        not config.enabled
        or not config.guard
        or length is None
        or length <= 0
        or decided_length <= 0
        or state.probe_length is not None
        or seen.tpot_s is None
        or seen.tpot_s <= 0
        or not settled(state, config, now)
        or not load_held(state, config, now)
    ):
        return GuardVerdict(state)
    off_samples = fitted.confidence(seen.batch).off
    if off_samples < GUARD_MIN_OFF_SAMPLES:
        return GuardVerdict(replace(state, slowdown_streak=0), blind=True)
    plain_s = fitted.step_s(0, seen.batch, seen.context_tokens)
    measured = plain_s / seen.tpot_s
    if measured >= 1.0 - GUARD_MARGIN:
        return GuardVerdict(replace(state, slowdown_streak=0))
    streak = state.slowdown_streak + 1
    if streak < GUARD_STREAK:
        return GuardVerdict(replace(state, slowdown_streak=streak))
    evidence = (
        f"measured per-token latency {seen.tpot_s * 1e3:.2f} ms at draft length {length} against "
        f"{plain_s * 1e3:.2f} ms plain at batch {seen.batch:.0f} (fitted from {off_samples:.1f} samples "
        f"off near this batch): {measured:.2f}x, {streak} measurements in a row"
    )
    return GuardVerdict(replace(state, slowdown_streak=0, slowdown_batch=seen.batch), True, evidence)


def holds_off(state: LearningState, seen: Observed) -> bool:
    """Whether the guard's hold keeps speculation off at this batch."""
    return state.slowdown_batch is not None and seen.batch >= GUARD_RELEASE * state.slowdown_batch


@dataclass(frozen=True)
class Exploration:
    state: LearningState
    num_draft_tokens: int  # what the pods run over the next interval
    probe: bool
    reason: str = ""


def explore(
    state: LearningState,
    fitted: CalibratedModel,
    *,
    allowed: bool,
    enabled: bool,
    decided_length: int,
    decision_changed: bool,
    alpha: float,
    batch: float,
    bounds: tuple[int, int],
    dt_s: float,
    config: LearningConfig,
    now: datetime,
    probe_share: float = 1.0,
) -> Exploration:
    """Account the last interval, continue a probe in progress, or start one where the model is unsure.

    `probe_share` is the share of token throughput the probe in progress took (a split-fleet
    probe sets only some pods apart): its cost is that share of the interval.
    """
    now_s = now.timestamp()
    ledger = account(state.ledger, now_s, dt_s, probing=state.probe_length is not None)
    if state.probe_length is not None and probe_share < 1.0:
        ledger = replace(ledger, probe_s=ledger.probe_s - dt_s * (1.0 - max(0.0, probe_share)))
    state = replace(state, ledger=ledger)
    reached = (
        state.probe_length is not None
        and decision_changed
        and (decided_length > 0) == (state.probe_length > 0)
    )
    if state.probe_length is not None and (ledger.probing_until_s is None or reached or not allowed):
        # ended: its time is up, or the decision itself switched to the probe's side
        ledger = replace(ledger, probing_until_s=None, last_probe_end_s=now_s)
        state = replace(state, ledger=ledger, probe_length=None)
    if state.probe_length is not None:
        return Exploration(state, state.probe_length, True, state.last_probe_reason or "")
    if not allowed or not config.enabled or config.probes.max_fraction <= 0 or decision_changed:
        return Exploration(state, decided_length, False)
    seen = fitted.confidence(batch)
    unseen = (seen.off if enabled else seen.on) < 0.25  # nothing measured on the other side here
    if unseen and (seen.on if enabled else seen.off) < MEASURED_FIRST:
        # what runs now is measured at this load first: the comparison needs both sides
        return Exploration(state, decided_length, False)
    if (
        not unseen
        and state.applied_since is not None
        and (now - state.applied_since).total_seconds() < config.probes.probe_duration_s
        and state.applied_length == decided_length
    ):
        # a setting just taken is measured by itself first
        return Exploration(state, decided_length, False)
    plan = plan_probe(
        fitted,
        ledger,
        now_s,
        enabled=enabled,
        alpha=alpha,
        batch=batch,
        bounds=bounds,
        current_length=decided_length,
        config=config.probes,
    )
    if not plan.probe or plan.draft_length == decided_length:
        return Exploration(state, decided_length, False)
    if not budget_allows(ledger, now_s, config.probes, urgent=True):
        return Exploration(state, decided_length, False)
    state = replace(
        state,
        ledger=start_probe(ledger, now_s, config.probes),
        probe_length=plan.draft_length,
        last_probe_at=now,
        last_probe_length=plan.draft_length,
        last_probe_reason=plan.reason,
    )
    return Exploration(state, plan.draft_length, True, plan.reason)


def applied(state: LearningState, num_draft_tokens: int, now: datetime) -> LearningState:
    """Record what the pods were set to; a change restarts the settle clock."""
    if state.applied_length == num_draft_tokens and state.applied_since is not None:
        return state
    return replace(state, applied_length=num_draft_tokens, applied_since=now, slowdown_streak=0)


BREAK_EVEN_ALPHA_DECIMALS = 2
"""The break-even shown is the one at alpha to this many decimals (as Events print it)."""
BREAK_EVEN_MEMO_SIZE = 8192
_break_even_memo: OrderedDict[tuple[object, ...], int | None] = OrderedDict()


def break_even(fitted: CalibratedModel, alpha: float, bounds: tuple[int, int]) -> int | None:
    """The model's break-even batch at this alpha, remembered for a model that has not moved.

    The search evaluates the model at about a hundred (length, batch) points, which was half of a
    steady tick's CPU; from one tick to the next a steady deployment's fit moves in its fourth
    digit while the break-even shown is a whole batch (and its solve is kept over a few samples,
    `calibration.refit_due`). The search runs at alpha to BREAK_EVEN_ALPHA_DECIMALS decimals:
    the smoothed alpha moves in its third decimal every tick, which moved the key every tick. A
    model whose parameters agree to THETA_KEY_DIGITS significant digits (`Fit.theta_key`), with
    the same measured octaves, setup, bounds and alpha so rounded, has the break-even already
    found. Bounded (least recently used out): two entries per resource (fitted and prior) fit for
    thousands of resources."""
    alpha = round(alpha, BREAK_EVEN_ALPHA_DECIMALS)
    key = (
        fitted.setup,
        fitted.fit.theta_key,
        fitted.unmeasured_octaves(),
        alpha,
        bounds,
    )
    if key in _break_even_memo:
        _break_even_memo.move_to_end(key)
        return _break_even_memo[key]
    found = _break_even_memo[key] = fitted.break_even_batch(alpha, bounds)
    if len(_break_even_memo) > BREAK_EVEN_MEMO_SIZE:
        _break_even_memo.popitem(last=False)
    return found


def announce(
    state: LearningState, break_even_batch: int | None, prior_break_even_batch: int | None
) -> tuple[LearningState, str | None]:
    """A message when the break-even moved more than BREAK_EVEN_CHANGE since the last announcement
    (the first time: since the roofline prior's)."""
    value = NO_BREAK_EVEN if break_even_batch is None else break_even_batch
    before = state.announced
    if not state.announced_known or before is None:
        before = NO_BREAK_EVEN if prior_break_even_batch is None else prior_break_even_batch
        state = replace(state, announced=before, announced_known=True)
    if abs(value - before) <= BREAK_EVEN_CHANGE * before:
        return state, None

    def text(batch: int) -> str:
        return "none up to 1024" if batch >= NO_BREAK_EVEN else f"batch {batch}"

    message = f"calibration moved the break-even from {text(before)} to {text(value)}"
    return replace(state, announced=value), message


# ------------------------------------------------------------------ status <-> state


def from_status(status: CalibrationStatus, last_decision: datetime | None = None) -> LearningState:
    """The learning state persisted in status (an unreadable fit starts again from the prior)."""
    stats = status.statistics
    calibration = CalibrationState()
    complete = (
        len(stats.xtx) == N_PARAMS * (N_PARAMS + 1) // 2
        and len(stats.xty) == N_PARAMS
        and len(stats.on_counts) == N_BUCKETS
        and len(stats.off_counts) == N_BUCKETS
    )
    if complete:
        calibration = CalibrationState(
            xtx=tuple(stats.xtx),
            xty=tuple(stats.xty),
            yty=stats.yty,
            weight=stats.weight,
            on_counts=tuple(stats.on_counts),
            off_counts=tuple(stats.off_counts),
            samples=status.samples,
            updated_at_s=stats.updated_at,
        )
    led = status.ledger
    ledger = ProbeLedger(
        started_at_s=led.started_at,
        elapsed_s=led.elapsed_seconds,
        probe_s=led.probe_seconds,
        last_probe_end_s=led.last_probe_end,
        probing_until_s=led.probing_until,
        probes=led.probes,
    )
    announced = status.announced_break_even_batch
    return LearningState(
        calibration=calibration,
        ledger=ledger,
        applied_length=status.applied_length,
        applied_since=status.applied_since,
        probe_length=status.probe_length if status.probing else None,
        last_probe_at=status.last_probe_time,
        last_probe_length=status.last_probe_length,
        last_probe_reason=status.last_probe_reason,
        slowdown_streak=status.slowdown_streak,
        slowdown_batch=status.slowdown_batch,
        announced=NO_BREAK_EVEN if announced is None else announced,
        announced_known=status.break_even_known,
        decided_at=last_decision,
    )


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def to_status(
    state: LearningState,
    fitted: CalibratedModel | None,
    config: LearningConfig,
    *,
    batch: float | None,
    break_even_batch: int | None,
    prior_break_even_batch: int | None,
    computed: bool,
) -> CalibrationStatus:
    """status.speculation.calibration for the state (the fit's numbers rounded for reading)."""
    c = state.calibration
    ledger = state.ledger
    source = "calibrated" if config.enabled and c.weight > 0 else "prior"
    confidence = fitted.confidence(batch) if fitted is not None and batch is not None else None
    announced = state.announced if state.announced_known else None
    return CalibrationStatus(
        model_source=source,
        samples=c.samples,
        effective_samples=_round(sum(c.on_counts) + sum(c.off_counts), 2),
        break_even_batch=break_even_batch,
        break_even_known=computed,
        prior_break_even_batch=prior_break_even_batch,
        announced_break_even_batch=None if announced is None or announced >= NO_BREAK_EVEN else announced,
        relative_fit_error=_round(fitted.relative_fit_error()) if fitted is not None else None,
        confidence_on=_round(confidence.on, 2) if confidence is not None else None,
        confidence_off=_round(confidence.off, 2) if confidence is not None else None,
        applied_length=state.applied_length,
        applied_since=state.applied_since,
        probing=state.probe_length is not None,
        probe_length=state.probe_length,
        last_probe_time=state.last_probe_at,
        last_probe_length=state.last_probe_length,
        last_probe_reason=state.last_probe_reason,
        probe_duration_seconds=config.probes.probe_duration_s,
        probe_cost_fraction=_round(ledger.cost_fraction),
        slowdown_streak=state.slowdown_streak,
        slowdown_batch=_round(state.slowdown_batch, 2),
        statistics=CalibrationStatistics(
            xtx=list(c.xtx),
            xty=list(c.xty),
            yty=c.yty,
            weight=c.weight,
            on_counts=list(c.on_counts),
            off_counts=list(c.off_counts),
            updated_at=c.updated_at_s,
        ),
        ledger=ProbeLedgerStatus(
            started_at=ledger.started_at_s,
            elapsed_seconds=round(ledger.elapsed_s, 3),
            probe_seconds=round(ledger.probe_s, 3),
            last_probe_end=ledger.last_probe_end_s,
            probing_until=ledger.probing_until_s,
            probes=ledger.probes,
        ),
    )
