"""SpeculativeDeployment -> the Kubernetes objects that serve it (pure functions returning dicts).

Per variant ("stable", "canary", ...):

- ConfigMap ``<child>-model-repository``: the Triton model repository (see triton_repo);
- Deployment ``<child>``: the Triton pods (``<child>`` is ``<name>`` for stable,
  ``<name>-<variant>`` otherwise);
- Service ``<name>-<variant>``: that variant's pods only, the backend a Gateway API
  HTTPRoute weights during a canary.

For the stable variant also:

- Service ``<name>``: every variant's pods, the address users call; without Gateway
  API a canary splits traffic by its share of ready replicas behind it;
- PodMonitor ``<name>`` (optional): scrapes every variant's ``metrics`` port and
  relabels the pod labels into ``specops_deployment``, ``variant`` and
  ``specops_draft``, the labels the operator's grouped Prometheus queries use.

Names longer than 63 characters are cut and suffixed with a hash so they stay
valid DNS labels and label values; the same rule gives the label values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specops.api.models import (
    DraftSpec,
    ServingResources,
    ServingSpec,
    SpeculativeDeployment,
)
from specops.api.units import parse_duration
from specops.domain import drafts, triton_repo
from specops.domain.names import (
    ANNOTATION_CONFIG_HASH,
    APP_NAME,
    COMPONENT_MONITORING,
    COMPONENT_REPOSITORY,
    COMPONENT_SERVING,
    GPU_RESOURCE,
    LABEL_COMPONENT,
    LABEL_DRAFT,
    LABEL_DRAFT_VERSION,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_TRAFFIC,
    STABLE,
    TRAFFIC_HOLD,
    TRAFFIC_SERVE,
    RenderError,
    child_name,
    label_problem,
    label_value,
    owner_reference,
    repository_configmap_name,
    selector_labels,
    service_name,
    shared_selector_labels,
    traffic_selector_labels,
    variant_service_name,
)
from specops.domain.triton_repo import RepositorySettings

CONTAINER_NAME = "triton"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
RUN_AS_USER = 1000
"""The Triton images' ``triton-server`` user."""
HOME = "/home/triton-server"


@dataclass(frozen=True)
class RenderOptions:
    """Operator-wide inputs of rendering."""

    bls_source: str
    """Text of assets/tensorrt_llm_bls/model.py."""
    default_image: str | None = None
    """Serving image used when spec.serving.image is empty."""
    pod_monitor: bool = True
    """Also render a monitoring.coreos.com/v1 PodMonitor (needs the prometheus-operator CRDs)."""


# ---------------------------------------------------------------- names and labels


def _labels(resource_name: str, variant: str, component: str) -> dict[str, str]:
    return dict(
        sorted(
            {
                LABEL_NAME: APP_NAME,
                LABEL_INSTANCE: label_value(resource_name),
                LABEL_COMPONENT: component,
                LABEL_MANAGED_BY: "specops",
                **selector_labels(resource_name, variant),
            }.items()
        )
    )


# ---------------------------------------------------------------- helpers


def _metadata(resource: SpeculativeDeployment) -> tuple[str, str, str]:
    meta = resource.metadata
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    if not name:
        raise RenderError("metadata.name", "the resource has no name")
    if not namespace:
        raise RenderError("metadata.namespace", "the resource has no namespace")
    if not uid:
        raise RenderError("metadata.uid", "the resource has no uid: children need it for ownerReferences")
    return str(name), str(namespace), str(uid)


def _object_meta(
    name: str, namespace: str, labels: Mapping[str, str], owner: Mapping[str, Any]
) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": dict(labels), "ownerReferences": [dict(owner)]}


def _prometheus_duration(text: str) -> str:
    """A spec duration ("15s", "1.5m") in the form Prometheus accepts (no fractions)."""
    millis = round(parse_duration(text) * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def config_hash(data: Mapping[str, str]) -> str:
    """Digest of the model-repository ConfigMap data; a change rolls the pods."""
    return hashlib.sha256(json.dumps(dict(data), sort_keys=True).encode("utf-8")).hexdigest()[:16]


def _configmap_key(path: str) -> str:
    """ConfigMap keys cannot hold '/': ``tensorrt_llm_bls/1/model.py`` -> ``tensorrt_llm_bls.1.model.py``."""
    return path.replace("/", ".")


def _restricted_container_security() -> dict[str, Any]:
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


@dataclass(frozen=True)
class _Engine:
    """How one engine reaches its mount point: a PVC sub-path or a fetched copy in an emptyDir."""

    role: str  # "target" | "draft"
    uri: str
    mount_path: str

    @property
    def volume_name(self) -> str:
        return f"{self.role}-engine"

    @property
    def on_pvc(self) -> bool:
        return self.uri.startswith("pvc://")

    def volume(self) -> dict[str, Any]:
        if not self.on_pvc:
            return {"name": self.volume_name, "emptyDir": {}}
        claim = self.uri.removeprefix("pvc://").split("/", 1)[0]
        return {"name": self.volume_name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}

    def mount(self) -> dict[str, Any]:
        mount: dict[str, Any] = {"name": self.volume_name, "mountPath": self.mount_path, "readOnly": True}
        if self.on_pvc:
            _, _, sub_path = self.uri.removeprefix("pvc://").partition("/")
            if sub_path.strip("/"):
                mount["subPath"] = sub_path.strip("/")
        return mount

    def fetcher(self, image: str) -> dict[str, Any]:
        return {
            "name": f"fetch-{self.role}-engine",
            "image": image,
            "args": ["fetch-engine", self.uri, self.mount_path],
            "env": [{"name": "HOME", "value": "/tmp"}],
            "securityContext": _restricted_container_security(),
            "volumeMounts": [
                {"name": self.volume_name, "mountPath": self.mount_path},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
        }


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def tritonserver_args() -> list[str]:
    """The server command line: explicit model control so the operator can reload models at run time."""
    return [
        "tritonserver",
        f"--model-repository={triton_repo.MODEL_REPOSITORY_PATH}",
        "--model-control-mode=explicit",
        *(f"--load-model={model}" for model in triton_repo.MODEL_NAMES),
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--allow-metrics=true",
        "--metrics-config=histogram_latencies=true",
    ]


# ---------------------------------------------------------------- objects


def repository_settings(
    resource: SpeculativeDeployment, variant: str, draft: DraftSpec
) -> RepositorySettings:
    """What the variant's model repository is built from.

    Pods start with speculation off whatever the mode: the control loop switches it on at run
    time, and only once the draft passed its lossless check (a pod that booted speculating would
    serve an unchecked draft until the first tick). A mode change therefore rolls no pod.
    """
    spec = resource.spec
    return RepositorySettings(
        deployment=label_value(str(resource.metadata.get("name", ""))),
        variant=variant,
        draft_version=draft.version,
        default_num_draft_tokens=0,
        max_draft_len=spec.target.engine.max_draft_len,
        tensor_parallel=spec.serving.tensor_parallel,
    )


def _configmap(
    name: str, namespace: str, variant: str, owner: Mapping[str, Any], files: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _object_meta(
            repository_configmap_name(name, variant),
            namespace,
            _labels(name, variant, COMPONENT_REPOSITORY),
            owner,
        ),
        "data": {_configmap_key(path): text for path, text in sorted(files.items())},
    }


def _pod_spec(
    resource: SpeculativeDeployment,
    variant: str,
    draft: DraftSpec,
    image: str,
    configmap_name: str,
    files: Mapping[str, str],
) -> dict[str, Any]:
    serving = resource.spec.serving
    engines = [
        _Engine("target", resource.spec.target.engine.uri, triton_repo.TARGET_ENGINE_PATH),
        _Engine("draft", draft.engine.uri, triton_repo.DRAFT_ENGINE_PATH),
    ]
    init_containers = []
    for engine in engines:
        if not engine.on_pvc:
            if not serving.engine_fetcher_image:
                raise RenderError(
                    "spec.serving.engineFetcherImage",
                    f"required to fetch the {engine.role} engine {engine.uri}",
                )
            init_containers.append(engine.fetcher(serving.engine_fetcher_image))
    gpus = str(serving.gpu.count)
    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "args": tritonserver_args(),
        "env": [
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "HOME", "value": HOME},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
            {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
            # Orchestrator mode: two TensorRT-LLM engines (and tensor parallelism) in one server.
            {"name": "TRTLLM_ORCHESTRATOR", "value": "1"},
        ],
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": _container_resources(serving.resources, gpus),
        # Engines take minutes to load: up to 30 min before liveness applies.
        "startupProbe": _probe("/v2/health/live", 10, 180),
        "readinessProbe": _probe("/v2/health/ready", 10, 3),
        "livenessProbe": _probe("/v2/health/live", 20, 3),
        "securityContext": _restricted_container_security(),
        "volumeMounts": [
            {"name": "model-repository", "mountPath": triton_repo.MODEL_REPOSITORY_PATH, "readOnly": True},
            *(engine.mount() for engine in engines),
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "home", "mountPath": HOME},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    volumes = [
        {
            "name": "model-repository",
            "configMap": {
                "name": configmap_name,
                "defaultMode": 0o444,
                "items": [{"key": _configmap_key(path), "path": path} for path in sorted(files)],
            },
        },
        *(engine.volume() for engine in engines),
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
        # The python backend exchanges tensors with its stub processes through /dev/shm.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
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
        "tolerations": [
            {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
            *(toleration.model_dump(by_alias=True, exclude_none=True) for toleration in serving.tolerations),
        ],
        "containers": [container],
        "volumes": volumes,
    }
    if init_containers:
        pod["initContainers"] = init_containers
    if serving.service_account_name:
        pod["serviceAccountName"] = serving.service_account_name
    pod.update(_placement(serving))
    _add_user_volumes(serving, pod, container)
    return pod


def _add_user_volumes(serving: ServingSpec, pod: dict[str, Any], container: dict[str, Any]) -> None:
    """serving.env, .volumes and .volumeMounts, refused where they would shadow what specops mounts."""
    own_env = {item["name"] for item in container["env"]}
    container["env"] = [
        *(
            item.model_dump(by_alias=True, exclude_none=True)
            for item in serving.env
            if item.name not in own_env
        ),
        *container["env"],
    ]
    own_volumes = {volume["name"] for volume in pod["volumes"]}
    own_paths = {mount["mountPath"].rstrip("/") for mount in container["volumeMounts"]}
    names = set()
    for index, volume in enumerate(serving.volumes):
        name = volume.get("name")
        if not isinstance(name, str) or not name:
            raise RenderError(f"spec.serving.volumes[{index}].name", "every volume needs a name")
        if name in own_volumes or name in names:
            raise RenderError(
                f"spec.serving.volumes[{index}].name",
                f"{name!r} is taken ({sorted(own_volumes)} are specops')",
            )
        names.add(name)
    for index, mount in enumerate(serving.volume_mounts):
        if mount.name not in names:
            raise RenderError(
                f"spec.serving.volumeMounts[{index}].name",
                f"no volume {mount.name!r} in spec.serving.volumes",
            )
        path = mount.mount_path.rstrip("/")
        if any(path == own or path.startswith(own + "/") or own.startswith(path + "/") for own in own_paths):
            raise RenderError(
                f"spec.serving.volumeMounts[{index}].mountPath",
                f"{mount.mount_path} overlaps a path specops mounts",
            )
    if serving.volumes:
        pod["volumes"] = [*pod["volumes"], *(dict(volume) for volume in serving.volumes)]
    if serving.volume_mounts:
        container["volumeMounts"] = [
            *container["volumeMounts"],
            *(mount.model_dump(by_alias=True, exclude_none=True) for mount in serving.volume_mounts),
        ]


def _container_resources(resources: ServingResources | None, gpus: str) -> dict[str, Any]:
    """GPUs from serving.gpu.count, everything else from serving.resources (which may not name GPUs)."""
    requests = {**((resources.requests if resources else None) or {}), GPU_RESOURCE: gpus}
    limits = {**((resources.limits if resources else None) or {}), GPU_RESOURCE: gpus}
    return {"limits": dict(sorted(limits.items())), "requests": dict(sorted(requests.items()))}


def _placement(serving: ServingSpec) -> dict[str, Any]:
    """Where the serving pods (stable and canary alike) may run, and with what priority."""
    placement: dict[str, Any] = {}
    if serving.node_selector:
        placement["nodeSelector"] = dict(serving.node_selector)
    if serving.affinity:
        placement["affinity"] = dict(serving.affinity)
    if serving.topology_spread_constraints:
        placement["topologySpreadConstraints"] = [dict(item) for item in serving.topology_spread_constraints]
    if serving.image_pull_secrets:
        placement["imagePullSecrets"] = [{"name": secret.name} for secret in serving.image_pull_secrets]
    if serving.priority_class_name:
        placement["priorityClassName"] = serving.priority_class_name
    return placement


def _deployment(
    resource: SpeculativeDeployment,
    variant: str,
    draft: DraftSpec,
    replicas: int,
    image: str,
    owner: Mapping[str, Any],
    configmap: Mapping[str, Any],
    files: Mapping[str, str],
    receives_traffic: bool = True,
) -> dict[str, Any]:
    name, namespace, _ = _metadata(resource)
    serving = resource.spec.serving
    traffic = TRAFFIC_SERVE if receives_traffic else TRAFFIC_HOLD
    pod_labels = dict(
        sorted(
            {
                **_labels(name, variant, COMPONENT_SERVING),
                LABEL_DRAFT_VERSION: draft.version,
                LABEL_DRAFT: drafts.draft_identity(draft),
                LABEL_TRAFFIC: traffic,
            }.items()
        )
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _object_meta(
            serving_deployment_name(resource, variant),
            namespace,
            _labels(name, variant, COMPONENT_SERVING),
            owner,
        ),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(name, variant)},
            # Surge rather than drop capacity; needs one spare replica's GPUs during a roll.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 3600,
            "template": {
                "metadata": {
                    # The user's extra labels and annotations first: specops' own always win.
                    "labels": dict(sorted({**(serving.pod_labels or {}), **pod_labels}.items())),
                    "annotations": dict(
                        sorted(
                            {
                                **(serving.pod_annotations or {}),
                                ANNOTATION_CONFIG_HASH: config_hash(configmap["data"]),
                                "kubectl.kubernetes.io/default-container": CONTAINER_NAME,
                            }.items()
                        )
                    ),
                },
                "spec": _pod_spec(resource, variant, draft, image, configmap["metadata"]["name"], files),
            },
        },
    }


def _service(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    selector: Mapping[str, str],
    owner: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _object_meta(name, namespace, labels, owner),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def _relabel(source: str, target: str) -> dict[str, Any]:
    return {"action": "replace", "sourceLabels": [source], "targetLabel": target}


def _pod_monitor(resource: SpeculativeDeployment, owner: Mapping[str, Any]) -> dict[str, Any]:
    name, namespace, _ = _metadata(resource)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": _object_meta(
            service_name(name), namespace, _labels(name, STABLE, COMPONENT_MONITORING), owner
        ),
        "spec": {
            "selector": {"matchLabels": shared_selector_labels(name)},
            "podMetricsEndpoints": [
                {
                    "port": "metrics",
                    "path": "/metrics",
                    "interval": _prometheus_duration(resource.spec.metrics.interval),
                    "relabelings": [
                        _relabel("__meta_kubernetes_pod_label_specops_dev_deployment", "specops_deployment"),
                        _relabel("__meta_kubernetes_pod_label_specops_dev_variant", "variant"),
                        _relabel("__meta_kubernetes_pod_label_specops_dev_draft", "specops_draft"),
                        _relabel("__meta_kubernetes_namespace", "namespace"),
                        _relabel("__meta_kubernetes_pod_name", "pod"),
                    ],
                }
            ],
        },
    }


def check_renderable(resource: SpeculativeDeployment, options: RenderOptions) -> str:
    """What makes a spec unrenderable, checked before anything is built: pod labels and node
    selectors a real API server refuses, and no serving image. Returns the image."""
    serving = resource.spec.serving
    for field_name, labels in (("podLabels", serving.pod_labels), ("nodeSelector", serving.node_selector)):
        for key, value in (labels or {}).items():
            problem = label_problem(key, value)
            if problem:
                raise RenderError(f"spec.serving.{field_name}", problem)
    image = resource.spec.serving.image or options.default_image
    if not image:
        raise RenderError(
            "spec.serving.image", "no serving image: set it or configure the operator's default image"
        )
    return image


def serving_deployment_name(resource: SpeculativeDeployment, variant: str = STABLE) -> str:
    """The name of the Deployment `render_children` renders for a variant (without rendering it:
    readiness refreshes need only this)."""
    return child_name(_metadata(resource)[0], variant)


def render_children(
    resource: SpeculativeDeployment,
    options: RenderOptions,
    *,
    variant: str = STABLE,
    draft: DraftSpec | None = None,
    replicas: int | None = None,
    receives_traffic: bool = True,
) -> list[dict[str, Any]]:
    """Every object one variant needs, in apply order (ConfigMap before the Deployment mounting it).

    ``draft`` defaults to spec.draft (a canary passes the new draft), ``replicas``
    to spec.serving.replicas; ``receives_traffic=False`` keeps the pods out of the shared
    Service (a canary before its lossless check).
    """
    name, namespace, uid = _metadata(resource)
    image = check_renderable(resource, options)
    draft = draft or resource.spec.draft
    replicas = resource.spec.serving.replicas if replicas is None else replicas
    owner = owner_reference(name, uid)
    files = triton_repo.repository_files(repository_settings(resource, variant, draft), options.bls_source)
    configmap = _configmap(name, namespace, variant, owner, files)
    objects = [
        configmap,
        _deployment(resource, variant, draft, replicas, image, owner, configmap, files, receives_traffic),
        _service(
            variant_service_name(name, variant),
            namespace,
            _labels(name, variant, COMPONENT_SERVING),
            {LABEL_COMPONENT: COMPONENT_SERVING, **selector_labels(name, variant)},
            owner,
        ),
    ]
    if variant == STABLE:
        objects.append(
            _service(
                service_name(name),
                namespace,
                _labels(name, STABLE, COMPONENT_SERVING),
                traffic_selector_labels(name),
                owner,
            )
        )
        if options.pod_monitor:
            objects.append(_pod_monitor(resource, owner))
    return objects
