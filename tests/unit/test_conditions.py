"""Conditions follow Kubernetes conventions: lastTransitionTime moves only on a flip."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from specops.api.conditions import ConditionUpdate, find_condition, set_condition

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_new_condition_gets_now_and_generation() -> None:
    conditions = set_condition([], ConditionUpdate("Ready", "False", "WaitingForPods", "0/2"), T0, 3)
    assert [c.model_dump(by_alias=True, exclude_none=True) for c in conditions] == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "WaitingForPods",
            "message": "0/2",
            "lastTransitionTime": "2026-11-29T12:00:00Z",
            "observedGeneration": 3,
        }
    ]


def test_same_status_new_reason_keeps_transition_time() -> None:
    first = set_condition([], ConditionUpdate("Ready", "False", "WaitingForPods", "0/2"), T0)
    later = set_condition(
        first, ConditionUpdate("Ready", "False", "InvalidSpec", "bad"), T0 + timedelta(hours=1)
    )
    condition = find_condition(later, "Ready")
    assert condition is not None
    assert condition.reason == "InvalidSpec" and condition.last_transition_time == "2026-11-29T12:00:00Z"


def test_flip_moves_transition_time_and_keeps_other_conditions() -> None:
    first = set_condition([], ConditionUpdate("Ready", "False", "WaitingForPods"), T0)
    first = set_condition(first, ConditionUpdate("Degraded", "False", "AsExpected"), T0)
    flipped = set_condition(first, ConditionUpdate("Ready", "True", "Serving"), T0 + timedelta(minutes=5))
    ready = find_condition(flipped, "Ready")
    assert ready is not None and ready.last_transition_time == "2026-11-29T12:05:00Z"
    assert find_condition(flipped, "Degraded") == first[1]
    assert first[0].status == "False"  # input not mutated
