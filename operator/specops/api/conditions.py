"""Status conditions, the Kubernetes way: one helper, constant reasons, stable timestamps.

`lastTransitionTime` changes only when a condition's status flips; a new reason or
message with the same status keeps the old timestamp (as `meta.SetStatusCondition`
does in Go). Functions take and return plain lists of dicts so status patches stay
JSON and a test can assert them directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

ConditionStatus = Literal["True", "False", "Unknown"]

# Condition types.
READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
DRAFT_MISMATCH = "DraftMismatch"
DRAFT_SIZE_ADVISORY = "DraftSizeAdvisory"
METRICS_UNAVAILABLE = "MetricsUnavailable"
SPECULATION_APPLIED = "SpeculationApplied"
ACCEPTANCE_BELOW_SLO = "AcceptanceBelowSLO"


class Reason:
    """UpperCamelCase reasons; specific, never a generic "Synced"."""

    SERVING = "Serving"
    INVALID_SPEC = "InvalidSpec"
    BACKEND_NOT_SUPPORTED = "BackendNotSupported"
    ACCEPTANCE_BELOW_SLO = "AcceptanceBelowSLO"
    ACCEPTANCE_OK = "AcceptanceOK"
    CHILDREN_CREATED = "ChildrenCreated"
    CHILDREN_UPDATED = "ChildrenUpdated"
    WAITING_FOR_PODS = "WaitingForPods"
    REPLICAS_UNAVAILABLE = "ReplicasUnavailable"
    ROLLING_UPDATE = "RollingUpdate"
    ROLLOUT_COMPLETE = "RolloutComplete"
    SCALED_TO_ZERO = "ScaledToZero"
    APPLY_FAILED = "ApplyFailed"
    AS_EXPECTED = "AsExpected"
    DENSE_DRAFT_FOR_MOE = "DenseDraftForMoE"
    DRAFT_MATCHES_TARGET = "DraftMatchesTarget"
    DRAFT_TOO_LARGE = "DraftTooLarge"
    DRAFT_TOO_SMALL = "DraftTooSmall"
    DRAFT_SIZE_OK = "DraftSizeOK"
    PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"
    METRICS_OK = "MetricsOK"
    ALL_PODS_APPLIED = "AllPodsApplied"
    PARTIALLY_APPLIED = "PartiallyApplied"


@dataclass(frozen=True)
class ConditionUpdate:
    type: str
    status: ConditionStatus
    reason: str
    message: str = ""


def format_time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """The datetime of an RFC 3339 status field; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def set_condition(
    conditions: list[dict[str, Any]],
    update: ConditionUpdate,
    now: datetime,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new list with `update` applied; lastTransitionTime moves only on a status flip."""
    result: list[dict[str, Any]] = []
    found = False
    for existing in conditions:
        if existing.get("type") != update.type:
            result.append(dict(existing))
            continue
        found = True
        flipped = existing.get("status") != update.status
        transition = format_time(now) if flipped else existing.get("lastTransitionTime", format_time(now))
        result.append(_condition(update, transition, observed_generation))
    if not found:
        result.append(_condition(update, format_time(now), observed_generation))
    return result


def set_conditions(
    conditions: list[dict[str, Any]],
    updates: list[ConditionUpdate],
    now: datetime,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    for update in updates:
        conditions = set_condition(conditions, update, now, observed_generation)
    return conditions


def remove_condition(conditions: list[dict[str, Any]], condition_type: str) -> list[dict[str, Any]]:
    return [dict(c) for c in conditions if c.get("type") != condition_type]


def find_condition(conditions: list[dict[str, Any]], condition_type: str) -> dict[str, Any] | None:
    for condition in conditions:
        if condition.get("type") == condition_type:
            return condition
    return None


def _condition(update: ConditionUpdate, transition: str, observed_generation: int | None) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": update.type,
        "status": update.status,
        "reason": update.reason,
        "message": update.message,
        "lastTransitionTime": transition,
    }
    if observed_generation is not None:
        condition["observedGeneration"] = observed_generation
    return condition
