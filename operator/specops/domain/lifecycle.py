"""Pure judgements of the reconcile step: drift, readiness, advisories, invalid specs.

The reconciler service gathers (reads children), calls these, and writes what
they return; nothing here touches the network or the clock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from specops.api.conditions import (
    DEGRADED,
    DRAFT_MISMATCH,
    DRAFT_SIZE_ADVISORY,
    EVENTFUL_CONDITIONS,
    PROGRESSING,
    READY,
    Condition,
    ConditionUpdate,
    Reason,
)
from specops.api.models import SpeculativeDeploymentSpec
from specops.domain import perf

# A draft whose latency ratio c reaches this leaves little room: speculation pays only while alpha > c.
MAX_USEFUL_LATENCY_RATIO = 0.25
# Below this share of the target's parameters a standalone draft rarely reaches useful acceptance.
MIN_USEFUL_PARAMETER_SHARE = 0.002


@dataclass(frozen=True)
class EventRecord:
    """An Event to post on the resource; `type` is Normal or Warning."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def condition_events(
    old: Sequence[Condition],
    new: Sequence[Condition],
    warn_when: Mapping[str, str] = EVENTFUL_CONDITIONS,
    announce_first: frozenset[str] = frozenset(),
) -> list[EventRecord]:
    """An Event for each watched condition whose status or reason changed.

    `warn_when` maps a condition type to the status that deserves a Warning (the other
    statuses give Normal Events). A condition seen for the first time is news only when
    it is in that warning status, or when its type is in `announce_first`.
    """
    events = []
    for condition in new:
        warn_status = warn_when.get(condition.type)
        if warn_status is None:
            continue
        before = next((c for c in old if c.type == condition.type), None)
        if before and before.status == condition.status and before.reason == condition.reason:
            continue
        if before is None and condition.status != warn_status and condition.type not in announce_first:
            continue
        kind: Literal["Normal", "Warning"] = "Warning" if condition.status == warn_status else "Normal"
        message = condition.message or f"{condition.type} is {condition.status}"
        events.append(EventRecord(kind, condition.reason, message))
    return events


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field specops sets is already so on the live object.

    The API server adds defaults (and other controllers add annotations) but never
    removes what we set, so "desired is contained in live" means nothing to write,
    both on a real cluster and on the emulated one.
    """
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(key in live and is_subset(value, live[key]) for key, value in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        return all(is_subset(d, v) for d, v in zip(desired, live, strict=True))
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired is live
    if isinstance(desired, (int, float)) and isinstance(live, (int, float)):
        return float(desired) == float(live)
    return bool(desired == live)


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(ref.get("uid") == owner_uid for ref in obj.get("metadata", {}).get("ownerReferences", []))


_FIELD_PREFIX = re.compile(r"^([A-Za-z][\w.\[\]]*): (.*)$", re.S)


def describe_validation_error(error: ValidationError, prefix: str = "") -> str:
    """One line per problem, each naming the field as kubectl would (spec.speculation.draftLength).

    Cross-field rules raise "relative.path: message"; the relative path is appended to
    the location of the model that raised it.
    """
    lines = []
    for problem in error.errors():
        parts = [prefix] if prefix else []
        parts += [str(part) for part in problem["loc"] if part != "__root__"]
        message = str(problem["msg"]).removeprefix("Value error, ")
        relative = _FIELD_PREFIX.match(message)
        if relative:
            parts.append(relative.group(1))
            message = relative.group(2)
        lines.append(f"{'.'.join(parts) or 'spec'}: {message}")
    return "; ".join(lines)


@dataclass(frozen=True)
class Readiness:
    phase: Literal["Pending", "Degraded", "Serving"]
    conditions: tuple[ConditionUpdate, ...]


def readiness_signature(deployment: Mapping[str, Any]) -> tuple[object, ...]:
    """What of a serving Deployment `readiness` reads: an event that leaves it unchanged (a
    metadata or spec write, a status field nobody judges) cannot change the owner's conditions."""
    meta, status = deployment.get("metadata") or {}, deployment.get("status") or {}
    available = next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Available"), None
    )
    return (
        meta.get("uid"),
        meta.get("generation"),
        meta.get("deletionTimestamp") is not None,
        status.get("observedGeneration"),
        status.get("readyReplicas"),
        status.get("updatedReplicas"),
        available,
    )


def readiness(desired_replicas: int, deployments: Sequence[Mapping[str, Any] | None]) -> Readiness:
    """Ready / Progressing / Degraded from the serving Deployments' status."""
    present = [d for d in deployments if d is not None]
    if len(present) < len(deployments):
        return Readiness(
            "Pending",
            (
                ConditionUpdate(
                    READY, "False", Reason.WAITING_FOR_PODS, "serving Deployment not created yet"
                ),
                ConditionUpdate(PROGRESSING, "True", Reason.CHILDREN_CREATED, "creating serving objects"),
                ConditionUpdate(DEGRADED, "False", Reason.AS_EXPECTED, ""),
            ),
        )
    ready = sum(int(d.get("status", {}).get("readyReplicas") or 0) for d in present)
    updated = sum(int(d.get("status", {}).get("updatedReplicas") or 0) for d in present)
    stale = any(
        int(d.get("status", {}).get("observedGeneration") or 0)
        < int(d.get("metadata", {}).get("generation") or 0)
        for d in present
    )
    unavailable = any(
        c.get("type") == "Available" and c.get("status") == "False"
        for d in present
        for c in d.get("status", {}).get("conditions", [])
    )
    if desired_replicas == 0:
        return Readiness(
            "Serving",
            (
                ConditionUpdate(READY, "True", Reason.SCALED_TO_ZERO, "serving.replicas is 0"),
                ConditionUpdate(PROGRESSING, "False", Reason.ROLLOUT_COMPLETE, ""),
                ConditionUpdate(DEGRADED, "False", Reason.AS_EXPECTED, ""),
            ),
        )
    message = f"{ready}/{desired_replicas} serving pods ready"
    if ready >= desired_replicas and updated >= desired_replicas and not stale:
        return Readiness(
            "Serving",
            (
                ConditionUpdate(READY, "True", Reason.SERVING, message),
                ConditionUpdate(PROGRESSING, "False", Reason.ROLLOUT_COMPLETE, message),
                ConditionUpdate(DEGRADED, "False", Reason.AS_EXPECTED, ""),
            ),
        )
    if ready >= desired_replicas:
        # A rollout in progress with every replica serving: still Ready.
        return Readiness(
            "Serving",
            (
                ConditionUpdate(READY, "True", Reason.SERVING, message),
                ConditionUpdate(PROGRESSING, "True", Reason.ROLLING_UPDATE, f"rolling out; {message}"),
                ConditionUpdate(DEGRADED, "False", Reason.AS_EXPECTED, ""),
            ),
        )
    if ready > 0:
        # Reduced capacity still serves: the control loop keeps running on the ready pods.
        return Readiness(
            "Serving",
            (
                ConditionUpdate(READY, "True", Reason.SERVING, message),
                ConditionUpdate(PROGRESSING, "True", Reason.WAITING_FOR_PODS, message),
                ConditionUpdate(DEGRADED, "True", Reason.REPLICAS_UNAVAILABLE, message),
            ),
        )
    degraded = ConditionUpdate(DEGRADED, "False", Reason.AS_EXPECTED, "")
    if unavailable:
        degraded = ConditionUpdate(
            DEGRADED, "True", Reason.WAITING_FOR_PODS, f"no serving pod available; {message}"
        )
    return Readiness(
        "Degraded" if degraded.status == "True" else "Pending",
        (
            ConditionUpdate(READY, "False", Reason.WAITING_FOR_PODS, message),
            ConditionUpdate(PROGRESSING, "True", Reason.WAITING_FOR_PODS, message),
            degraded,
        ),
    )


def advisories(spec: SpeculativeDeploymentSpec) -> tuple[ConditionUpdate, ...]:
    """Advice, never refusal: draft kind vs target architecture, and draft size vs usefulness."""
    target, draft = spec.target, spec.draft
    if draft.method in ("draftModel", "eagle3") and (draft.model == target.model or draft.uri == target.uri):
        same = "model" if draft.model == target.model else "checkpoint"
        mismatch = ConditionUpdate(
            DRAFT_MISMATCH,
            "True",
            Reason.DRAFT_IS_TARGET,
            f"draft and target are the same {same} ({draft.model if same == 'model' else draft.uri}): "
            "every drafted token costs a full target step, so speculation cannot pay; use a smaller draft",
        )
    elif target.architecture == "moe" and draft.kind != "expertDistilled":
        mismatch = ConditionUpdate(
            DRAFT_MISMATCH,
            "True",
            Reason.DENSE_DRAFT_FOR_MOE,
            f"target is mixture-of-experts but the draft is {draft.kind}: a dense draft fits MoE routing poorly "
            "and acceptance usually suffers; prefer an expert-distilled draft",
        )
    else:
        mismatch = ConditionUpdate(DRAFT_MISMATCH, "False", Reason.DRAFT_MATCHES_TARGET, "")
    setup = perf.ModelSetup(
        gpu=perf.GPUS[spec.serving.gpu.type],
        target_params=target.active_parameter_count,
        draft_params=draft.parameter_count_for(target.active_parameter_count),
        tensor_parallel=spec.serving.tensor_parallel,
    )
    ratio = perf.latency_ratio(setup)
    share = draft.parameter_count_for(target.active_parameter_count) / target.active_parameter_count
    if ratio >= MAX_USEFUL_LATENCY_RATIO:
        size = ConditionUpdate(
            DRAFT_SIZE_ADVISORY,
            "True",
            Reason.DRAFT_TOO_LARGE,
            f"draft/target step-time ratio c={ratio:.2f} ({share:.1%} of the target's parameters): speculation "
            f"pays only while per-token acceptance exceeds c, and little even then; a smaller draft is advised",
        )
    elif draft.method == "draftModel" and share < MIN_USEFUL_PARAMETER_SHARE:
        size = ConditionUpdate(
            DRAFT_SIZE_ADVISORY,
            "True",
            Reason.DRAFT_TOO_SMALL,
            f"draft is {share:.2%} of the target's parameters: drafts this small rarely reach useful acceptance",
        )
    else:
        size = ConditionUpdate(
            DRAFT_SIZE_ADVISORY,
            "False",
            Reason.DRAFT_SIZE_OK,
            f"latency ratio c={ratio:.3f}, {share:.1%} of target",
        )
    return (mismatch, size)
