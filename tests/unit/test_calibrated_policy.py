"""The calibrated policy: it learns the world from its own measurements and acts on that."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from specops import profiles
from specops.domain.calibrated_policy import (
    CalibratedPolicyConfig,
    CalibratedPolicyState,
    Measurement,
    decide,
    model_of,
)
from specops.domain.perf import GPUS, ModelSetup
from specops.domain.profile import ServingProfile

PRIOR = ModelSetup(GPUS["H100"], 70e9, 7e9)  # says speculation pays up to batch ~250
INTERVAL = 15.0


@dataclass
class Run:
    lengths: list[int]
    probes: list[bool]
    enabled: list[bool]
    state: CalibratedPolicyState
    config: CalibratedPolicyConfig


def run(profile: ServingProfile, batch_at: Callable[[float], float], minutes: float, seed: int = 0) -> Run:
    """The policy against one pod serving `profile`, seeing each interval one scrape late, noisily."""
    rng = random.Random(seed)
    alpha = profile.alpha or 0.7
    config = CalibratedPolicyConfig(setup=PRIOR)
    state = CalibratedPolicyState(enabled=True, draft_length=config.initial_length)
    length = config.initial_length
    lengths, probes, enabled = [], [], []
    t = 0.0
    while t < minutes * 60:
        batch = batch_at(t)
        tpot = profile.per_token_ms(alpha, length, batch) / 1e3 * (1 + rng.gauss(0, 0.03))
        seen = Measurement(
            batch * (1 + rng.gauss(0, 0.05)), length, tpot, alpha + rng.gauss(0, 0.02) if length else None
        )
        t += INTERVAL
        decision = decide(config, state, seen, t)
        state, length = decision.state, decision.num_draft_tokens
        lengths.append(length)
        probes.append(decision.probe)
        enabled.append(state.enabled)
    return Run(lengths, probes, enabled, state, config)


def index_at(minutes: float) -> int:
    return int(minutes * 60 / INTERVAL)


def test_where_speculation_never_pays_it_goes_off_within_three_minutes_and_stays_off() -> None:
    never = profiles.load_builtin("qwen3-30b-a3b-moe-eagle3-h100")
    result = run(never, lambda t: 24.0, minutes=60)
    assert not result.enabled[index_at(3)]
    assert not any(result.enabled[index_at(3) :])
    on_after = [
        g for g, probe in zip(result.lengths[index_at(3) :], result.probes[index_at(3) :], strict=True) if g
    ]
    probes_on = sum(1 for g, p in zip(result.lengths, result.probes, strict=True) if g and p)
    assert len(on_after) == probes_on  # anything on afterwards is a probe
    assert sum(result.probes) / len(result.probes) <= 0.02 + 1e-9


def test_early_break_even_off_past_it_on_below_and_learned_within_30_percent() -> None:
    world = profiles.load_builtin("llama70b-small-draft-4xh100")  # breaks even at 78, the roofline at ~250
    alpha = world.alpha
    assert alpha is not None

    def load(t: float) -> float:
        minute = t / 60
        return 16.0 if minute < 20 else 160.0 if minute < 45 else 16.0

    result = run(world, load, minutes=75)
    assert result.enabled[index_at(19)]  # below break-even: on (the roofline agrees there)
    assert not any(result.enabled[index_at(30) : index_at(45)])  # past it: off, where the roofline says on
    assert all(result.enabled[index_at(55) :])  # back on below break-even
    toggles = sum(1 for a, b in zip(result.enabled, result.enabled[1:], strict=False) if a != b)
    assert toggles <= 4
    learned = model_of(result.config, result.state).break_even_batch(alpha, (1, 8))
    truth = world.break_even_batch(alpha)
    assert truth is not None and learned is not None
    assert abs(learned - truth) <= 0.3 * truth


@pytest.mark.parametrize("name", ["llama3.1-8b-longctx-magicdec", "qwen3-32b-eagle3-2xh200"])
def test_where_speculation_pays_it_stays_on_at_a_good_length(name: str) -> None:
    profile = profiles.load_builtin(name)
    alpha = profile.alpha
    assert alpha is not None
    result = run(profile, lambda t: 16.0, minutes=30)
    assert all(result.enabled)
    _best, best_speedup = profile.best_length(alpha, 16)
    final = result.state.draft_length
    assert profile.speedup(alpha, final, 16) >= 0.97 * best_speedup


def test_bursts_past_break_even_do_not_make_it_flap() -> None:
    world = profiles.load_builtin("qwen3-32b-eagle3-2xh200")  # breaks even at 63

    def bursty(t: float) -> float:
        return 150.0 if (t // 60) % 4 == 0 else 20.0  # one minute of 150 every four

    result = run(world, bursty, minutes=120)
    toggles = sum(1 for a, b in zip(result.enabled, result.enabled[1:], strict=False) if a != b)
    assert toggles / 2 <= 6
