"""The performance model reproduces every worked value in SPECDEC.md (within 5 %)."""

from __future__ import annotations

import pytest

from specops.domain.perf import (
    GPUS,
    ModelSetup,
    best_draft_length,
    best_length_break_even_batch,
    break_even_batch,
    expected_tokens,
    latency_ratio,
    per_token_latency,
    speedup,
    target_step_time,
)

ALPHA = 0.8
LENGTH = 4


def setup(gpu: str = "H100", draft: float = 7e9, context_tokens: float = 0.0) -> ModelSetup:
    return ModelSetup(GPUS[gpu], target_params=70e9, draft_params=draft, context_tokens=context_tokens)


@pytest.mark.parametrize(
    ("gpu", "draft", "batch", "expected"),
    [
        ("H100", 7e9, 1, 2.40),
        ("H100", 7e9, 32, 2.40),
        ("H100", 7e9, 128, 1.31),
        ("H100", 7e9, 256, 0.71),
        ("H200", 7e9, 32, 2.40),
        ("H200", 7e9, 128, 0.96),
        ("H200", 7e9, 256, 0.62),
        ("H100", 1e9, 1, 3.18),
        ("H100", 1e9, 32, 3.18),
        ("H100", 1e9, 128, 1.51),
    ],
)
def test_worked_speedups_of_a_70b_target_at_alpha_08_and_four_draft_tokens(
    gpu: str, draft: float, batch: int, expected: float
) -> None:
    assert speedup(setup(gpu, draft), ALPHA, batch, LENGTH) == pytest.approx(expected, rel=0.05)


def test_speculation_turns_into_a_slowdown_at_batch_256() -> None:
    assert speedup(setup("H100"), ALPHA, 256, LENGTH) < 1.0
    assert speedup(setup("H200"), ALPHA, 128, LENGTH) < 1.0


def test_best_draft_length_falls_to_one_or_two_near_batch_128_and_to_off_near_256() -> None:
    assert best_draft_length(setup(), ALPHA, 32, 8)[0] >= 4
    assert best_draft_length(setup(), ALPHA, 128, 8)[0] in (1, 2)
    assert best_draft_length(setup(draft=1e9), ALPHA, 128, 8)[0] in (1, 2)
    assert best_draft_length(setup(), ALPHA, 256, 8) == (0, 1.0)


@pytest.mark.parametrize(("gpu", "ridge"), [("H100", 295), ("H200", 206)])
def test_decode_turns_compute_bound_at_n_star(gpu: str, ridge: float) -> None:
    assert GPUS[gpu].ridge_tokens == pytest.approx(ridge, rel=0.05)


@pytest.mark.parametrize(("gpu", "length", "documented"), [("H100", 4, 59), ("H100", 8, 33), ("H200", 4, 41)])
def test_verifying_g_plus_one_tokens_is_free_while_batch_times_g_plus_one_is_below_n_star(
    gpu: str, length: int, documented: int
) -> None:
    model = setup(gpu)
    free_until = int(GPUS[gpu].ridge_tokens // (length + 1))
    assert free_until == pytest.approx(documented, rel=0.05)
    assert target_step_time(model, free_until, length + 1) == target_step_time(model, free_until, 1)
    assert target_step_time(model, free_until + 2, length + 1) > target_step_time(model, free_until + 2, 1)


def test_unbatched_speedup_matches_the_closed_form() -> None:
    model = setup()
    c = latency_ratio(model)
    for g in range(1, 9):
        closed_form = (1 - ALPHA ** (g + 1)) / ((1 - ALPHA) * (g * c + 1))
        assert speedup(model, ALPHA, 1, g) == pytest.approx(closed_form)


def test_speculation_cannot_pay_when_alpha_is_below_c() -> None:
    model = setup(draft=35e9)  # c = 0.5
    assert latency_ratio(model) == pytest.approx(0.5)
    assert best_draft_length(model, 0.45, 1, 8) == (0, 1.0)
    assert best_draft_length(model, 0.8, 1, 8)[0] > 0


def test_expected_tokens_counts_the_bonus_token() -> None:
    assert expected_tokens(0.8, 4) == pytest.approx((1 - 0.8**5) / 0.2)
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(0.8, 0) == 1.0


def test_per_token_latency_is_step_time_over_tokens_per_step() -> None:
    model = setup()
    plain = per_token_latency(model, ALPHA, 32, 0)
    assert plain == pytest.approx(target_step_time(model, 32))
    assert plain / per_token_latency(model, ALPHA, 32, LENGTH) == pytest.approx(
        speedup(model, ALPHA, 32, LENGTH)
    )


def test_break_even_of_one_length_and_of_the_best_length() -> None:
    model = setup()
    at_four = break_even_batch(model, ALPHA, LENGTH)
    assert at_four is not None and speedup(model, ALPHA, at_four, LENGTH) <= 1.0
    assert speedup(model, ALPHA, at_four - 1, LENGTH) > 1.0
    any_length = best_length_break_even_batch(model, ALPHA, 8)
    assert any_length is not None and any_length > at_four
    assert best_draft_length(model, ALPHA, any_length, 8)[0] == 0
    assert best_draft_length(model, ALPHA, any_length - 1, 8)[0] > 0


def test_long_contexts_keep_speculation_paying_at_large_batch() -> None:
    weights_only = setup()
    long_context = setup(context_tokens=8192)
    assert speedup(weights_only, ALPHA, 256, 2) < 1.0
    assert speedup(long_context, ALPHA, 256, 2) > 1.3
    assert best_length_break_even_batch(long_context, ALPHA, 8) is None
