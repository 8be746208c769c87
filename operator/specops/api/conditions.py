"""Status conditions, the Kubernetes way: every type and reason in one place, stable timestamps.

`lastTransitionTime` changes only when a condition's status flips; a new reason or
message with the same status keeps the old timestamp (as `meta.SetStatusCondition`
does in Go). Functions take and return typed `Condition` lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from specops.api.status import Condition
from specops.api.units import format_time, parse_time

__all__ = ["Condition", "ConditionUpdate", "Reason", "format_time", "parse_time"]

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
CANARY_ROLLOUT = "CanaryRollout"
DRAFT_STALE = "DraftStale"
DRAFT_REJECTED = "DraftRejected"
RETRAINING = "Retraining"
CALIBRATION_PROFILE = "CalibrationProfile"


class Reason:
    """UpperCamelCase reasons of conditions and Events; specific, never a generic "Synced"."""

    # lifecycle
    SERVING = "Serving"
    INVALID_SPEC = "InvalidSpec"
    TICK_FAILED = "TickFailed"
    BACKEND_NOT_SUPPORTED = "BackendNotSupported"
    CHILDREN_CREATED = "ChildrenCreated"
    WAITING_FOR_PODS = "WaitingForPods"
    REPLICAS_UNAVAILABLE = "ReplicasUnavailable"
    ROLLING_UPDATE = "RollingUpdate"
    ROLLOUT_COMPLETE = "RolloutComplete"
    SCALED_TO_ZERO = "ScaledToZero"
    APPLY_FAILED = "ApplyFailed"
    AS_EXPECTED = "AsExpected"
    # advisories
    DENSE_DRAFT_FOR_MOE = "DenseDraftForMoE"
    DRAFT_MATCHES_TARGET = "DraftMatchesTarget"
    DRAFT_IS_TARGET = "DraftIsTarget"
    DRAFT_TOO_LARGE = "DraftTooLarge"
    DRAFT_TOO_SMALL = "DraftTooSmall"
    DRAFT_SIZE_OK = "DraftSizeOK"
    # control loop
    ACCEPTANCE_BELOW_SLO = "AcceptanceBelowSLO"
    ACCEPTANCE_OK = "AcceptanceOK"
    ACCEPTANCE_COLLAPSED = "AcceptanceCollapsed"
    TRAFFIC_MOVED = "TrafficMoved"
    HOLDBACK_WEIGHT_NOT_SET = "HoldbackWeightNotSet"
    NOT_SPECULATING = "NotSpeculating"
    PROMETHEUS_UNREACHABLE = "PrometheusUnreachable"
    METRICS_OK = "MetricsOK"
    ALL_PODS_APPLIED = "AllPodsApplied"
    PARTIALLY_APPLIED = "PartiallyApplied"
    SPECULATION_OFF_DRAFT_STALE = "SpeculationOffDraftStale"
    PROFILE_LOADED = "ProfileLoaded"
    PROFILE_NOT_FOUND = "ProfileNotFound"
    PROFILE_INVALID = "ProfileInvalid"
    SPECULATION_OFF_DRAFT_UNCHECKED = "SpeculationOffDraftUnchecked"
    # canary
    CANARY_STARTED = "CanaryStarted"
    CANARY_PROGRESSING = "CanaryProgressing"
    CANARY_STEP_STARTED = "CanaryStepStarted"
    CANARY_WEIGHT_ROUNDED = "CanaryWeightRounded"
    SPEC_DRAFT_REJECTED = "SpecDraftRejected"
    SPEC_DRAFT_SERVING = "SpecDraftServing"
    SPEC_DRAFT_PENDING = "SpecDraftPending"
    CANARY_PROMOTING = "CanaryPromoting"
    CANARY_PROMOTED = "CanaryPromoted"
    CANARY_ROLLED_BACK = "CanaryRolledBack"
    CANARY_ABORTED = "CanaryAborted"
    CANARY_SUPERSEDED = "CanarySuperseded"
    CANARY_ACTION_IGNORED = "CanaryActionIgnored"
    LOSSLESS_CHECK_PASSED = "LosslessCheckPassed"
    LOSSLESS_CHECK_FAILED = "LosslessCheckFailed"
    LOSSLESS_CHECK_UNRUNNABLE = "LosslessCheckUnrunnable"
    NOT_LOSSLESS = "NotLossless"
    DRAFT_REPLACED = "DraftReplaced"
    TRAFFIC_SPLIT_FAILED = "TrafficSplitFailed"
    ROUTE_RELEASED = "RouteReleased"
    ROUTE_NOT_RELEASED = "RouteNotReleased"
    ROUTE_RELEASE_ABANDONED = "RouteReleaseAbandoned"
    ROUTE_REPAIRED = "RouteRepaired"
    # retraining
    TARGET_VERSION_CHANGED = "TargetVersionChanged"
    DRAFT_CURRENT = "DraftCurrent"
    INVALID_TEMPLATE = "InvalidTemplate"
    RETRAINING_STARTED = "RetrainingStarted"
    RETRAINING_SUCCEEDED = "RetrainingSucceeded"
    RETRAINING_FAILED = "RetrainingFailed"
    RETRAINING_SUPERSEDED = "RetrainingSuperseded"
    RETRAINING_BACKOFF = "RetrainingBackoff"
    RETRAINING_GAVE_UP = "RetrainingGaveUp"
    RETRAINING_IDLE = "RetrainingIdle"


# Conditions whose changes become Events: type -> the status that deserves a Warning (the other
# statuses give Normal Events; a condition seen for the first time is news only in that status).
EVENTFUL_CONDITIONS: dict[str, str] = {
    READY: "False",
    DEGRADED: "True",
    DRAFT_MISMATCH: "True",
    DRAFT_SIZE_ADVISORY: "True",
    METRICS_UNAVAILABLE: "True",
    SPECULATION_APPLIED: "False",
    DRAFT_STALE: "True",
    CALIBRATION_PROFILE: "False",
}


@dataclass(frozen=True)
class ConditionUpdate:
    type: str
    status: ConditionStatus
    reason: str
    message: str = ""


def set_condition(
    conditions: Sequence[Condition],
    update: ConditionUpdate,
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    """A new list with `update` applied; lastTransitionTime moves only on a status flip."""
    result: list[Condition] = []
    found = False
    for existing in conditions:
        if existing.type != update.type:
            result.append(existing)
            continue
        found = True
        if (
            existing.status == update.status
            and existing.reason == update.reason
            and existing.message == update.message
            and existing.observed_generation == observed_generation
        ):
            result.append(existing)  # unchanged: the same object (most ticks of most resources)
            continue
        flipped = existing.status != update.status
        transition = format_time(now) if flipped else existing.last_transition_time
        result.append(_condition(update, transition, observed_generation))
    if not found:
        result.append(_condition(update, format_time(now), observed_generation))
    return result


def set_conditions(
    conditions: Sequence[Condition],
    updates: Sequence[ConditionUpdate],
    now: datetime,
    observed_generation: int | None = None,
) -> list[Condition]:
    result = list(conditions)
    for update in updates:
        result = set_condition(result, update, now, observed_generation)
    return result


def find_condition(conditions: Sequence[Condition], condition_type: str) -> Condition | None:
    for condition in conditions:
        if condition.type == condition_type:
            return condition
    return None


def is_true(conditions: Sequence[Condition], condition_type: str) -> bool:
    condition = find_condition(conditions, condition_type)
    return condition is not None and condition.status == "True"


def _condition(update: ConditionUpdate, transition: str, observed_generation: int | None) -> Condition:
    return Condition(
        type=update.type,
        status=update.status,
        reason=update.reason,
        message=update.message,
        last_transition_time=transition,
        observed_generation=observed_generation,
    )
