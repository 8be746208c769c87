"""Traffic-split arithmetic: how many canary replicas give a weight, what weight they give, and the
holdback's weight beside speculating pods."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


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


WEIGHT_STEP = 5
"""Holdback weights move in steps of this many percent (finer moves are within the noise)."""
WEIGHT_CONFIDENCE = 0.05
"""A measured speedup within this of 1 (or the spec's margin, if wider) leaves the split even: one
interval's latencies carry a few percent of noise per pod."""
WEIGHT_REACH = 1.4
"""A held pod carries between 1/WEIGHT_REACH and WEIGHT_REACH times its even share: enough to
measure plain speed, and never far past the batches its latency was measured at."""


@dataclass(frozen=True)
class Split:
    """The holdback's weight and the evidence it rests on."""

    weight: int
    """Percent of the fleet's traffic for the held-back plain pods."""
    speedup: float | None = None
    """The speculating pods' measured speedup over plain at their batch (None: not measured)."""


def holdback_weight(
    *,
    stable_pods: int,
    held_pods: int,
    stable_batch: float,
    stable_tpot_s: float,
    plain_batch: float,
    plain_tpot_s: float,
    plain_step_s: Callable[[float], float],
    margin: float,
) -> Split:
    """Percent of the fleet's traffic for the held-back plain pods, beside speculating stable pods.

    The speculating pods' speedup is measured, not predicted: the holdback's latency carried to the
    stable pods' batch along the plain step's shape (``plain_step_s``, the fitted model's), over the
    stable pods' latency. Within ``margin`` of 1 the split stays even; otherwise the weight that
    minimises the fleet's batch-weighted per-token latency at the current load, taking the measured
    speedup as holding nearby and each pod's latency as the plain shape at the batch it would carry.
    Only a measured slowdown moves traffic: a gain leaves the split even, so that the holdback
    measures plain speed at the batches the speculating pods carry.
    """
    even = even_weight(stable_pods, held_pods)
    load = stable_batch * stable_pods + plain_batch * held_pods
    if stable_pods <= 0 or held_pods <= 0 or load <= 0 or stable_tpot_s <= 0 or plain_tpot_s <= 0:
        return Split(even)
    measured_at = max(1.0, plain_batch)
    level = plain_tpot_s / plain_step_s(measured_at)

    def plain_at(batch: float) -> float:
        return level * plain_step_s(max(1.0, batch))

    speedup = plain_at(stable_batch) / stable_tpot_s
    if speedup >= 1.0 - max(margin, WEIGHT_CONFIDENCE):
        return Split(even, speedup)

    def fleet_tpot(weight: float) -> float:
        held = load * weight / 100.0
        stable = load - held
        return (stable * plain_at(stable / stable_pods) / speedup + held * plain_at(held / held_pods)) / load

    low, high = _stepped(even / WEIGHT_REACH), min(100 - WEIGHT_STEP, _stepped(even * WEIGHT_REACH))
    candidates = sorted({*range(low, high + 1, WEIGHT_STEP), even})
    return Split(min(candidates, key=lambda w: (fleet_tpot(float(w)), abs(w - even))), speedup)


def even_weight(stable_pods: int, held_pods: int) -> int:
    """The held pods' even share of traffic, in WEIGHT_STEP percent steps."""
    pods = stable_pods + held_pods
    return _stepped(100.0 * held_pods / pods) if pods else 0


def _stepped(weight: float) -> int:
    return max(WEIGHT_STEP, int(WEIGHT_STEP * round(weight / WEIGHT_STEP)))
