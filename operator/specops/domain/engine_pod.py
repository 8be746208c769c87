"""A configuration revision as a serving pod: the engine container, its config ConfigMap, the
checkpoint mounts, probes on the engine's own health endpoints and the revision's labels.

The engine adapter (domain/engines) decides the command, arguments and config files; this
module puts them in a restricted pod: checkpoints at /models/target and /models/draft
(pvc:// mounted read-only, other schemes copied in by the checkpoint fetcher), the config
files from one ConfigMap mounted where the engine reads them, and the labels every series
carries (revision digest, mode, backend). Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specops.domain.engines.base import DRAFT_PATH, TARGET_PATH, ContainerPlan, Engine, ServingInputs
from specops.domain.engines.schedule import Revision
from specops.domain.names import GPU_RESOURCE, RenderError

CONTAINER_NAME = "engine"
CONFIG_VOLUME = "engine-config"
LABEL_REVISION = "specops.dev/revision"
LABEL_MODE = "specops.dev/mode"
LABEL_BACKEND = "specops.dev/backend"
ANNOTATION_SCHEDULE = "specops.dev/schedule"
"""The revision's schedule in words, on the pod for people (kubectl describe)."""
RUN_AS_USER = 1000
STARTUP_BUDGET_S = 3600
"""Large models take minutes to load (weights, CUDA graphs): up to an hour before liveness applies."""


@dataclass(frozen=True)
class PodInputs:
    """What the pod needs besides the revision."""

    image: str
    target_uri: str
    draft_uri: str | None
    gpus: int
    tensor_parallel: int
    served_model_name: str
    fetcher_image: str | None = None


def config_key(path: str) -> str:
    """ConfigMap keys cannot hold '/': ``tensorrt_llm/1/model.yaml`` -> ``tensorrt_llm.1.model.yaml``."""
    return path.replace("/", ".")


def config_digest(files: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(files), sort_keys=True).encode("utf-8")).hexdigest()[:16]


def _security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _probe(path: str, port: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _checkpoint(
    role: str, uri: str, path: str, fetcher_image: str | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """(volume, mount, init container or None) of one checkpoint."""
    name = f"{role}-checkpoint"
    if uri.startswith("pvc://"):
        claim, _, sub_path = uri.removeprefix("pvc://").partition("/")
        mount: dict[str, Any] = {"name": name, "mountPath": path, "readOnly": True}
        if sub_path.strip("/"):
            mount["subPath"] = sub_path.strip("/")
        return {"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}, mount, None
    if not fetcher_image:
        raise RenderError(
            "spec.serving.checkpointFetcherImage",
            f"required to copy the {role} checkpoint {uri} into the pod",
        )
    fetch = {
        "name": f"fetch-{role}",
        "image": fetcher_image,
        "args": ["fetch-checkpoint", uri, path],
        "env": [{"name": "HOME", "value": "/tmp"}],
        "securityContext": _security(),
        "volumeMounts": [{"name": name, "mountPath": path}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    return {"name": name, "emptyDir": {}}, {"name": name, "mountPath": path, "readOnly": True}, fetch


def revision_labels(engine: Engine, revision: Revision) -> dict[str, str]:
    return {LABEL_REVISION: revision.digest, LABEL_MODE: revision.mode, LABEL_BACKEND: engine.name}


def engine_pod(
    engine: Engine, revision: Revision, inputs: PodInputs, configmap_name: str
) -> tuple[dict[str, str], dict[str, Any], dict[str, str]]:
    """(ConfigMap data, pod spec, pod annotations) of one revision. The ConfigMap data is empty
    for engines configured by arguments alone (vLLM, and SGLang without a schedule file)."""
    if inputs.gpus % inputs.tensor_parallel:
        raise RenderError("spec.serving.tensorParallel", "must divide serving.gpu.count")
    plan: ContainerPlan = engine.container(
        revision,
        ServingInputs(served_model_name=inputs.served_model_name, tensor_parallel=inputs.tensor_parallel),
    )
    checkpoints = [_checkpoint("target", inputs.target_uri, TARGET_PATH, inputs.fetcher_image)]
    if revision.mode == "spec" and revision.method in ("draftModel", "eagle3"):
        if inputs.draft_uri is None:
            raise RenderError("spec.draft.uri", f"{revision.method} needs the draft checkpoint")
        checkpoints.append(_checkpoint("draft", inputs.draft_uri, DRAFT_PATH, inputs.fetcher_image))
    gpus = str(inputs.gpus)
    mounts = [mount for _, mount, _ in checkpoints]
    volumes = [volume for volume, _, _ in checkpoints]
    data = {config_key(path): text for path, text in sorted(plan.files.items())}
    if data:
        mounts.append({"name": CONFIG_VOLUME, "mountPath": plan.config_dir, "readOnly": True})
        volumes.append(
            {
                "name": CONFIG_VOLUME,
                "configMap": {
                    "name": configmap_name,
                    "defaultMode": 0o444,
                    "items": [{"key": config_key(path), "path": path} for path in sorted(plan.files)],
                },
            }
        )
    mounts += [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "home", "mountPath": "/home/engine"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    volumes += [
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
        # tensor parallel workers (and Triton's python backend) exchange tensors through /dev/shm
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": inputs.image,
        "command": list(plan.command),
        "args": list(plan.args),
        "env": [
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "HOME", "value": "/home/engine"},
            {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
            *({"name": key, "value": value} for key, value in plan.env),
        ],
        "ports": [
            {"name": port.name, "containerPort": port.number, "protocol": "TCP"} for port in engine.ports
        ],
        "resources": {"limits": {GPU_RESOURCE: gpus}, "requests": {GPU_RESOURCE: gpus}},
        "startupProbe": _probe(engine.ready_path, engine.http_port, 10, STARTUP_BUDGET_S // 10),
        "readinessProbe": _probe(engine.ready_path, engine.http_port, 10, 3),
        "livenessProbe": _probe(engine.live_path, engine.http_port, 20, 3),
        "securityContext": _security(),
        "volumeMounts": mounts,
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationGracePeriodSeconds": 60,
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
        "volumes": volumes,
    }
    fetchers = [fetch for _, _, fetch in checkpoints if fetch is not None]
    if fetchers:
        pod["initContainers"] = fetchers
    annotations = {
        ANNOTATION_SCHEDULE: revision.describe(),
        "kubectl.kubernetes.io/default-container": CONTAINER_NAME,
        "specops.dev/config-hash": config_digest(data),
    }
    return data, pod, annotations
