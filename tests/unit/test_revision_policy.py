"""Deciding a deployment's revision from its learned curve: schedule, expected speed, verdict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from specops.domain.engines.schedule import Schedule
from specops.domain.learning import Anchor
from specops.domain.perf import expected_tokens
from specops.domain.revision_policy import Evidence, best_schedule, expected_speedup, verdict

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


class Curve:
    """A speedup curve with a known shape: expected tokens over a verification cost growing with batch."""

    def __init__(self, per_token_cost: float, batch_scale: float) -> None:
        self.per_token_cost = per_token_cost
        self.batch_scale = batch_scale

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        if draft_length == 0:
            return 1.0
        expected = (1 - alpha ** (draft_length + 1)) / (1 - alpha)
        return expected / (1 + draft_length * (self.per_token_cost + batch / self.batch_scale))


def test_the_schedule_shortens_k_as_batches_grow_and_stops_where_nothing_pays() -> None:
    curve = Curve(per_token_cost=0.05, batch_scale=100)
    schedule = best_schedule(curve, alpha=0.8, max_k=8, margin=0.02)
    assert schedule is not None
    ks = [schedule.k_at(b) for b in (1, 8, 32, 128, 1024)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1] == 0
    for batch in (1, 16, 64):  # every band keeps its promise at its heaviest batch
        k = schedule.k_at(batch)
        assert k == 0 or curve.predict_speedup(0.8, k, batch) > 1.02


def test_no_schedule_when_speculation_never_pays() -> None:
    assert best_schedule(Curve(per_token_cost=0.9, batch_scale=10), alpha=0.5, max_k=8) is None


def test_a_schedule_that_pays_at_every_batch_is_unbounded() -> None:
    schedule = best_schedule(Curve(per_token_cost=0.0, batch_scale=1e9), alpha=0.9, max_k=4)
    assert schedule is not None and schedule.bands[-1] == (None, 4)


def test_expected_speedup_charges_k0_inside_a_speculating_engine() -> None:
    curve = Curve(per_token_cost=0.05, batch_scale=100)
    only_zero = Schedule.of([[1, 2], [None, 0]])
    heavy = {200.0: 1.0}
    assert expected_speedup(curve, 0.8, only_zero, heavy, k0_cost=0.1) == pytest.approx(1 / 1.1)
    assert expected_speedup(curve, 0.8, None, heavy) == 1.0  # plain is the reference
    light = {1.0: 3.0, 200.0: 1.0}
    mixed = expected_speedup(curve, 0.8, only_zero, light, k0_cost=0.1)
    assert mixed == pytest.approx((3 * curve.predict_speedup(0.8, 2, 1.0) + 1 / 1.1) / 4)


@pytest.mark.parametrize(
    ("kwargs", "roll", "reason"),
    [
        ({}, True, "RevisionProposed"),
        ({"proposed_speed": 1.02}, False, "GainBelowThreshold"),
        ({"last_change": NOW - timedelta(minutes=10)}, False, "TooSoon"),
        ({"last_change": NOW - timedelta(minutes=31)}, True, "RevisionProposed"),
        ({"canary_running": True}, False, "CanaryRunning"),
        ({"rollout_running": True}, False, "RolloutRunning"),
        ({"proposed": Schedule.constant(3)}, False, "AlreadyServing"),
    ],
)
def test_verdict(kwargs: dict[str, object], roll: bool, reason: str) -> None:
    args: dict[str, object] = {
        "current": Schedule.constant(3),
        "proposed": Schedule.of([[16, 3], [None, 0]]),
        "current_speed": 1.0,
        "proposed_speed": 1.2,
        "min_gain": 0.03,
        "min_interval_s": 1800.0,
        "last_change": None,
        "now": NOW,
        "canary_running": False,
        "rollout_running": False,
    }
    args.update(kwargs)
    result = verdict(**args)  # type: ignore[arg-type]
    assert (result.roll, result.reason) == (roll, reason)
    assert result.message


class Steps:
    """Step times whose round grows steeply with K (a fit that overstates the draft's cost)."""

    def step_s(self, draft_length: int, batch: float, context_tokens: float | None = None) -> float:
        return 0.010 * (1 + draft_length)

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        return 1.0


class Sure:
    def confidence(self, batch: float) -> object:
        return None


def test_no_prediction_beats_the_tokens_a_round_is_expected_to_give() -> None:
    # a band measured at K=4 (round 20 ms, plain 10 ms); scaled down the steep shape to K=1 the
    # round would take less than a plain step, and K=1 would promise more than its 1.8 tokens
    anchor = Anchor(plain_s=0.010, k=4, round_s=0.020)
    model = Evidence(Steps(), Steps(), Sure(), anchors={48.0: anchor}, steps=Steps())
    assert model.predict_speedup(0.8, 1, 48.0) == pytest.approx(expected_tokens(0.8, 1))
    assert model.predict_speedup(0.8, 4, 48.0) == pytest.approx(expected_tokens(0.8, 4) * 0.010 / 0.020)
