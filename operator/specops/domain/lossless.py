"""Comparing a speculating revision's greedy outputs with a plain reference's, token by token.

Speculative decoding with greedy sampling should give exactly the target's own output. Some
kernels are batch-variant, though, so two engines can part after a few hundred tokens: the
check reports how much of the output matched and where it parted, and a configured
divergence rate (default 0) decides whether it passes.

Whitespace-separated words stand in for tokens: the operator has no tokenizer, and engines
return text. A word that differs in one sub-word token counts as one differing token. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenComparison:
    """One prompt's reference output against the candidate's.

    ``compared`` is the longer output's token count; positions past the shorter output count
    as mismatches. ``diverged_at`` is the first index where they differ (None when identical);
    ``reference_token``/``candidate_token`` are the tokens there, None past an output's end.
    """

    compared: int
    matching_prefix: int
    matched: int
    diverged_at: int | None = None
    reference_token: str | None = None
    candidate_token: str | None = None

    @property
    def identical(self) -> bool:
        return self.diverged_at is None

    @property
    def match_rate(self) -> float:
        """Position-wise equal tokens over the longer output's tokens (1.0 for two empty outputs)."""
        return self.matched / self.compared if self.compared else 1.0

    @property
    def mismatched(self) -> int:
        return self.compared - self.matched

    def describe(self) -> str:
        """Where the outputs part, in words: ``identical (40 tokens)`` or ``part at token 12: ...``."""
        if self.identical:
            return f"identical ({self.compared} tokens)"
        return (
            f"part at token {self.diverged_at}: reference {_shown(self.reference_token)}, "
            f"candidate {_shown(self.candidate_token)} ({self.matched}/{self.compared} tokens match)"
        )


def _shown(token: str | None) -> str:
    return "<end>" if token is None else repr(token)


def tokens(text: str) -> list[str]:
    """The token proxy: whitespace-separated words."""
    return text.split()


def compare(reference: str, candidate: str) -> TokenComparison:
    """Compare two outputs token by token (whitespace-separated words)."""
    ref, cand = tokens(reference), tokens(candidate)
    compared = max(len(ref), len(cand))
    matched = sum(1 for a, b in zip(ref, cand, strict=False) if a == b)
    diverged_at = next((i for i in range(compared) if _at(ref, i) != _at(cand, i)), None)
    if diverged_at is None:
        return TokenComparison(compared=compared, matching_prefix=compared, matched=matched)
    return TokenComparison(
        compared=compared,
        matching_prefix=diverged_at,
        matched=matched,
        diverged_at=diverged_at,
        reference_token=_at(ref, diverged_at),
        candidate_token=_at(cand, diverged_at),
    )


def _at(words: list[str], index: int) -> str | None:
    return words[index] if index < len(words) else None


def match_rate(comparisons: Iterable[TokenComparison]) -> float:
    """Matched tokens over compared tokens across every prompt (1.0 when nothing was generated)."""
    items = list(comparisons)
    compared = sum(c.compared for c in items)
    return sum(c.matched for c in items) / compared if compared else 1.0


def passes(comparisons: Iterable[TokenComparison], max_divergence: float) -> bool:
    """Whether the mismatched share of all compared tokens is within ``max_divergence`` (0-1).

    With 0 (the default a spec gives), every output must be identical. No comparisons at all
    is no evidence, and does not pass.
    """
    if not 0.0 <= max_divergence <= 1.0:
        raise ValueError(f"max_divergence must be within [0, 1], got {max_divergence}")
    items = list(comparisons)
    if not items:
        return False
    mismatched = sum(c.mismatched for c in items)
    if max_divergence == 0.0:
        return mismatched == 0
    compared = sum(c.compared for c in items)
    return mismatched <= max_divergence * compared + 1e-9
