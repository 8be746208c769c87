"""Token comparison of a speculating revision's outputs against a plain reference (domain/lossless.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specops.domain.lossless import TokenComparison, compare, match_rate, passes

words = st.lists(st.sampled_from(["a", "b", "c", "the", "of"]), max_size=12).map(" ".join)


def test_identical_outputs_match_everywhere() -> None:
    result = compare("The capital of France is Paris.", "The  capital of\nFrance is Paris.")
    assert result == TokenComparison(compared=6, matching_prefix=6, matched=6)
    assert result.identical and result.match_rate == 1.0
    assert result.describe() == "identical (6 tokens)"


def test_outputs_that_part_say_where_and_on_which_tokens() -> None:
    result = compare("one two three four five", "one two THREE four five")
    assert result.diverged_at == 2
    assert result.matching_prefix == 2
    assert (result.reference_token, result.candidate_token) == ("three", "THREE")
    # position-wise: only the third token differs
    assert result.matched == 4 and result.compared == 5
    assert result.match_rate == pytest.approx(0.8)
    assert result.describe() == "part at token 2: reference 'three', candidate 'THREE' (4/5 tokens match)"


def test_a_shorter_candidate_parts_where_it_ends_and_counts_the_rest_as_mismatches() -> None:
    result = compare("a b c d", "a b")
    assert (result.diverged_at, result.reference_token, result.candidate_token) == (2, "c", None)
    assert result.compared == 4 and result.matched == 2 and result.mismatched == 2
    assert "candidate <end>" in result.describe()


def test_a_longer_candidate_parts_after_the_reference_ends() -> None:
    result = compare("a b", "a b c")
    assert (result.diverged_at, result.reference_token, result.candidate_token) == (2, None, "c")
    assert result.match_rate == pytest.approx(2 / 3)


def test_a_shifted_output_matches_its_prefix_only() -> None:
    result = compare("x a b c d", "a b c d")
    assert result.diverged_at == 0 and result.matching_prefix == 0 and result.matched == 0


def test_two_empty_outputs_are_identical() -> None:
    result = compare("", "   ")
    assert result.identical and result.compared == 0 and result.match_rate == 1.0


def test_passes_at_zero_divergence_only_when_every_output_is_identical() -> None:
    same = compare("a b c", "a b c")
    off = compare("a b c d e f g h i j", "a b c d e f g h i J")
    assert passes([same, same], 0.0)
    assert not passes([same, off], 0.0)


def test_a_documented_divergence_rate_allows_that_share_of_tokens() -> None:
    same = compare(" ".join(["w"] * 90), " ".join(["w"] * 90))
    off = compare("a b c d e f g h i j", "a b c d e f g h i J")  # 1 of 10 tokens differs
    # 1 mismatched token of 100 compared
    assert match_rate([same, off]) == pytest.approx(0.99)
    assert passes([same, off], 0.01)
    assert not passes([same, off], 0.005)


def test_no_comparisons_is_no_evidence() -> None:
    assert not passes([], 0.0)
    assert not passes([], 1.0)
    assert match_rate([]) == 1.0


@pytest.mark.parametrize("rate", [-0.1, 1.5])
def test_a_divergence_rate_outside_zero_to_one_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="max_divergence"):
        passes([compare("a", "a")], rate)


@given(words, words)
def test_comparison_invariants(reference: str, candidate: str) -> None:
    result = compare(reference, candidate)
    assert result.compared == max(len(reference.split()), len(candidate.split()))
    assert 0 <= result.matching_prefix <= result.matched <= result.compared
    assert result.identical == (reference.split() == candidate.split())
    assert result.identical == (result.mismatched == 0)
    assert passes([result], 0.0) == result.identical
    assert compare(candidate, reference).match_rate == result.match_rate
    if not result.identical:
        assert result.matching_prefix == result.diverged_at
        assert result.reference_token != result.candidate_token
