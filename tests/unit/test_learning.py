"""The control loop's learning: settled samples, break-even announcements, status round trip."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from specops.api.status import SpeculationStatus, SpeculativeDeploymentStatus
from specops.domain import learning, perf

SETUP = perf.ModelSetup(
    gpu=perf.GPUS["H100"], target_params=70e9, draft_params=7e9, bytes_per_param=2.0, tensor_parallel=1
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = learning.learning_config(
    enabled=True,
    guard=True,
    half_life_s=1800.0,
    interval_s=1.0,
    rate_window_s=10.0,
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def plain_s(batch: float) -> float:
    return perf.target_step_time(SETUP, batch)


def observe(state: learning.LearningState, seen: learning.Observed, now: datetime) -> learning.LearningState:
    """One decision's learning, as the loop runs it: the batch joins the window, then the sample."""
    return learning.observe(learning.track_load(state, seen.batch, CONFIG, now), seen, SETUP, CONFIG, now)


def hold_load(state: learning.LearningState, batch: float, start: int, end: int) -> learning.LearningState:
    """Decisions at seconds [start, end) that saw `batch`."""
    for second in range(start, end):
        state = learning.track_load(state, batch, CONFIG, at(second))
    return state


def test_a_sample_counts_only_once_the_setting_held_a_full_rate_window() -> None:
    state = learning.applied(learning.LearningState(), 0, at(0))
    seen = learning.Observed(batch=16, tpot_s=plain_s(16), alpha=None)
    for second in range(12):
        state = observe(state, seen, at(second))
    assert state.calibration.samples == 0
    state = observe(state, seen, at(12))
    assert state.calibration.samples == 1
    # a new setting restarts the clock; an on-sample without alpha is not a sample
    state = learning.applied(state, 4, at(13))
    state = hold_load(state, 16, 13, 30)
    state = observe(state, seen, at(30))
    assert state.calibration.samples == 1
    on = learning.Observed(batch=16, tpot_s=0.02, alpha=0.8)
    assert observe(state, on, at(30)).calibration.samples == 2


def test_right_after_the_load_moves_latency_and_batch_are_not_paired() -> None:
    # Speculation on at length 5 for long at batch 16; then the load jumps to 256. The latency
    # (a rate over the window) still shows batch 16 while the batch gauge already reads 256.
    state = hold_load(learning.applied(learning.LearningState(), 5, at(0)), 16, 0, 30)
    fast_at_16 = learning.Observed(batch=256, tpot_s=0.6 * plain_s(16), alpha=0.8)
    for second in range(30, 38):  # within the window after the jump: not a sample
        state = observe(state, fast_at_16, at(second))
    assert state.calibration.samples == 0
    # once the load held over the window, the measurement is one
    slow_at_256 = learning.Observed(batch=256, tpot_s=1.3 * plain_s(256), alpha=0.8)
    for second in range(38, 43):
        state = observe(state, slow_at_256, at(second))
    assert state.calibration.samples == 1
    # and a load moving within a factor of two (ordinary fluctuation) still yields samples
    for second in range(43, 60):
        wobble = learning.Observed(
            batch=256 * (1.3 if second % 2 else 0.8), tpot_s=1.3 * plain_s(256), alpha=0.8
        )
        state = observe(state, wobble, at(second))
    assert state.calibration.samples > 10


def learned_plain(batch: float, samples: int = 6) -> learning.LearningState:
    """Plain decoding measured at `batch`, then speculation on at length 4 for a full rate window."""
    state = learning.applied(learning.LearningState(), 0, at(0))
    seen = learning.Observed(batch=batch, tpot_s=plain_s(batch), alpha=None)
    state = hold_load(state, batch, 0, 12)
    for second in range(12, 12 + samples):
        state = observe(state, seen, at(second))
    return hold_load(learning.applied(state, 4, at(100)), batch, 100, 112)


def test_break_even_moves_are_announced_past_25_percent_only() -> None:
    # the first comparison is against the roofline prior's break-even
    state, first = learning.announce(learning.LearningState(), 200, 220)
    assert first is None and state.announced == 220
    state, small = learning.announce(state, 170, 220)
    assert small is None
    state, moved = learning.announce(state, 24, 220)
    assert moved == "calibration moved the break-even from batch 220 to batch 24"
    state, gone = learning.announce(state, None, 220)
    assert gone == "calibration moved the break-even from batch 24 to none up to 1024"
    _, at_once = learning.announce(learning.LearningState(), 12, None)
    assert at_once == "calibration moved the break-even from none up to 1024 to batch 12"


def test_status_round_trip_resumes_the_same_model() -> None:
    state = learning.applied(learning.LearningState(), 0, at(0))
    for second in range(400):
        batch = (8, 16, 32)[(second // 40) % 3]
        state = observe(state, learning.Observed(batch, plain_s(batch), None), at(second))
    fitted = learning.model(SETUP, state, CONFIG)
    shown = learning.to_status(
        state, fitted, CONFIG, batch=16, break_even_batch=12, prior_break_even_batch=250, computed=True
    )
    wire = SpeculativeDeploymentStatus(speculation=SpeculationStatus(calibration=shown)).to_wire()
    loaded = SpeculativeDeploymentStatus.from_wire(wire).speculation.calibration
    assert loaded.model_source == "calibrated" and loaded.break_even_batch == 12
    resumed = learning.from_status(loaded)
    again = learning.model(SETUP, resumed, CONFIG)
    for batch in (1, 16, 64):
        for length in (1, 4):
            assert again.predict_speedup(0.8, length, batch) == fitted.predict_speedup(0.8, length, batch)
    assert resumed.calibration.samples == state.calibration.samples
