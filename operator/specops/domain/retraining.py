"""Draft retraining: when a round starts, the training Job it runs in, and how it ended.

A round is one training run that produces a new draft for the target version in
service. It starts when the target's version changes (the draft is then stale) or
when acceptance stays below ``slo.minAcceptance`` for ``triggers.acceptanceBelowSLO.for``
(at most once per ``cooldown``). Only one round runs at a time; a failed round is
retried after an exponential, capped backoff, and after ``MAX_CONSECUTIVE_FAILURES``
failures of the same setup specops stops until that setup (target version, draft or
spec.retraining) changes, so a broken template never becomes a Job factory.

The trainer runs in a batch/v1 Job, a JobSet, a Kubeflow TrainJob or a PyTorchJob
built from ``spec.retraining.template``; every trainer container receives the same
contract (``SPECOPS_*`` environment variables, see ``contract_env``) and publishes its
result as JSON in its termination message or in the ``specops.dev/result`` annotation.

Everything round-related the operator must remember lives in ``status.retraining``
(``RetrainingState.to_status``), so an operator restart resumes the same round, and a
Job name derived from that state is the same however often the operator restarts.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from specops.api.conditions import ConditionUpdate, format_time, parse_time
from specops.api.models import ENGINE_URI_PATTERN, SpeculativeDeployment, SpeculativeDeploymentSpec
from specops.api.units import parse_duration
from specops.domain.render import (
    APP_NAME,
    GPU_RESOURCE,
    LABEL_COMPONENT,
    LABEL_DEPLOYMENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    RenderError,
    bounded,
    label_value,
    owner_reference,
)

TriggerReason = Literal["TargetVersionChanged", "AcceptanceBelowSLO"]
TARGET_VERSION_CHANGED: TriggerReason = "TargetVersionChanged"
ACCEPTANCE_BELOW_SLO: TriggerReason = "AcceptanceBelowSLO"

COMPONENT_RETRAINING = "retraining"
LABEL_ROUND = "specops.dev/retraining-round"
LABEL_JOB = "specops.dev/retraining-job"
ANNOTATION_RESULT = "specops.dev/result"
ANNOTATION_OUTPUT_VERSION = "specops.dev/output-version"
ANNOTATION_TRIGGER = "specops.dev/retraining-trigger"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
"""Set by the JobSet controller on every pod; a TrainJob's JobSet carries the TrainJob's name."""

DEFAULT_RESULT_PATH = "/dev/termination-log"
TRAINER_CONTAINER = "trainer"

MAX_JOB_NAME = 40
"""Well under 63: a JobSet names its Jobs ``<jobset>-<replicatedJob>-<index>`` and their pods
get hostnames from that, which must stay valid DNS labels too."""
MAX_VERSION = 63
JOB_BACKOFF_LIMIT = 1
"""A single-pod trainer may retry once (a lost node); more only burns GPU hours on a real bug."""
DISTRIBUTED_BACKOFF_LIMIT = 0
"""One rank restarting alone cannot rejoin a torch.distributed group: fail the Job, restart the set."""
JOBSET_MAX_RESTARTS = 1
TTL_AFTER_FINISHED_S = 86400
"""Finished Jobs stay a day: long enough for the outcome to be read and for people to read logs."""

BACKOFF_BASE_S = 600.0
BACKOFF_CAP_S = 12 * 3600.0
MAX_CONSECUTIVE_FAILURES = 5

_VERSION_ALLOWED = re.compile(r"[^A-Za-z0-9_.-]+")
_DNS_ALLOWED = re.compile(r"[^a-z0-9-]+")
_VERSION_PATTERN = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class TemplateError(RenderError):
    """spec.retraining.template (or image) cannot make a training Job; ``field`` names what to fix."""


# ---------------------------------------------------------------- state kept in status.retraining


@dataclass(frozen=True)
class ActiveRound:
    """The round whose Job runs now; enough to find the Job again after a restart."""

    job_name: str
    api_version: str
    kind: str
    reason: TriggerReason
    round_number: int
    target_version: str
    output_version: str
    started_at: datetime


@dataclass(frozen=True)
class TrainedDraft:
    """A draft a finished round published, waiting for its canary (or for a person)."""

    draft_version: str
    engine_uri: str
    target_version: str
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RetrainingState:
    """Everything about retraining the operator must remember, as kept in status.retraining."""

    draft_target_version: str | None = None
    """Target version the draft in service was trained or validated for."""
    rounds: int = 0
    """Rounds started so far; numbers the next round and its Job name."""
    active: ActiveRound | None = None
    trained: TrainedDraft | None = None
    last_finished_at: datetime | None = None
    last_result: Literal["Succeeded", "Failed"] | None = None
    last_message: str = ""
    consecutive_failures: int = 0
    failure_key: str | None = None
    """Setup digest (``setup_key``) the consecutive failures were counted for."""
    alpha_below_since: datetime | None = None

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None, *, default_target_version: str) -> RetrainingState:
        """Parse status.retraining; a resource seen for the first time adopts its draft as current."""
        data = status or {}
        active = data.get("active")
        trained = data.get("trained")
        return cls(
            draft_target_version=data.get("draftTargetVersion") or default_target_version,
            rounds=int(data.get("rounds", 0)),
            active=_parse_active(active) if isinstance(active, Mapping) else None,
            trained=_parse_trained(trained) if isinstance(trained, Mapping) else None,
            last_finished_at=parse_time(data.get("lastFinishedAt")),
            last_result=data.get("lastResult") if data.get("lastResult") in ("Succeeded", "Failed") else None,
            last_message=str(data.get("lastMessage", "")),
            consecutive_failures=int(data.get("consecutiveFailures", 0)),
            failure_key=data.get("failureKey"),
            alpha_below_since=parse_time(data.get("alphaBelowSince")),
        )

    def to_status(self) -> dict[str, Any]:
        """The JSON written to status.retraining (``None`` clears a field in a merge patch)."""
        active = self.active
        trained = self.trained
        return {
            "draftTargetVersion": self.draft_target_version,
            "rounds": self.rounds,
            "active": None
            if active is None
            else {
                "jobName": active.job_name,
                "apiVersion": active.api_version,
                "kind": active.kind,
                "reason": active.reason,
                "round": active.round_number,
                "targetVersion": active.target_version,
                "outputVersion": active.output_version,
                "startedAt": format_time(active.started_at),
            },
            "trained": None
            if trained is None
            else {
                "draftVersion": trained.draft_version,
                "engineUri": trained.engine_uri,
                "targetVersion": trained.target_version,
                "metrics": dict(trained.metrics),
            },
            "lastFinishedAt": _format_optional(self.last_finished_at),
            "lastResult": self.last_result,
            "lastMessage": self.last_message,
            "consecutiveFailures": self.consecutive_failures,
            "failureKey": self.failure_key,
            "alphaBelowSince": _format_optional(self.alpha_below_since),
        }


def _format_optional(value: datetime | None) -> str | None:
    return None if value is None else format_time(value)


def _parse_active(data: Mapping[str, Any]) -> ActiveRound | None:
    started = parse_time(data.get("startedAt"))
    reason = data.get("reason")
    if started is None or reason not in (TARGET_VERSION_CHANGED, ACCEPTANCE_BELOW_SLO):
        return None
    return ActiveRound(
        job_name=str(data.get("jobName", "")),
        api_version=str(data.get("apiVersion", "batch/v1")),
        kind=str(data.get("kind", "Job")),
        reason=reason,
        round_number=int(data.get("round", 0)),
        target_version=str(data.get("targetVersion", "")),
        output_version=str(data.get("outputVersion", "")),
        started_at=started,
    )


def _parse_trained(data: Mapping[str, Any]) -> TrainedDraft:
    metrics = data.get("metrics") or {}
    return TrainedDraft(
        draft_version=str(data.get("draftVersion", "")),
        engine_uri=str(data.get("engineUri", "")),
        target_version=str(data.get("targetVersion", "")),
        metrics={str(k): float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
    )


# ---------------------------------------------------------------- names


def _dns_label(text: str) -> str:
    return re.sub(r"-{2,}", "-", _DNS_ALLOWED.sub("-", text.lower())).strip("-")


def job_name(resource_name: str, target_version: str, reason: str, round_number: int) -> str:
    """``<resource>-rt<round>-<hash>``: a DNS label of at most ``MAX_JOB_NAME`` characters.

    The inputs all come from the resource and its status, so a restarted operator that
    decides the same round again renders the same name and finds the Job it created.
    The name starts with a letter because TrainJob names must be RFC 1035 labels.
    """
    digest = hashlib.sha256(
        json.dumps([resource_name, target_version, reason, round_number]).encode("utf-8")
    ).hexdigest()[:8]
    suffix = f"-rt{round_number}-{digest}"
    prefix = _dns_label(resource_name)
    if not prefix[:1].isalpha():
        prefix = f"sdep-{prefix}".rstrip("-")
    return f"{prefix[: MAX_JOB_NAME - len(suffix)].rstrip('-')}{suffix}"


def output_version(draft_version: str, target_version: str, round_number: int) -> str:
    """The version the trained draft must be published as: ``<draft>-rt<round>-<target>``."""
    target = _VERSION_ALLOWED.sub("-", target_version).strip("-_.") or "target"
    version = bounded(f"{draft_version}-rt{round_number}-{target}", MAX_VERSION)
    return version.strip("-_.")


def setup_key(spec: SpeculativeDeploymentSpec) -> str:
    """Digest of what a round trains with; failures are only counted against the same setup."""
    setup = {
        "target": spec.target.version,
        "draft": spec.draft.model_dump(mode="json", by_alias=True),
        "retraining": spec.retraining.model_dump(mode="json", by_alias=True),
    }
    return hashlib.sha256(json.dumps(setup, sort_keys=True).encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------- trigger decision


@dataclass(frozen=True)
class Trigger:
    """A round to start now."""

    reason: TriggerReason
    target_version: str
    round_number: int
    output_version: str
    message: str


def draft_stale(spec: SpeculativeDeploymentSpec, state: RetrainingState) -> bool:
    """The draft in service was trained for another target version than the one serving now."""
    return state.draft_target_version is not None and state.draft_target_version != spec.target.version


def backoff_seconds(consecutive_failures: int) -> float:
    """Wait before the next attempt: 10 min, 20 min, 40 min ... capped at 12 h."""
    if consecutive_failures <= 0:
        return 0.0
    return min(BACKOFF_BASE_S * 2.0 ** (consecutive_failures - 1), BACKOFF_CAP_S)


def _failures_for(spec: SpeculativeDeploymentSpec, state: RetrainingState) -> int:
    return state.consecutive_failures if state.failure_key == setup_key(spec) else 0


def observe_acceptance(
    state: RetrainingState, alpha: float | None, min_acceptance: float, now: datetime
) -> RetrainingState:
    """Track since when alpha has stayed below the SLO; no measurement resets the clock."""
    if alpha is None or alpha >= min_acceptance:
        return replace(state, alpha_below_since=None) if state.alpha_below_since else state
    if state.alpha_below_since is None:
        return replace(state, alpha_below_since=now)
    return state


def retraining_trigger(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, *, now: datetime
) -> Trigger | None:
    """The round to start now, or None.

    Order of the rules: disabled, a round running, a trained draft still waiting for
    its canary, failures (backoff, then give up) all say no; then a stale draft starts
    a round (no cooldown: the draft no longer matches its target), then acceptance
    below the SLO for ``for`` starts one if ``cooldown`` has passed since the last round.
    """
    retraining = spec.retraining
    if not retraining.enabled or state.active is not None:
        return None
    if state.trained is not None and state.trained.target_version == spec.target.version:
        return None
    failures = _failures_for(spec, state)
    if failures >= MAX_CONSECUTIVE_FAILURES:
        return None
    since_last = None if state.last_finished_at is None else (now - state.last_finished_at).total_seconds()
    if failures and since_last is not None and since_last < backoff_seconds(failures):
        return None
    round_number = state.rounds + 1
    version = output_version(spec.draft.version, spec.target.version, round_number)
    if draft_stale(spec, state) and retraining.triggers.target_version_change:
        return Trigger(
            TARGET_VERSION_CHANGED,
            spec.target.version,
            round_number,
            version,
            f"target version changed from {state.draft_target_version} to {spec.target.version}",
        )
    acceptance = retraining.triggers.acceptance_below_slo
    if acceptance is None or state.alpha_below_since is None:
        return None
    below_for = (now - state.alpha_below_since).total_seconds()
    if below_for < parse_duration(acceptance.for_):
        return None
    if since_last is not None and since_last < parse_duration(acceptance.cooldown):
        return None
    return Trigger(
        ACCEPTANCE_BELOW_SLO,
        spec.target.version,
        round_number,
        version,
        f"acceptance below {spec.slo.min_acceptance:g} for {below_for / 60:.0f} min",
    )


# ---------------------------------------------------------------- round transitions


def start_round(
    state: RetrainingState, trigger: Trigger, manifest: Mapping[str, Any], now: datetime
) -> RetrainingState:
    """Record the round whose rendered ``manifest`` is being created."""
    return replace(
        state,
        rounds=trigger.round_number,
        active=ActiveRound(
            job_name=str(manifest["metadata"]["name"]),
            api_version=str(manifest["apiVersion"]),
            kind=str(manifest["kind"]),
            reason=trigger.reason,
            round_number=trigger.round_number,
            target_version=trigger.target_version,
            output_version=trigger.output_version,
            started_at=now,
        ),
    )


@dataclass(frozen=True)
class Running:
    message: str = ""


@dataclass(frozen=True)
class Succeeded:
    draft_version: str
    engine_uri: str
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    message: str


Outcome = Running | Succeeded | Failed


def finish_round(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, outcome: Succeeded | Failed, now: datetime
) -> RetrainingState:
    """Close the active round: keep the trained draft for its canary, or count the failure."""
    active = state.active
    if active is None:
        return state
    if isinstance(outcome, Succeeded):
        return replace(
            state,
            active=None,
            trained=TrainedDraft(
                outcome.draft_version, outcome.engine_uri, active.target_version, outcome.metrics
            ),
            last_finished_at=now,
            last_result="Succeeded",
            last_message=f"round {active.round_number} trained draft {outcome.draft_version}",
            consecutive_failures=0,
            failure_key=None,
            alpha_below_since=None,
        )
    return _count_failure(
        spec, replace(state, active=None), f"round {active.round_number}: {outcome.message}", now
    )


def _count_failure(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, message: str, now: datetime
) -> RetrainingState:
    key = setup_key(spec)
    return replace(
        state,
        last_finished_at=now,
        last_result="Failed",
        last_message=message,
        consecutive_failures=_failures_for(spec, state) + 1,
        failure_key=key,
    )


def draft_to_canary(spec: SpeculativeDeploymentSpec, state: RetrainingState) -> TrainedDraft | None:
    """The trained draft to roll out behind a canary now (autoCanary, and trained for this target)."""
    trained = state.trained
    if not spec.retraining.auto_canary or trained is None or state.active is not None:
        return None
    return trained if trained.target_version == spec.target.version else None


def accept_trained_draft(state: RetrainingState, target_version: str) -> RetrainingState:
    """A draft validated for ``target_version`` now serves (canary promoted): it is current again."""
    return replace(state, draft_target_version=target_version, trained=None, alpha_below_since=None)


def reject_trained_draft(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, message: str, now: datetime
) -> RetrainingState:
    """The trained draft's canary rolled back: a failed round, subject to backoff like any other."""
    return _count_failure(
        spec, replace(state, trained=None), f"canary rejected the trained draft: {message}", now
    )


# ---------------------------------------------------------------- conditions

DRAFT_STALE = "DraftStale"
RETRAINING = "Retraining"


def retraining_conditions(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, now: datetime
) -> tuple[ConditionUpdate, ...]:
    """DraftStale and Retraining conditions from the state (Retraining only when enabled)."""
    stale = draft_stale(spec, state)
    conditions = [
        ConditionUpdate(
            DRAFT_STALE,
            "True" if stale else "False",
            TARGET_VERSION_CHANGED if stale else "DraftCurrent",
            f"draft {spec.draft.version} was trained for target version {state.draft_target_version}, "
            f"serving {spec.target.version}"
            if stale
            else f"draft {spec.draft.version} matches target version {spec.target.version}",
        )
    ]
    if spec.retraining.enabled:
        conditions.append(_retraining_condition(spec, state, now))
    return tuple(conditions)


def _retraining_condition(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, now: datetime
) -> ConditionUpdate:
    if state.active is not None:
        active = state.active
        return ConditionUpdate(
            RETRAINING,
            "True",
            "RetrainingStarted",
            f"round {active.round_number} ({active.reason}) runs in {active.kind} {active.job_name}",
        )
    if state.trained is not None:
        return ConditionUpdate(
            RETRAINING,
            "False",
            "RetrainingSucceeded",
            f"trained draft {state.trained.draft_version} is ready",
        )
    failures = _failures_for(spec, state)
    if failures >= MAX_CONSECUTIVE_FAILURES:
        return ConditionUpdate(
            RETRAINING,
            "False",
            "RetrainingGaveUp",
            f"{failures} rounds failed in a row; change spec.retraining, the draft or the target to retry. "
            f"Last: {state.last_message}",
        )
    if failures and state.last_finished_at is not None:
        retry_at = state.last_finished_at + timedelta(seconds=backoff_seconds(failures))
        if retry_at > now:
            return ConditionUpdate(
                RETRAINING,
                "False",
                "RetrainingBackoff",
                f"{state.last_message}; next attempt not before {format_time(retry_at)}",
            )
    if state.last_result == "Failed":
        return ConditionUpdate(RETRAINING, "False", "RetrainingFailed", state.last_message)
    return ConditionUpdate(RETRAINING, "False", "RetrainingIdle", "no round running")


# ---------------------------------------------------------------- the trainer contract


def contract_env(resource: SpeculativeDeployment, trigger: Trigger) -> list[dict[str, str]]:
    """The ``SPECOPS_*`` variables every trainer container receives (``SPECOPS_RESULT_PATH`` aside)."""
    spec = resource.spec
    retraining = spec.retraining
    knobs = retraining.on_policy
    values = {
        "SPECOPS_DEPLOYMENT": str(resource.metadata.get("name", "")),
        "SPECOPS_ROUND": str(trigger.round_number),
        "SPECOPS_TRIGGER": trigger.reason,
        "SPECOPS_TARGET_MODEL": spec.target.model,
        "SPECOPS_TARGET_VERSION": trigger.target_version,
        "SPECOPS_TARGET_ENGINE_URI": spec.target.engine.uri,
        "SPECOPS_DRAFT_MODEL": spec.draft.model,
        "SPECOPS_DRAFT_VERSION": spec.draft.version,
        "SPECOPS_DRAFT_KIND": spec.draft.kind,
        "SPECOPS_DATA_URI": retraining.data.uri if retraining.data else "",
        "SPECOPS_METHOD": retraining.method,
        "SPECOPS_TARGET_ASSISTED_ROLLOUT": _bool(knobs.target_assisted_rollout),
        "SPECOPS_REPLAY_REJECTED": _bool(knobs.replay_rejected),
        "SPECOPS_REJECTED_WEIGHT": str(float(knobs.rejected_weight)),
        "SPECOPS_OUTPUT_VERSION": trigger.output_version,
    }
    return [{"name": name, "value": value} for name, value in values.items()]


def contract_args(env: Sequence[Mapping[str, str]]) -> list[str]:
    """The same contract as ``--flag=value`` arguments: SPECOPS_DRAFT_VERSION -> --draft-version."""
    return [
        f"--{item['name'].removeprefix('SPECOPS_').lower().replace('_', '-')}={item['value']}" for item in env
    ]


def _bool(value: bool) -> str:
    return "true" if value else "false"


# ---------------------------------------------------------------- rendering


@dataclass(frozen=True)
class _JobKind:
    api_version: str
    kind: str
    success: str
    """Condition type that means the run finished well."""


JOB = _JobKind("batch/v1", "Job", "Complete")
JOBSET = _JobKind("jobset.x-k8s.io/v1alpha2", "JobSet", "Completed")
TRAINJOB = _JobKind("trainer.kubeflow.org/v1alpha1", "TrainJob", "Complete")
PYTORCHJOB = _JobKind("kubeflow.org/v1", "PyTorchJob", "Succeeded")
SUPPORTED_KINDS = (JOB, JOBSET, TRAINJOB, PYTORCHJOB)
_TEMPLATE = "spec.retraining.template"


def _job_kind(api_version: Any, kind: Any) -> _JobKind | None:
    return next((k for k in SUPPORTED_KINDS if (k.api_version, k.kind) == (api_version, kind)), None)


def pod_selector(manifest_or_round: Mapping[str, Any] | ActiveRound) -> dict[str, str]:
    """Labels that find a round's pods: ours on the pod templates, the JobSet's for a TrainJob."""
    if isinstance(manifest_or_round, ActiveRound):
        kind, name = manifest_or_round.kind, manifest_or_round.job_name
    else:
        kind, name = str(manifest_or_round["kind"]), str(manifest_or_round["metadata"]["name"])
    if kind == TRAINJOB.kind:
        return {JOBSET_NAME_LABEL: name}
    return {LABEL_JOB: name}


def _labels(resource_name: str, trigger: Trigger, name: str) -> dict[str, str]:
    return {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: label_value(resource_name),
        LABEL_COMPONENT: COMPONENT_RETRAINING,
        LABEL_MANAGED_BY: "specops",
        LABEL_DEPLOYMENT: label_value(resource_name),
        LABEL_ROUND: str(trigger.round_number),
        LABEL_JOB: name,
    }


def _identity(resource: SpeculativeDeployment) -> tuple[str, str, dict[str, Any]]:
    meta = resource.metadata
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    for key, value in (("name", name), ("namespace", namespace), ("uid", uid)):
        if not value:
            raise RenderError(f"metadata.{key}", f"the resource has no {key}: the training Job needs it")
    return str(name), str(namespace), owner_reference(str(name), str(uid))


def render_training_job(resource: SpeculativeDeployment, trigger: Trigger) -> dict[str, Any]:
    """The training Job (or JobSet, TrainJob, PyTorchJob) of one round, contract injected.

    An empty template gives a batch/v1 Job running spec.retraining.image with the contract
    as arguments. A template keeps everything it sets; specops sets name, namespace,
    labels and ownerReference, injects the contract into every trainer container and
    fills restricted pod-security and Job defaults only where the template is silent.
    No clock: the same trigger always renders the same object.
    """
    resource_name, namespace, owner = _identity(resource)
    retraining = resource.spec.retraining
    template = copy.deepcopy(retraining.template) if retraining.template else _default_job(resource)
    kind = _job_kind(template.get("apiVersion"), template.get("kind"))
    if kind is None:
        supported = ", ".join(f"{k.api_version} {k.kind}" for k in SUPPORTED_KINDS)
        raise TemplateError(
            f"{_TEMPLATE}.kind",
            f"{template.get('apiVersion')!r} {template.get('kind')!r} is not supported; use one of: {supported}",
        )
    name = job_name(resource_name, trigger.target_version, trigger.reason, trigger.round_number)
    labels = _labels(resource_name, trigger, name)
    meta = template.get("metadata") or {}
    if meta.get("namespace") not in (None, namespace):
        raise TemplateError(
            f"{_TEMPLATE}.metadata.namespace",
            f"must be empty or {namespace!r}: the Job is owned by the resource and lives in its namespace",
        )
    meta.pop("generateName", None)
    template["metadata"] = {
        **meta,
        "name": name,
        "namespace": namespace,
        "labels": {**(meta.get("labels") or {}), **labels},
        "annotations": {
            **(meta.get("annotations") or {}),
            ANNOTATION_OUTPUT_VERSION: trigger.output_version,
            ANNOTATION_TRIGGER: trigger.reason,
        },
        "ownerReferences": [owner],
    }
    spec = template.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise TemplateError(f"{_TEMPLATE}.spec", "must be an object")
    env = contract_env(resource, trigger)
    image = retraining.image
    if kind is TRAINJOB:
        _fill_trainjob(spec, env, image)
    elif kind is JOB:
        spec.setdefault("backoffLimit", JOB_BACKOFF_LIMIT)
        spec.setdefault("ttlSecondsAfterFinished", TTL_AFTER_FINISHED_S)
        _fill_pod_template(
            _require(spec, "template", f"{_TEMPLATE}.spec.template"),
            f"{_TEMPLATE}.spec.template",
            labels,
            env,
            image,
        )
    elif kind is JOBSET:
        spec.setdefault("ttlSecondsAfterFinished", TTL_AFTER_FINISHED_S)
        spec.setdefault("failurePolicy", {"maxRestarts": JOBSET_MAX_RESTARTS})
        replicated = spec.get("replicatedJobs")
        if not isinstance(replicated, list) or not replicated:
            raise TemplateError(
                f"{_TEMPLATE}.spec.replicatedJobs", "a JobSet needs at least one replicated Job"
            )
        for index, replicated_job in enumerate(replicated):
            path = f"{_TEMPLATE}.spec.replicatedJobs[{index}].template.spec"
            job_spec = _require(
                _require(replicated_job, "template", path.removesuffix(".spec")), "spec", path
            )
            job_spec.setdefault("backoffLimit", DISTRIBUTED_BACKOFF_LIMIT)
            _fill_pod_template(
                _require(job_spec, "template", f"{path}.template"), f"{path}.template", labels, env, image
            )
    else:
        run_policy = spec.setdefault("runPolicy", {})
        run_policy.setdefault("backoffLimit", DISTRIBUTED_BACKOFF_LIMIT)
        run_policy.setdefault("ttlSecondsAfterFinished", TTL_AFTER_FINISHED_S)
        replicas = spec.get("pytorchReplicaSpecs")
        if not isinstance(replicas, dict) or not replicas:
            raise TemplateError(
                f"{_TEMPLATE}.spec.pytorchReplicaSpecs", "a PyTorchJob needs at least one replica type"
            )
        for replica_type, replica in sorted(replicas.items()):
            path = f"{_TEMPLATE}.spec.pytorchReplicaSpecs.{replica_type}.template"
            if not isinstance(replica, dict):
                raise TemplateError(path.removesuffix(".template"), "must be an object")
            replica.setdefault("restartPolicy", "Never")
            _fill_pod_template(_require(replica, "template", path), path, labels, env, image)
    return template


def _require(parent: Any, key: str, path: str) -> dict[str, Any]:
    if not isinstance(parent, dict) or not isinstance(parent.get(key), dict):
        raise TemplateError(path, "missing: the template must spell out this object")
    value: dict[str, Any] = parent[key]
    return value


def _default_job(resource: SpeculativeDeployment) -> dict[str, Any]:
    """A one-pod Job running spec.retraining.image with as many GPUs as a serving replica."""
    image = resource.spec.retraining.image
    if not image:
        raise TemplateError(
            "spec.retraining.image", "set a trainer image, or a full Job, JobSet or TrainJob in template"
        )
    gpus = str(resource.spec.serving.gpu.count)
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": TRAINER_CONTAINER,
                "image": image,
                "resources": {"limits": {GPU_RESOURCE: gpus}, "requests": {GPU_RESOURCE: gpus}},
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }
        ],
        # NCCL and data loaders exchange tensors through /dev/shm.
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    if resource.spec.serving.service_account_name:
        pod["serviceAccountName"] = resource.spec.serving.service_account_name
    return {"apiVersion": JOB.api_version, "kind": JOB.kind, "spec": {"template": {"spec": pod}}}


def _fill_pod_template(
    pod_template: dict[str, Any],
    path: str,
    labels: Mapping[str, str],
    env: Sequence[Mapping[str, str]],
    image: str | None,
) -> None:
    meta = pod_template.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    pod = _require(pod_template, "spec", f"{path}.spec")
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        raise TemplateError(f"{path}.spec.containers", "at least one container is needed")
    # Never: a failed pod stays, so its termination message (the trainer's error) can be read.
    pod.setdefault("restartPolicy", "Never")
    security = pod.setdefault("securityContext", {})
    security.setdefault("runAsNonRoot", True)
    security.setdefault("seccompProfile", {"type": "RuntimeDefault"})
    for group in ("initContainers", "containers"):
        for index, container in enumerate(pod.get(group) or []):
            _fill_container(
                container, f"{path}.spec.{group}[{index}]", env, image, main=group == "containers"
            )


def _fill_container(
    container: dict[str, Any],
    path: str,
    env: Sequence[Mapping[str, str]],
    image: str | None,
    *,
    main: bool,
) -> None:
    if not container.get("image"):
        if not image:
            raise TemplateError(f"{path}.image", "no image here and spec.retraining.image is empty")
        container["image"] = image
    result_path = str(container.get("terminationMessagePath") or DEFAULT_RESULT_PATH)
    contract = [*env, {"name": "SPECOPS_RESULT_PATH", "value": result_path}]
    container["env"] = _merge_env(contract, container.get("env") or [])
    security = container.setdefault("securityContext", {})
    security.setdefault("allowPrivilegeEscalation", False)
    security.setdefault("capabilities", {"drop": ["ALL"]})
    if not main:
        return
    # On failure with nothing written, the log tail becomes the message: the Failed reason users see.
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    if not container.get("command") and not container.get("args"):
        container["args"] = contract_args(contract)


def _merge_env(
    contract: Sequence[Mapping[str, str]], own: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Contract first, so the template's own variables may reference it as $(SPECOPS_...)."""
    names = {item["name"] for item in contract}
    return [dict(item) for item in contract] + [dict(item) for item in own if item.get("name") not in names]


def _fill_trainjob(spec: dict[str, Any], env: Sequence[Mapping[str, str]], image: str | None) -> None:
    """A TrainJob exposes only spec.trainer (image, command, args, env); its runtime owns the pods."""
    if not isinstance(spec.get("runtimeRef"), dict) or not spec["runtimeRef"].get("name"):
        raise TemplateError(f"{_TEMPLATE}.spec.runtimeRef.name", "a TrainJob must name its training runtime")
    trainer = spec.setdefault("trainer", {})
    if image and not trainer.get("image"):
        trainer["image"] = image
    contract = [*env, {"name": "SPECOPS_RESULT_PATH", "value": DEFAULT_RESULT_PATH}]
    trainer["env"] = _merge_env(contract, trainer.get("env") or [])
    if not trainer.get("command") and not trainer.get("args"):
        trainer["args"] = contract_args(contract)


# ---------------------------------------------------------------- completion


def training_outcome(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> Outcome:
    """Running, Succeeded (with the published draft) or Failed, from the Job and its pods.

    The result is the trainer's JSON ``{"draftVersion", "engineUri", "metrics"}``, taken
    from the Job's ``specops.dev/result`` annotation or else from the termination message
    of a container that exited 0. A run that completed without a valid result failed.
    """
    kind = _job_kind(job.get("apiVersion"), job.get("kind"))
    if kind is None:
        return Failed(f"{job.get('apiVersion')} {job.get('kind')} is not a training Job specops can read")
    conditions = {
        c.get("type"): c
        for c in (job.get("status") or {}).get("conditions") or []
        if isinstance(c, Mapping) and c.get("status") == "True"
    }
    if "Failed" in conditions:
        failed = conditions["Failed"]
        detail = failed.get("message") or failed.get("reason") or "the training job failed"
        logs = _failure_messages(pods)
        return Failed(f"{detail}; {logs}" if logs else str(detail))
    if kind.success not in conditions:
        suspended = "Suspended" in conditions
        return Running("suspended" if suspended else "")
    expected = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_OUTPUT_VERSION)
    return _published_result(job, pods, expected)


def _terminated(pods: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    found = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        pod_name = str((pod.get("metadata") or {}).get("name", "?"))
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = ((status or {}).get("state") or {}).get("terminated")
            if isinstance(terminated, Mapping):
                found.append((f"{pod_name}/{status.get('name', '?')}", terminated))
    return found


def _failure_messages(pods: Sequence[Mapping[str, Any]], limit: int = 500) -> str:
    messages = [
        f"{where}: {str(t.get('message')).strip()[-limit:]}"
        for where, t in _terminated(pods)
        if t.get("exitCode") not in (0, None) and str(t.get("message") or "").strip()
    ]
    return " | ".join(messages[:3])


def _published_result(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], expected: str | None
) -> Outcome:
    annotation = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_RESULT)
    sources: list[tuple[str, str]] = []
    if annotation:
        sources.append((f"annotation {ANNOTATION_RESULT}", str(annotation)))
    else:
        sources += [
            (f"termination message of {where}", str(t.get("message")))
            for where, t in _terminated(pods)
            if t.get("exitCode") == 0 and str(t.get("message") or "").strip()
        ]
    if not sources:
        return Failed(
            "the training job completed but published no result: write "
            '{"draftVersion": ..., "engineUri": ...} to $SPECOPS_RESULT_PATH or to the '
            f"{ANNOTATION_RESULT} annotation"
        )
    results: list[tuple[str, Succeeded]] = []
    problems = []
    for where, text in sources:
        parsed = _parse_result(text, expected)
        if isinstance(parsed, Succeeded):
            results.append((where, parsed))
        else:
            problems.append(f"{where}: {parsed}")
    if not results:
        return Failed("the training job completed with an invalid result: " + "; ".join(problems))
    published = {(r.draft_version, r.engine_uri) for _, r in results}
    if len(published) > 1:
        listing = ", ".join(f"{where} -> {r.draft_version} at {r.engine_uri}" for where, r in results)
        return Failed(f"containers published different drafts ({listing}); publish from one rank only")
    return results[0][1]


def _parse_result(text: str, expected: str | None) -> Succeeded | str:
    """The result, or what is wrong with it."""
    try:
        data = json.loads(text)
    except ValueError:
        return "not JSON"
    if not isinstance(data, dict):
        return "not a JSON object"
    version, uri, metrics = data.get("draftVersion"), data.get("engineUri"), data.get("metrics", {})
    if not isinstance(version, str) or not _VERSION_PATTERN.match(version) or len(version) > MAX_VERSION:
        return f"draftVersion {version!r} is not a valid draft version"
    if expected and version != expected:
        return f"draftVersion {version!r} differs from SPECOPS_OUTPUT_VERSION {expected!r}"
    if not isinstance(uri, str) or not re.match(ENGINE_URI_PATTERN, uri) or len(uri) > 1024:
        return f"engineUri {uri!r} is not a pvc://, s3://, gs:// or file:// uri"
    if not isinstance(metrics, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values()
    ):
        return "metrics must be an object of numbers"
    return Succeeded(version, uri, {str(k): float(v) for k, v in metrics.items()})
