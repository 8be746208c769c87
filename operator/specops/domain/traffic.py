"""Traffic-split arithmetic: how many canary replicas give a weight, and what weight they give."""

from __future__ import annotations

import math


def canary_replicas_for(weight: int, stable_replicas: int) -> int:
    """Canary replicas so that canary / (canary + stable) is as close as possible to weight %."""
    if weight <= 0:
        return 0
    if weight >= 100 or stable_replicas <= 0:
        return max(1, stable_replicas)
    return max(1, math.ceil(weight * stable_replicas / (100 - weight)))


def achieved_weight(canary_replicas: int, stable_replicas: int) -> int:
    total = canary_replicas + stable_replicas
    return round(100 * canary_replicas / total) if total else 0
