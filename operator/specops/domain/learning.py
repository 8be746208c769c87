"""The control loop's learning: calibration from its own measurements.

`observe` turns the stable variant's measurement (batch per pod, mean per-token latency,
alpha) into one calibration sample (`calibration.update`) of the draft length the engine used
at that batch, but only once that setting has held for a full rate window plus scrape lag
(`settle_s`) and the load held over the window, so no sample mixes two settings. The fitted
model (`model`) is the prior corrected by those samples; `break_even` and `announce` report
where it crosses 1.

Pure: times come in as datetimes (seconds since the Unix epoch inside the calibration).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from specops.api.status import BandAnchorStatus, CalibrationStatistics, CalibrationStatus
from specops.domain.calibration import (
    N_BUCKETS,
    N_PARAMS,
    CalibratedModel,
    CalibrationConfig,
    CalibrationState,
    StepSample,
    update,
)
from specops.domain.engines.schedule import Revision
from specops.domain.perf import ModelSetup, expected_tokens
from specops.domain.records import replace

BREAK_EVEN_CHANGE = 0.25  # an Event when calibration moves the break-even by more than this share
NO_BREAK_EVEN = 2048  # "none up to 1024" counts as this in that comparison
LOAD_SPREAD = 2.0  # a measurement counts only while max/min of the batch over its window stays below this


@dataclass(frozen=True)
class LearningConfig:
    enabled: bool = True  # False: the prior alone decides
    guard: bool = True
    settle_s: float = 12.0  # a setting's samples count only after it held this long
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)


def settle_seconds(rate_window_s: float, interval_s: float) -> float:
    """How long a new setting holds before a measurement sees only it: one rate window plus two
    decisions (the window's end is one decision old when read)."""
    return rate_window_s + 2.0 * interval_s


def learning_config(
    *, enabled: bool, guard: bool, half_life_s: float, interval_s: float, rate_window_s: float
) -> LearningConfig:
    """Samples settle for one rate window plus two decisions; the fit's half-life from the spec."""
    return LearningConfig(
        enabled=enabled,
        guard=guard,
        settle_s=settle_seconds(rate_window_s, interval_s),
        calibration=CalibrationConfig(half_life_s=half_life_s),
    )


@dataclass(frozen=True)
class LearningState:
    """What learning keeps between decisions; persisted in status.speculation.calibration."""

    calibration: CalibrationState = field(default_factory=CalibrationState)
    applied_length: int | None = None
    applied_since: datetime | None = None
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


def applied(state: LearningState, draft_length: int, now: datetime) -> LearningState:
    """Record what the pods were set to; a change restarts the settle clock."""
    if state.applied_length == draft_length and state.applied_since is not None:
        return state
    return replace(state, applied_length=draft_length, applied_since=now)


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
    announced = status.announced_break_even_batch
    return LearningState(
        calibration=calibration,
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
    source = "calibrated" if config.enabled and c.weight > 0 else "prior"
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
        statistics=CalibrationStatistics(
            xtx=list(c.xtx),
            xty=list(c.xty),
            yty=c.yty,
            weight=c.weight,
            on_counts=list(c.on_counts),
            off_counts=list(c.off_counts),
            updated_at=c.updated_at_s,
        ),
    )


# ------------------------------------------------------------------ per-pod readings


@dataclass(frozen=True)
class PodReading:
    """One pod's window: the revision it runs, its batch and mean per-token latency, its acceptance."""

    pod: str
    revision: Revision
    batch: float
    tpot_s: float | None
    alpha: float | None


@dataclass(frozen=True)
class PodTrack:
    """What learning remembers of one pod between decisions (in memory only)."""

    revision: str
    since: datetime
    batches: tuple[tuple[float, float], ...] = ()
    """(seconds since the epoch, batch) of the decisions within the last settle window."""


def track_pods(
    tracks: Mapping[str, PodTrack], readings: Sequence[PodReading], config: LearningConfig, now: datetime
) -> dict[str, PodTrack]:
    """Each reading's pod: since when it runs its revision, and its recent batches (gone pods drop out)."""
    now_s = now.timestamp()
    kept: dict[str, PodTrack] = {}
    for reading in readings:
        track = tracks.get(reading.pod)
        if track is None or track.revision != reading.revision.digest:
            track = PodTrack(reading.revision.digest, now)
        recent = tuple(p for p in track.batches if now_s - p[0] <= config.settle_s and p[0] < now_s)
        kept[reading.pod] = PodTrack(track.revision, track.since, (*recent, (now_s, reading.batch)))
    return kept


def pod_settled(track: PodTrack, config: LearningConfig, now: datetime) -> bool:
    """The pod ran its revision a full window, at a load that held over it (see load_held)."""
    if (now - track.since).total_seconds() < config.settle_s:
        return False
    points = track.batches
    if not points or now.timestamp() - points[0][0] < config.settle_s / 2:
        return False
    batches = [b for _, b in points]
    return min(batches) > 0 and max(batches) / min(batches) <= LOAD_SPREAD


def settled_readings(
    readings: Sequence[PodReading], tracks: Mapping[str, PodTrack], config: LearningConfig, now: datetime
) -> list[tuple[PodReading, int, float]]:
    """The readings of settled pods with a latency and a load, each with the K its revision's
    schedule gives at its batch (0 for plain pods) and its per-token latency."""
    kept = []
    for reading in readings:
        track = tracks.get(reading.pod)
        if (
            track is None
            or not pod_settled(track, config, now)
            or reading.tpot_s is None
            or reading.batch <= 0
        ):
            continue
        schedule = reading.revision.schedule
        kept.append((reading, schedule.k_at(reading.batch) if schedule is not None else 0, reading.tpot_s))
    return kept


def learn_pods(
    calibration: CalibrationState,
    readings: Sequence[PodReading],
    tracks: Mapping[str, PodTrack],
    setup: ModelSetup,
    config: LearningConfig,
    now: datetime,
) -> tuple[CalibrationState, list[PodReading]]:
    """Each settled pod's window as one calibration sample at the K its schedule gave at its batch.

    A speculating pod at K=0 is not plain (the drafter still runs): it is returned apart, for the
    K=0 cost, and never fitted as plain. A pod whose acceptance is unknown while drafting is skipped."""
    at_zero: list[PodReading] = []
    if not config.enabled:
        return calibration, at_zero
    for reading, k, tpot_s in settled_readings(readings, tracks, config, now):
        if reading.revision.mode == "spec" and k == 0:
            at_zero.append(reading)
            continue
        if k > 0 and reading.alpha is None:
            continue
        sample = StepSample(reading.batch, k, tpot_s, reading.alpha if k else None)
        calibration = update(calibration, sample, setup, now.timestamp(), config.calibration)
    return calibration, at_zero


def k0_ratios(
    at_zero: Sequence[PodReading],
    anchors: Mapping[float, Anchor],
    edges: Sequence[int],
    fitted: CalibratedModel,
    min_plain_samples: float = 1.0,
) -> list[float]:
    """Latency of speculating pods at K=0 over the plain latency measured in their band (a plain pod
    ran there), else over the fitted plain latency where plain was measured near their batch: what
    K=0 inside a speculating engine costs here."""
    ratios = []
    for reading in at_zero:
        if reading.tpot_s is None:
            continue
        plain_s = anchors.get(band_of(reading.batch, edges), Anchor()).plain_s
        if not plain_s and fitted.confidence(reading.batch).off >= min_plain_samples:
            plain_s = fitted.step_s(0, reading.batch)
        if plain_s:
            ratios.append(reading.tpot_s / plain_s)
    return ratios


# ------------------------------------------------------------------ anchors: what each band measured


ANCHOR_WEIGHT = 0.3
"""Weight of a new reading in a band's anchor (an exponential average over readings)."""


@dataclass(frozen=True)
class Anchor:
    """What one batch band measured directly: the plain step, and the speculative round at one K."""

    plain_s: float | None = None
    k: int = 0
    round_s: float | None = None
    k0_s: float | None = None
    """A speculating pod's latency at K=0: plain plus what K=0 costs inside the engine."""


def band_of(batch: float, edges: Sequence[int]) -> float:
    """The upper edge of the band a batch falls in (the last edge above them all)."""
    for edge in edges:
        if batch <= edge:
            return float(edge)
    return float(edges[-1])


def anchor_pods(
    anchors: Mapping[float, Anchor],
    readings: Sequence[PodReading],
    tracks: Mapping[str, PodTrack],
    edges: Sequence[int],
    config: LearningConfig,
    now: datetime,
) -> dict[float, Anchor]:
    """Each settled pod's window moves its band's anchor: a plain pod its plain step, a pod drafting
    K its round time at K (per-token latency x expected tokens at its acceptance). A band measured at
    another K starts that K afresh. A speculating pod at K=0 its K=0 latency (plain plus K=0's
    cost: where no plain pod ran, the nearest thing to plain measured there)."""
    kept = dict(anchors)
    if not config.enabled:
        return kept
    for reading, k, tpot_s in settled_readings(readings, tracks, config, now):
        band = band_of(reading.batch, edges)
        anchor = kept.get(band, Anchor())
        if reading.revision.mode == "plain":
            plain = tpot_s if anchor.plain_s is None else _mix(anchor.plain_s, tpot_s)
            kept[band] = replace(anchor, plain_s=plain)
        elif k == 0:
            k0_s = tpot_s if anchor.k0_s is None else _mix(anchor.k0_s, tpot_s)
            kept[band] = replace(anchor, k0_s=k0_s)
        elif reading.alpha is not None:
            round_s = tpot_s * expected_tokens(reading.alpha, k)
            if anchor.k != k or anchor.round_s is None:
                kept[band] = replace(anchor, k=k, round_s=round_s)
            else:
                kept[band] = replace(anchor, round_s=_mix(anchor.round_s, round_s))
    return kept


def _mix(old: float, new: float) -> float:
    return (1 - ANCHOR_WEIGHT) * old + ANCHOR_WEIGHT * new


def anchors_to_status(anchors: Mapping[float, Anchor]) -> list[BandAnchorStatus]:
    return [
        BandAnchorStatus(
            batch=int(batch),
            plain_seconds=None if a.plain_s is None else round(a.plain_s, 6),
            k=a.k,
            round_seconds=None if a.round_s is None else round(a.round_s, 6),
            k0_seconds=None if a.k0_s is None else round(a.k0_s, 6),
        )
        for batch, a in sorted(anchors.items())
    ]


def anchors_from_status(recorded: Sequence[BandAnchorStatus]) -> dict[float, Anchor]:
    return {float(a.batch): Anchor(a.plain_seconds, a.k, a.round_seconds, a.k0_seconds) for a in recorded}
