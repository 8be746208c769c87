"""Conversions between alpha, vLLM's acceptance rate and mean accepted length (SPECDEC.md)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specops.domain.acceptance import (
    _invert,
    acceptance_rate_from_alpha,
    alpha_from_acceptance_rate,
    alpha_from_mean_accepted_length,
    mean_accepted_length_from_alpha,
)


def test_alpha_074_at_four_draft_tokens_reads_as_a_50_percent_acceptance_rate() -> None:
    assert acceptance_rate_from_alpha(0.74, 4) == pytest.approx(0.50, rel=0.05)
    assert alpha_from_acceptance_rate(0.50, 4) == pytest.approx(0.74, rel=0.05)


def test_a_50_percent_floor_on_the_rate_is_not_a_50_percent_floor_on_alpha() -> None:
    assert alpha_from_acceptance_rate(0.5, 4) > 0.7
    assert alpha_from_acceptance_rate(0.5, 8) > alpha_from_acceptance_rate(0.5, 4)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.5, 0.74, 0.8, 0.95])
@pytest.mark.parametrize("length", [1, 2, 4, 8])
def test_round_trips(alpha: float, length: int) -> None:
    rate = acceptance_rate_from_alpha(alpha, length)
    assert alpha_from_acceptance_rate(rate, length) == pytest.approx(alpha, abs=1e-9)
    mean_length = mean_accepted_length_from_alpha(alpha, length)
    assert alpha_from_mean_accepted_length(mean_length, length) == pytest.approx(alpha, abs=1e-9)


def test_mean_accepted_length_is_one_plus_accepted_per_draft() -> None:
    alpha, length = 0.8, 4
    accepted_per_draft = acceptance_rate_from_alpha(alpha, length) * length
    assert mean_accepted_length_from_alpha(alpha, length) == pytest.approx(1 + accepted_per_draft)


def test_one_draft_token_accepts_at_alpha() -> None:
    assert acceptance_rate_from_alpha(0.63, 1) == pytest.approx(0.63)


def test_extremes_saturate() -> None:
    assert acceptance_rate_from_alpha(1.0, 4) == 1.0
    assert acceptance_rate_from_alpha(0.0, 4) == 0.0
    assert alpha_from_acceptance_rate(1.2, 4) == 1.0
    assert alpha_from_acceptance_rate(-0.1, 4) == 0.0
    assert alpha_from_mean_accepted_length(1.0, 4) == 0.0
    assert alpha_from_mean_accepted_length(5.0, 4) == 1.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: acceptance_rate_from_alpha(0.8, 0),
        lambda: alpha_from_acceptance_rate(0.5, 0),
        lambda: alpha_from_mean_accepted_length(2.0, 0),
    ],
)
def test_a_draft_length_of_zero_has_no_acceptance(call: object) -> None:
    assert callable(call)
    with pytest.raises(ValueError):
        call()


@given(
    rate=st.floats(min_value=-0.1, max_value=1.1, allow_nan=False),
    length=st.floats(min_value=0.05, max_value=16.0, allow_nan=False),
)
def test_the_fast_inversion_of_an_acceptance_rate_agrees_with_plain_bisection(
    rate: float, length: float
) -> None:
    # the generic bisection (which the mean accepted length still uses) through the forward conversion
    plain = _invert(lambda alpha: acceptance_rate_from_alpha(alpha, length), rate, 0.0, 1.0)
    fast = alpha_from_acceptance_rate(rate, length)
    assert 0.0 <= fast <= 1.0
    if rate < 1.0 - 1e-6:  # closer to 1 both read the forward formula's rounding (1 - alpha^g)
        assert fast == pytest.approx(plain, abs=1e-8)
        if rate > 0.0:  # and it is the rate's alpha: converted back, it reads as the rate
            assert acceptance_rate_from_alpha(fast, length) == pytest.approx(rate, rel=1e-8)
