"""The training object of a round: the trainer contract, and a Job, JobSet, TrainJob or PyTorchJob built from spec.retraining.template."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specops.api.models import SpeculativeDeployment
from specops.domain.names import (
    APP_NAME,
    GPU_RESOURCE,
    LABEL_COMPONENT,
    LABEL_DEPLOYMENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    RenderError,
    label_value,
    owner_reference,
)
from specops.domain.retraining.naming import (
    ANNOTATION_OUTPUT_VERSION,
    ANNOTATION_TRIGGER,
    COMPONENT_RETRAINING,
    DEFAULT_RESULT_PATH,
    DISTRIBUTED_BACKOFF_LIMIT,
    JOB_BACKOFF_LIMIT,
    JOBSET_MAX_RESTARTS,
    JOBSET_NAME_LABEL,
    LABEL_JOB,
    LABEL_ROUND,
    TRAINER_CONTAINER,
    TTL_AFTER_FINISHED_S,
    job_name,
)
from specops.domain.retraining.state import ActiveRound, Trigger

_TEMPLATE = "spec.retraining.template"


class TemplateError(RenderError):
    """spec.retraining.template (or image) cannot make a training Job; ``field`` names what to fix."""


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
        "SPECOPS_TARGET_URI": spec.target.uri,
        "SPECOPS_DRAFT_MODEL": spec.draft.model,
        "SPECOPS_DRAFT_VERSION": spec.draft.version,
        "SPECOPS_DRAFT_KIND": spec.draft.kind,
        "SPECOPS_DRAFT_METHOD": spec.draft.method,
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


def job_kind(api_version: Any, kind: Any) -> JobKind | None:
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
    kind = job_kind(template.get("apiVersion"), template.get("kind"))
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
    kind.fill(spec, labels, env, image)
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


# ---------------------------------------------------------------- one filler per kind


Filler = Callable[[dict[str, Any], Mapping[str, str], Sequence[Mapping[str, str]], str | None], None]
"""Fills one kind's spec in place: contract, labels, restricted defaults (spec, labels, env, image)."""


def _fill_job(
    spec: dict[str, Any], labels: Mapping[str, str], env: Sequence[Mapping[str, str]], image: str | None
) -> None:
    spec.setdefault("backoffLimit", JOB_BACKOFF_LIMIT)
    spec.setdefault("ttlSecondsAfterFinished", TTL_AFTER_FINISHED_S)
    path = f"{_TEMPLATE}.spec.template"
    _fill_pod_template(_require(spec, "template", path), path, labels, env, image)


def _fill_jobset(
    spec: dict[str, Any], labels: Mapping[str, str], env: Sequence[Mapping[str, str]], image: str | None
) -> None:
    spec.setdefault("ttlSecondsAfterFinished", TTL_AFTER_FINISHED_S)
    spec.setdefault("failurePolicy", {"maxRestarts": JOBSET_MAX_RESTARTS})
    replicated = spec.get("replicatedJobs")
    if not isinstance(replicated, list) or not replicated:
        raise TemplateError(f"{_TEMPLATE}.spec.replicatedJobs", "a JobSet needs at least one replicated Job")
    for index, replicated_job in enumerate(replicated):
        path = f"{_TEMPLATE}.spec.replicatedJobs[{index}].template.spec"
        job_spec = _require(_require(replicated_job, "template", path.removesuffix(".spec")), "spec", path)
        job_spec.setdefault("backoffLimit", DISTRIBUTED_BACKOFF_LIMIT)
        _fill_pod_template(
            _require(job_spec, "template", f"{path}.template"), f"{path}.template", labels, env, image
        )


def _fill_pytorchjob(
    spec: dict[str, Any], labels: Mapping[str, str], env: Sequence[Mapping[str, str]], image: str | None
) -> None:
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


def _fill_trainjob_kind(
    spec: dict[str, Any], labels: Mapping[str, str], env: Sequence[Mapping[str, str]], image: str | None
) -> None:
    _fill_trainjob(spec, env, image)


@dataclass(frozen=True)
class JobKind:
    """A kind of training object specops can create and read."""

    api_version: str
    kind: str
    success: str
    """Condition type that means the run finished well."""
    fill: Filler = field(compare=False, repr=False)


JOB = JobKind("batch/v1", "Job", "Complete", _fill_job)
JOBSET = JobKind("jobset.x-k8s.io/v1alpha2", "JobSet", "Completed", _fill_jobset)
TRAINJOB = JobKind("trainer.kubeflow.org/v1alpha1", "TrainJob", "Complete", _fill_trainjob_kind)
PYTORCHJOB = JobKind("kubeflow.org/v1", "PyTorchJob", "Succeeded", _fill_pytorchjob)
SUPPORTED_KINDS = (JOB, JOBSET, TRAINJOB, PYTORCHJOB)
