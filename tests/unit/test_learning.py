"""The control loop's learning: settled samples, the slowdown guard, bounded probes, status round trip."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from specops.api.status import SpeculationStatus, SpeculativeDeploymentStatus
from specops.domain import learning, perf
from specops.domain.perf import expected_tokens

SETUP = perf.ModelSetup(
    gpu=perf.GPUS["H100"], target_params=70e9, draft_params=7e9, bytes_per_param=2.0, tensor_parallel=1
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
CONFIG = learning.learning_config(
    enabled=True,
    guard=True,
    half_life_s=1800.0,
    max_probe_fraction=0.02,
    min_spacing_s=180.0,
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


def test_probe_timing_follows_the_rate_window_and_interval() -> None:
    assert CONFIG.settle_s == 12.0
    assert CONFIG.probes.probe_duration_s == 13.0  # one window + lag (12 s), then one clean sample
    slow = learning.learning_config(
        enabled=True,
        guard=True,
        half_life_s=1800.0,
        max_probe_fraction=0.02,
        min_spacing_s=180.0,
        interval_s=15.0,
        rate_window_s=60.0,
    )
    # one probe must fit the budget window at the configured fraction
    assert slow.probes.probe_duration_s == 105.0
    assert slow.probes.budget_window_s * 0.02 >= slow.probes.probe_duration_s


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


def test_the_guard_switches_off_after_three_measurements_slower_than_plain_and_names_the_evidence() -> None:
    state = learned_plain(64)
    fitted = learning.model(SETUP, state, CONFIG)
    slow = learning.Observed(batch=64, tpot_s=plain_s(64) * 1.2, alpha=0.8)
    verdicts = []
    for second in range(112, 116):
        verdict = learning.guard(state, fitted, slow, 4, CONFIG, at(second))
        state = verdict.state
        verdicts.append(verdict.fired)
    assert verdicts == [False, False, True, False]
    fired = learning.guard(learned_plain(64), fitted, slow, 4, CONFIG, at(112))
    state = learned_plain(64)
    for second in range(112, 115):
        fired = learning.guard(state, fitted, slow, 4, CONFIG, at(second))
        state = fired.state
    assert "draft length 4" in fired.evidence and "batch 64" in fired.evidence and "0.83x" in fired.evidence
    # the hold keeps it off at this load and releases it once the batch falls below 80 % of it
    assert learning.holds_off(state, learning.Observed(batch=56, tpot_s=None, alpha=None))
    released = learning.guard(state, fitted, learning.Observed(50, None, None), 0, CONFIG, at(120)).state
    assert not learning.holds_off(released, learning.Observed(batch=56, tpot_s=None, alpha=None))


def test_the_guard_does_not_act_without_plain_measurements_near_the_load_or_when_faster() -> None:
    state = hold_load(learned_plain(4), 256, 100, 112)  # plain measured only far below
    fitted = learning.model(SETUP, state, CONFIG)
    slow = learning.Observed(batch=256, tpot_s=plain_s(256) * 1.5, alpha=0.8)
    for second in range(112, 120):
        verdict = learning.guard(state, fitted, slow, 4, CONFIG, at(second))
        assert not verdict.fired
        assert verdict.blind  # a slowdown there is one it cannot see: a resting tick looks in full
        state = verdict.state
    state = learned_plain(64)
    fast = learning.Observed(batch=64, tpot_s=plain_s(64) / 1.5, alpha=0.8)
    for second in range(112, 120):
        verdict = learning.guard(state, learning.model(SETUP, state, CONFIG), fast, 4, CONFIG, at(second))
        assert not verdict.fired
        assert not verdict.blind  # it compared the reading with plain speed and found it faster
        state = verdict.state


def run_off(state: learning.LearningState, seconds: int, batch: float) -> tuple[learning.LearningState, int]:
    """Speculation decided off for `seconds` one-second decisions; returns the state and probe seconds."""
    probing = 0
    for second in range(seconds):
        now = at(1000 + second)
        fitted = learning.model(SETUP, state, CONFIG)
        explored = learning.explore(
            state,
            fitted,
            allowed=True,
            enabled=False,
            decided_length=0,
            decision_changed=False,
            alpha=0.8,
            batch=batch,
            bounds=(1, 8),
            dt_s=1.0,
            config=CONFIG,
            now=now,
        )
        state = learning.applied(explored.state, explored.num_draft_tokens, now)
        if explored.probe:
            probing += 1
            assert explored.num_draft_tokens > 0  # off: a probe on
        # what the pods show feeds the fit (a world where speculation gains nothing)
        length = explored.num_draft_tokens
        tpot = plain_s(batch) if length == 0 else plain_s(batch) * 1.3 / expected_tokens(0.8, length)
        seen = learning.Observed(batch=batch, tpot_s=tpot, alpha=0.8 if length else None)
        state = observe(state, seen, now)
    return state, probing


def test_off_it_probes_where_nothing_was_measured_then_stays_within_the_budget() -> None:
    state = learning.applied(learning.LearningState(), 0, at(0))
    state, probing = run_off(state, 2 * 3600, batch=16)
    assert state.ledger.probes >= 1  # the unmeasured region was measured
    assert learning.model(SETUP, state, CONFIG).confidence(16).on > 0  # and what it showed was fitted
    assert probing == round(state.ledger.probe_s)
    assert state.ledger.probe_s <= 0.02 * state.ledger.elapsed_s + CONFIG.probes.probe_duration_s
    assert state.ledger.cost_fraction <= 0.025


def test_no_probe_when_the_fraction_is_zero_or_learning_is_not_allowed() -> None:
    none = replace(CONFIG, probes=replace(CONFIG.probes, max_fraction=0.0))
    state = learning.applied(learning.LearningState(), 0, at(0))
    for config, allowed in ((none, True), (CONFIG, False)):
        explored = learning.explore(
            state,
            learning.model(SETUP, state, config),
            allowed=allowed,
            enabled=False,
            decided_length=0,
            decision_changed=False,
            alpha=0.8,
            batch=16,
            bounds=(1, 8),
            dt_s=1.0,
            config=config,
            now=at(500),
        )
        assert not explored.probe and explored.num_draft_tokens == 0


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


def test_status_round_trip_resumes_the_same_model_and_ledger() -> None:
    state, _ = run_off(learning.applied(learning.LearningState(), 0, at(0)), 400, batch=16)
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
    assert resumed.ledger == state.ledger
    assert resumed.calibration.samples == state.calibration.samples
