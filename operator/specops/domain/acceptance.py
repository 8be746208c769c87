"""Conversions between the three figures engines call "acceptance".

- alpha: per-token acceptance probability, what the performance model needs;
- acceptance rate: accepted / drafted tokens (vLLM's "draft acceptance rate"),
  = alpha (1 - alpha^g) / ((1 - alpha) g);
- mean accepted length per verification step = 1 + accepted / drafts
  = E(alpha, g) = (1 - alpha^(g+1)) / (1 - alpha).

A 50 % floor on one is not a 50 % floor on another, so every adapter converts to
alpha explicitly with the draft length that was in effect.
"""

from __future__ import annotations

from specops.domain.perf import expected_tokens


def acceptance_rate_from_alpha(alpha: float, draft_length: float) -> float:
    """Expected accepted / drafted tokens at per-token acceptance alpha and length g."""
    g = draft_length
    if g <= 0:
        raise ValueError("draft_length must be positive")
    if alpha >= 1.0:
        return 1.0
    if alpha <= 0.0:
        return 0.0
    return alpha * (1.0 - alpha**g) / ((1.0 - alpha) * g)


def mean_accepted_length_from_alpha(alpha: float, draft_length: int) -> float:
    """Expected tokens emitted per verification step (accepted drafts + the one target token)."""
    return expected_tokens(alpha, draft_length)


def _invert(func: object, value: float, lo_value: float, hi_value: float) -> float:
    """Bisection on a function increasing in alpha over [0, 1]."""
    assert callable(func)
    if value <= lo_value:
        return 0.0
    if value >= hi_value:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if func(mid) < value:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def alpha_from_acceptance_rate(rate: float, draft_length: float) -> float:
    """Per-token alpha from accepted / drafted tokens observed at (mean) draft length g.

    Newton's method on r(alpha) = alpha (1 - alpha^g) / ((1 - alpha) g), which rises from 0 to 1
    over (0, 1), kept inside a bracket that every step narrows (a step that would leave it
    bisects instead), to 1e-13 relative. The metrics snapshot inverts one rate per resource each
    cycle: bisection took about 50 evaluations and 13 us an inversion, 25 ms a cycle at 2,000
    resources; this takes 4-6 (3.5 us), and agrees with it within 1e-8 below a rate of 1 - 1e-6, where
    both are at the forward formula's rounding (tests/unit/test_acceptance.py)."""
    g = draft_length
    if g <= 0:
        raise ValueError("draft_length must be positive")
    if rate <= 0.0:
        return 0.0
    if rate >= 1.0:
        return 1.0
    lo, hi = 0.0, 1.0
    alpha = rate  # r(alpha) <= alpha: the root is at or above the rate
    for _ in range(200):
        power = alpha**g
        rest = 1.0 - alpha
        miss = alpha * (1.0 - power) / (rest * g) - rate
        if miss == 0.0:
            return alpha
        if miss < 0.0:
            lo = alpha
        else:
            hi = alpha
        slope = ((1.0 - (g + 1.0) * power) * rest + alpha * (1.0 - power)) / (rest * rest * g)
        following = alpha - miss / slope if slope > 0.0 else lo
        if not lo < following < hi:
            following = (lo + hi) / 2
        if abs(following - alpha) <= 1e-13 * alpha:
            return following
        alpha = following
    return alpha


def alpha_from_mean_accepted_length(length: float, draft_length: int) -> float:
    """Per-token alpha from the mean tokens emitted per step (1 + accepted / drafts)."""
    if draft_length <= 0:
        raise ValueError("draft_length must be positive")
    return _invert(
        lambda a: mean_accepted_length_from_alpha(a, draft_length), length, 1.0, draft_length + 1.0
    )
