"""Online calibration: the roofline prior corrected by a deployment's own step-time samples."""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specops import profiles
from specops.domain import calibration, learning
from specops.domain.calibration import (
    REFIT_AFTER_SAMPLES,
    CalibratedModel,
    CalibrationConfig,
    CalibrationState,
    ProbeConfig,
    ProbeLedger,
    StepSample,
    _unpack,
    account,
    bucket_of,
    decay,
    max_speedup,
    plan_probe,
    refit_due,
    refitted,
    start_probe,
    update,
)
from specops.domain.perf import (
    GPUS,
    ModelSetup,
    best_length_break_even_batch,
    expected_tokens,
    speculative_step_time,
    speedup,
    target_step_time,
)
from specops.domain.profile import ServingProfile, profile_from_setup

PRIOR = ModelSetup(GPUS["H100"], 70e9, 7e9)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
AN_HOUR_IN = ProbeLedger(started_at_s=0.0, elapsed_s=3600.0)  # an hour without probes: budget available


def sample_world(
    profile: ServingProfile,
    n: int,
    seed: int,
    *,
    batches: tuple[float, ...] = BATCHES,
    lengths: tuple[int, ...] = tuple(range(9)),
    start_s: float = 0.0,
    state: CalibrationState | None = None,
    interval_s: float = 15.0,
    config: CalibrationConfig | None = None,
) -> CalibrationState:
    """n observations as the operator gets them: TPOT x (1 + N(0, 0.03)), alpha + N(0, 0.02)."""
    rng = random.Random(seed)
    alpha = profile.alpha or 0.7
    state = state or CalibrationState()
    for i in range(n):
        batch = rng.choice(batches) * rng.uniform(0.85, 1.15)
        g = rng.choice(lengths)
        tpot = profile.per_token_ms(alpha, g, batch) / 1e3 * (1 + rng.gauss(0, 0.03))
        measured_alpha = alpha + rng.gauss(0, 0.02) if g else None
        state = update(
            state, StepSample(batch, g, tpot, measured_alpha), PRIOR, start_s + i * interval_s, config
        )
    return state


def test_with_no_data_the_prediction_is_the_roofline_prior() -> None:
    model = CalibratedModel(PRIOR)
    assert not model.calibrated
    for batch in (1, 16, 200, 700):
        for g in (1, 4, 8):
            assert model.predict_speedup(0.8, g, batch) == pytest.approx(
                speedup(PRIOR, 0.8, batch, g), rel=1e-9
            )
    assert model.break_even_batch(0.8, (1, 8)) == best_length_break_even_batch(PRIOR, 0.8, 8)
    assert model.relative_fit_error() is None
    assert model.confidence(32).on == model.confidence(32).off == 0.0


@pytest.mark.parametrize("name", profiles.list_builtin())
def test_fitting_recovers_each_shipped_profile_from_noisy_samples(name: str) -> None:
    profile = profiles.load_builtin(name)
    alpha = profile.alpha
    assert alpha is not None
    model = CalibratedModel(PRIOR, sample_world(profile, 400, seed=3))
    for batch in (1, 3, 10, 40, 100, 300):
        for g in (0, 1, 2, 4, 8):
            assert model.step_s(g, batch) == pytest.approx(profile.round_ms_at(g, batch) / 1e3, rel=0.08)
    truth = profile.break_even_batch(alpha)
    learned = model.break_even_batch(alpha, (1, 8))
    if truth is None or truth == 1:
        assert learned == truth
    else:
        assert learned is not None and abs(learned - truth) <= 0.3 * truth
    assert model.relative_fit_error() == pytest.approx(0.05, abs=0.03)


def test_measurements_override_the_prior_only_where_they_were_taken() -> None:
    profile = profiles.load_builtin("llama8b-1b-draft-floor-h100")
    # only low batches measured, plain and at 2 tokens
    model = CalibratedModel(PRIOR, sample_world(profile, 60, seed=5, batches=(2, 4, 8), lengths=(0, 2)))
    assert model.predict_speedup(0.72, 2, 4) == pytest.approx(profile.speedup(0.72, 2, 4), rel=0.05)
    assert model.confidence(4).on > 5 and model.confidence(4).off > 5
    assert model.confidence(256).on == 0.0


def test_a_sample_loses_half_its_weight_per_half_life() -> None:
    config = CalibrationConfig(half_life_s=600.0)
    state = update(CalibrationState(), StepSample(16, 0, 0.02), PRIOR, 0.0, config)
    assert sum(state.off_counts) == 1.0
    later = decay(state, 600.0, config)
    assert sum(later.off_counts) == pytest.approx(0.5)
    assert later.weight == pytest.approx(state.weight / 2)
    assert sum(decay(state, 1800.0, config).off_counts) == pytest.approx(0.125)


def test_after_the_engine_changes_recent_samples_win_within_a_few_half_lives() -> None:
    config = CalibrationConfig(half_life_s=600.0)
    before = profiles.load_builtin("qwen3-32b-eagle3-2xh200")
    # an engine upgrade: what a speculative round adds to a plain step halves, plain steps unchanged
    after = replace(
        before,
        round_ms={
            g: tuple(p + 0.5 * (t - p) for t, p in zip(ts, before.plain_ms, strict=True))
            for g, ts in before.round_ms.items()
        },
    )
    state = sample_world(before, 200, seed=1, config=config)  # 50 minutes of the old engine
    old = CalibratedModel(PRIOR, state, config)
    assert old.predict_speedup(0.65, 3, 64) == pytest.approx(before.speedup(0.65, 3, 64), rel=0.05)
    state = sample_world(after, 160, seed=2, start_s=3000.0, state=state, config=config)
    model = CalibratedModel(PRIOR, state, config)  # after 40 minutes (4 half-lives) of the new engine
    assert model.predict_speedup(0.65, 3, 64) == pytest.approx(after.speedup(0.65, 3, 64), rel=0.05)
    assert after.speedup(0.65, 3, 64) > 1.4 * before.speedup(0.65, 3, 64)


def test_state_is_bounded_and_round_trips_through_json() -> None:
    state = sample_world(profiles.load_builtin("qwen3-32b-eagle3-2xh200"), 500, seed=4)
    text = json.dumps(state.to_dict())
    again = CalibrationState.from_dict(json.loads(text))
    assert again == state
    assert len(text) < 2000  # 500 samples or 5 million: the same few numbers
    assert CalibratedModel(PRIOR, again).theta == CalibratedModel(PRIOR, state).theta


@pytest.mark.parametrize(
    ("batch", "bucket"), [(0.5, 0), (1, 0), (1.5, 1), (2, 1), (3, 2), (64, 6), (65, 7), (5000, 10)]
)
def test_batch_octaves(batch: float, bucket: int) -> None:
    assert bucket_of(batch) == bucket


def run_probe_schedule(
    model: CalibratedModel, *, enabled: bool, hours: float, interval_s: float, config: ProbeConfig
) -> tuple[ProbeLedger, list[float]]:
    """Plan every interval as a control loop would; returns the ledger and probe start times."""
    ledger = ProbeLedger()
    starts: list[float] = []
    now = 0.0
    probing = False
    while now < hours * 3600:
        plan = plan_probe(
            model, ledger, now, enabled=enabled, alpha=0.72, batch=16, bounds=(1, 8),
            current_length=3 if enabled else 0, config=config,
        )  # fmt: skip
        if plan.probe:
            ledger = start_probe(ledger, now, config)
            starts.append(now)
        probing = ledger.probing_until_s is not None
        now += interval_s
        ledger = account(ledger, now, interval_s, probing)
    return ledger, starts


@pytest.mark.parametrize("enabled", [False, True])
@pytest.mark.parametrize(
    "config",
    [
        ProbeConfig(),
        ProbeConfig(max_fraction=0.05, min_spacing_s=120.0, probe_duration_s=15.0),
        ProbeConfig(max_fraction=0.01, min_spacing_s=60.0, probe_duration_s=30.0),
    ],
)
def test_probes_stay_within_their_share_of_time_and_spacing(enabled: bool, config: ProbeConfig) -> None:
    # Samples on both sides near batch 16, so no probe is urgent; near break-even, so it wants them.
    floor = profiles.load_builtin("llama8b-1b-draft-floor-h100")
    model = CalibratedModel(PRIOR, sample_world(floor, 200, seed=8, batches=(12, 16, 20)))
    ledger, starts = run_probe_schedule(model, enabled=enabled, hours=6, interval_s=15.0, config=config)
    assert len(starts) >= 2
    assert ledger.cost_fraction <= config.max_fraction + 1e-9
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= config.min_spacing_s + config.probe_duration_s - 1e-9


@pytest.mark.parametrize("enabled", [False, True])
def test_urgent_probes_where_nothing_was_measured_still_keep_the_budget(enabled: bool) -> None:
    # An empty model has measured nothing anywhere: every probe is urgent and skips the spacing.
    config = ProbeConfig()
    ledger, starts = run_probe_schedule(
        CalibratedModel(PRIOR), enabled=enabled, hours=6, interval_s=15.0, config=config
    )
    assert starts
    assert ledger.cost_fraction <= config.max_fraction + 1e-9
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 2 * config.probe_duration_s - 1e-9


def test_a_model_sure_that_speculation_does_not_pay_does_not_probe_on() -> None:
    never = profiles.load_builtin("qwen3-30b-a3b-moe-eagle3-h100")
    model = CalibratedModel(PRIOR, sample_world(never, 300, seed=6, batches=(8, 16, 32)))
    plan = plan_probe(
        model, AN_HOUR_IN, 3600.0, enabled=False, alpha=0.55, batch=16, bounds=(1, 8), current_length=0
    )
    assert not plan.probe
    # ... but while on it keeps plain speed known: a probe off once the last one is old
    plan = plan_probe(
        model, AN_HOUR_IN, 3600.0, enabled=True, alpha=0.55, batch=16, bounds=(1, 8), current_length=3
    )
    assert plan.probe and plan.draft_length == 0


def test_near_break_even_the_model_probes_on_even_when_it_has_samples() -> None:
    floor = profiles.load_builtin("llama8b-1b-draft-floor-h100")
    model = CalibratedModel(PRIOR, sample_world(floor, 300, seed=7, batches=(8, 12, 16)))
    plan = plan_probe(
        model, AN_HOUR_IN, 3600.0, enabled=False, alpha=0.72, batch=12, bounds=(1, 8), current_length=0
    )
    assert plan.probe and plan.draft_length >= 1
    assert "break-even" in plan.reason


def test_far_from_its_samples_the_fit_promises_no_more_than_the_roofline() -> None:
    # measured only at batches 32-64, where speculation loses: a linear fit extrapolated to batch 384
    # must not find a gain the roofline itself does not promise there
    never = profiles.load_builtin("qwen3-30b-a3b-moe-eagle3-h100")
    model = CalibratedModel(PRIOR, sample_world(never, 120, seed=4, batches=(32, 48, 64), lengths=(0, 3, 4)))
    prior = CalibratedModel(PRIOR)
    alpha = never.alpha or 0.7
    for g in range(1, 9):
        assert model.predict_speedup(alpha, g, 384) <= prior.predict_speedup(alpha, g, 384) + 1e-9
    assert model.best_length(alpha, 384, (1, 8))[0] == 0
    # where it measured, the data speak
    assert model.predict_speedup(alpha, 3, 48) == pytest.approx(never.speedup(alpha, 3, 48), rel=0.1)


def test_a_probe_off_is_skipped_where_the_gain_is_large_and_the_rounds_match_the_prior() -> None:
    from specops.domain.profile import profile_from_setup

    roofline = profile_from_setup("roofline", PRIOR)
    on_only = sample_world(roofline, 40, seed=3, batches=(16,), lengths=(3, 4))
    plan = plan_probe(CalibratedModel(PRIOR, on_only), ProbeLedger(), 0.0, enabled=True, alpha=0.8,
                      batch=16, bounds=(1, 8), current_length=4)  # fmt: skip
    assert not plan.probe and "match the prior" in plan.reason
    # the same on-samples from an engine whose rounds are far slower than the prior's: plain speed matters
    never = profiles.load_builtin("qwen3-30b-a3b-moe-eagle3-h100")
    wrong = sample_world(never, 40, seed=3, batches=(16,), lengths=(3, 4))
    plan = plan_probe(CalibratedModel(PRIOR, wrong), ProbeLedger(), 0.0, enabled=True, alpha=0.8,
                      batch=16, bounds=(1, 8), current_length=4)  # fmt: skip
    assert plan.probe and plan.draft_length == 0


def test_a_probe_off_is_skipped_where_a_gain_of_a_third_rests_on_rounds_that_match_the_prior() -> None:
    # A 1.3-1.5x gain cannot be undone by plain speed the matching rounds already imply: a probe off
    # there (a load ramp reaching a batch not measured off) only costs the gain for its duration
    from specops.domain.profile import profile_from_setup

    roofline = profile_from_setup("roofline", PRIOR)
    on_only = sample_world(roofline, 40, seed=5, batches=(96,), lengths=(1, 2))
    model = CalibratedModel(PRIOR, on_only)
    predicted = max_speedup(model, 0.7, 96, (1, 8))
    assert 1.3 <= predicted < 1.5, predicted
    plan = plan_probe(model, ProbeLedger(), 0.0, enabled=True, alpha=0.7, batch=96, bounds=(1, 8),
                      current_length=1)  # fmt: skip
    assert not plan.probe and "match the prior" in plan.reason


def test_the_assured_gain_is_close_where_measured_and_far_below_where_extrapolated() -> None:
    # Given a deployment measured plain and at 4 tokens around batch 32, never at 1 token
    profile = profiles.load_builtin("qwen3-30b-a3b-moe-eagle3-h100")
    model = CalibratedModel(PRIOR, sample_world(profile, 40, seed=2, batches=(16, 32, 64), lengths=(0, 4)))
    alpha = profile.alpha or 0.55

    def gap(length: int) -> float:
        return 1.0 - model.assured_speedup(alpha, length, 32) / model.predict_speedup(alpha, length, 32)

    # Then the measured length's lower bound is within a few per cent of its mean, while the length
    # the fit only extrapolates to is bounded far lower: its "gain" is not yet the data's
    assert 0.0 < gap(4) < 0.05
    assert gap(1) > 3 * gap(4)
    assert model.speedup_sigma(0, 32) == 0.0 and model.assured_speedup(alpha, 0, 32) == 1.0
    # And where no round was measured near the batch, the prediction is the prior's and stands
    assert model.confidence(512).on < 0.5
    assert model.assured_speedup(alpha, 1, 512) == model.predict_speedup(alpha, 1, 512)
    assert CalibratedModel(PRIOR).assured_speedup(alpha, 4, 32) == pytest.approx(speedup(PRIOR, alpha, 32, 4))


def test_the_remembered_break_even_is_each_models_own_as_data_arrive() -> None:
    # Given deployments of every shipped profile learning side by side, and the prior with a long context
    names = profiles.list_builtin()
    states = {name: CalibrationState() for name in names}
    for step in range(6):
        for index, name in enumerate(names):
            profile = profiles.load_builtin(name)
            states[name] = sample_world(
                profile, 20, seed=10 * step + index, state=states[name], start_s=step * 300.0
            )
            model = CalibratedModel(PRIOR, states[name])
            alpha = profile.alpha or 0.7
            # When the loop asks for the break-even, remembered between ticks
            # Then it is what the model's own search finds, at this alpha and bounds
            for bounds in ((1, 8), (2, 4)):
                assert learning.break_even(model, alpha, bounds) == model.break_even_batch(alpha, bounds)
    long_context = replace(PRIOR, context_tokens=32768.0)
    prior = CalibratedModel(long_context)
    assert learning.break_even(prior, 0.8, (1, 8)) == best_length_break_even_batch(long_context, 0.8, 8)
    assert learning.break_even(prior, 0.8, (1, 8)) != learning.break_even(CalibratedModel(PRIOR), 0.8, (1, 8))


def test_the_break_even_search_asks_what_the_best_length_answers_at_every_batch() -> None:
    # Given calibrated models of every shipped profile, and the long-context prior
    models = [
        (CalibratedModel(PRIOR, sample_world(profiles.load_builtin(name), 30, seed=index)), 0.7)
        for index, name in enumerate(profiles.list_builtin())
    ]
    models.append((CalibratedModel(replace(PRIOR, context_tokens=32768.0)), 0.8))
    for model, alpha in models:
        for bounds in ((1, 8), (2, 4), (3, 3)):
            # When the search asks whether some length pays at a batch
            pays = model._pays(alpha, bounds)
            # Then that is whether the best length is one, at every batch it may ask about
            for batch in range(1, 1025):
                assert pays(batch) == (model.best_length(alpha, batch, bounds)[0] > 0), (bounds, batch)


def test_the_fit_error_is_the_weighted_rms_of_the_relative_residuals() -> None:
    # Given a model fitted to a profile's noisy samples
    state = sample_world(profiles.load_builtin(profiles.list_builtin()[0]), 40, seed=7)
    model = CalibratedModel(PRIOR, state)
    # Then its fit error is sqrt((y'y - 2 theta'X'y + theta'X'X theta) / samples) x the noise unit,
    # the quadratic form over the full matrix, term by term
    a = _unpack(state.xtx)
    theta = model.theta
    quad = sum(theta[i] * a[i][j] * theta[j] for i in range(6) for j in range(6))
    linear = sum(t * c for t, c in zip(theta, state.xty, strict=True))
    count = sum(state.on_counts) + sum(state.off_counts)
    expected = math.sqrt(max(0.0, state.yty - 2.0 * linear + quad) / count) * model.config.relative_noise
    assert model.relative_fit_error() == expected
    assert CalibratedModel(PRIOR).relative_fit_error() is None


def test_a_table_of_every_length_is_exactly_each_lengths_own_prediction() -> None:
    # Given calibrated models of every shipped profile, and the long-context prior
    models = [
        CalibratedModel(PRIOR, sample_world(profiles.load_builtin(name), 30, seed=index))
        for index, name in enumerate(profiles.list_builtin())
    ]
    models.append(CalibratedModel(replace(PRIOR, context_tokens=32768.0)))
    for model in models:
        for batch in (0.5, 1.0, 3.3, 17.0, 250.0, 4000.0):
            for context in (None, 0.0, 8192.0):
                # When it tabulates lengths 1-8 at a batch in one pass (a decision's and a search's way)
                table = model.speedup_table(0.73, batch, 1, 8, context)
                # Then each entry is, to the last bit, what asking for that length alone gives
                assert table == tuple(model.predict_speedup(0.73, g, batch, context) for g in range(1, 9))
                # and each is E x plain step / round step of the model's own step times, to the last bit
                plain = model.step_s(0, batch, context)
                capped = model.unmeasured_octaves()[bucket_of(batch)]
                for g, entry in enumerate(table, start=1):
                    tokens = expected_tokens(0.73, g)
                    wanted = tokens * plain / model.step_s(g, batch, context)
                    if capped:
                        x_plain, x_round = (model._roof.features(n, batch, context)[0] for n in (0, g))
                        wanted = min(wanted, tokens * x_plain / x_round)
                    assert entry == wanted
                shared = list(model._roof.round_costs(range(1, 9), batch, context))
                assert shared == [model._roof.features(g, batch, context)[0] for g in range(1, 9)]


@pytest.mark.parametrize("context_tokens", [None, 0.0, 512.0, 32768.0])
def test_the_prior_predicts_the_rooflines_step_times_exactly_at_any_context(
    context_tokens: float | None,
) -> None:
    model = CalibratedModel(PRIOR)
    at = PRIOR if context_tokens is None else PRIOR.with_context(context_tokens)
    for batch in (0.5, 1, 7, 64, 1000):
        assert model.step_s(0, batch, context_tokens) == target_step_time(at, max(1.0, batch))
        for g in (1, 3, 8):
            assert model.step_s(g, batch, context_tokens) == pytest.approx(
                speculative_step_time(at, max(1.0, batch), g), rel=1e-12
            )


def test_a_solve_is_kept_while_the_samples_hold_no_news_and_predicts_as_a_fresh_one() -> None:
    # Given a deployment sampled once an interval, the load around batch 32, on at 3 and off in turn
    world = profiles.load_builtin("llama70b-small-draft-4xh100")
    config = CalibrationConfig()
    state = sample_world(world, 150, seed=3, batches=(32,), lengths=(0, 3))
    previous = CalibratedModel(PRIOR, state, config).fit
    solves, worst = 0, 0.0
    for tick in range(120):
        state = sample_world(
            world, 1, seed=100 + tick, batches=(32,), lengths=(0, 3), state=state, start_s=(150 + tick) * 15.0
        )
        # When each tick's model keeps the last solve unless the samples hold news
        kept = refitted(previous, PRIOR, state, config)
        fresh = CalibratedModel(PRIOR, state, config)
        solves += kept.fit is not previous
        previous = kept.fit
        # Then it predicts what solving again would, at the load's batch, within the 1 % a length
        # change needs (one new sample moves a fresh solve by up to 0.8 % at length 1 here; a solve
        # kept for the whole run would be 2.3 % off)
        for g in (1, 3, 6):
            ratio = kept.predict_speedup(0.7, g, 32) / fresh.predict_speedup(0.7, g, 32)
            worst = max(worst, abs(ratio - 1.0))
    assert worst < 0.01
    # and solves at least every REFIT_AFTER_SAMPLES samples (more often where an octave's evidence
    # is still thin), but not every tick
    assert 120 // REFIT_AFTER_SAMPLES <= solves <= 120 // 2


def test_a_sample_where_evidence_is_thin_or_time_that_aged_the_data_solves_again() -> None:
    config = CalibrationConfig()
    world = profiles.load_builtin("llama70b-small-draft-4xh100")
    state = sample_world(world, 150, seed=4, batches=(32,), lengths=(0, 3))
    solve = CalibratedModel(PRIOR, state, config).fit
    assert solve is not None
    end_s = 149 * 15.0
    one_more = sample_world(
        world, 1, seed=5, batches=(32,), lengths=(0, 3), state=state, start_s=end_s + 15.0
    )
    assert not refit_due(solve.solved_from, one_more, config)
    # a first sample at a batch octave never measured
    elsewhere = sample_world(
        world, 1, seed=5, batches=(256,), lengths=(3,), state=state, start_s=end_s + 15.0
    )
    assert refit_due(solve.solved_from, elsewhere, config)
    assert refitted(solve, PRIOR, elsewhere, config).theta == CalibratedModel(PRIOR, elsewhere, config).theta
    # the data aged (no sample for a while: the prior wins some weight back)
    aged = decay(state, end_s + 0.1 * config.half_life_s, config)
    assert refit_due(solve.solved_from, aged, config)
    # the statistics were reset (a new target, a new draft)
    assert refit_due(solve.solved_from, CalibrationState(), config)
    # another setup or configuration is never served by this solve
    assert refitted(solve, replace(PRIOR, context_tokens=8192.0), one_more, config).fit is not solve
    assert refitted(solve, PRIOR, one_more, replace(config, half_life_s=600.0)).fit is not solve
    assert refitted(solve, PRIOR, one_more, config).fit is solve


def test_the_break_even_shown_is_the_one_at_alpha_to_two_decimals() -> None:
    model = CalibratedModel(PRIOR, sample_world(profiles.load_builtin("qwen3-32b-eagle3-2xh200"), 60, seed=6))
    for alpha in (0.6049, 0.6051, 0.7234, 0.8):
        assert learning.break_even(model, alpha, (1, 8)) == model.break_even_batch(round(alpha, 2), (1, 8))


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(min_value=1, max_value=6),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    magnitude=st.floats(min_value=-6.0, max_value=6.0),
)
def test_the_posterior_solve_solves_the_system_it_is_given(size: int, seed: int, magnitude: float) -> None:
    # Given a symmetric positive definite system as the posterior's (X'WX plus a prior's diagonal)
    rng = np.random.default_rng(seed)
    features = rng.normal(0.0, 10.0**magnitude, size=(size, size))
    a = features.T @ features + np.eye(size)
    b = rng.normal(0.0, 1e3, size=size)
    # When the calibration's Cholesky solve takes it
    solved = calibration._solve_spd(a.tolist(), b.tolist())
    # Then it solves it as well as floating point allows (a backward-stable residual)
    x = np.array(solved)
    residual = float(np.abs(a @ x - b).max())
    assert residual <= 1e-9 * (float(np.abs(a).max()) * float(np.abs(x).max()) + float(np.abs(b).max()))


def test_a_fit_from_one_batch_never_makes_a_round_cheaper_than_a_plain_step() -> None:
    # the prior's own world, measured only near batch 48, plain and at K=3 and 4: away from that
    # batch the fit must not buy a cheap K=1 with a negative fixed cost per round
    truth = profile_from_setup("truth", PRIOR)
    model = CalibratedModel(PRIOR, sample_world(truth, 80, seed=3, batches=(48,), lengths=(0, 3, 4)))
    for batch in (4, 16, 48, 96):
        plain = model.step_s(0, batch)
        assert all(model.step_s(k, batch) >= plain for k in range(1, 9))
    assert model.predict_speedup(0.75, 1, 16) <= expected_tokens(0.75, 1)
