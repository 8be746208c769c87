"""SpeculativeDeployment -> the Kubernetes objects that serve it (pure functions returning dicts).

Per variant ("stable", "canary", ...):

- ConfigMap ``<child>-engine-config``: the engine's config files for the variant's revision
  (none for engines configured by arguments alone);
- Deployment ``<child>``: the engine pods of the variant's configuration revision
  (engine_pod; ``<child>`` is ``<name>`` for stable, ``<name>-<variant>`` otherwise): a new
  revision rolls out pod by pod within spec.serving.maxSurge / maxUnavailable;
- Service ``<name>-<variant>``: that variant's pods only, the backend a Gateway API
  HTTPRoute weights during a canary.

For the stable variant also:

- Service ``<name>``: every variant's pods, the address users call; without Gateway
  API a canary splits traffic by its share of ready replicas behind it;
- PodMonitor ``<name>`` (optional): scrapes every variant's engine metrics endpoint and
  relabels the pod labels into ``specops_deployment``, ``variant``, ``specops_draft`` and
  ``specops_revision``, the labels the operator's grouped Prometheus queries use.

Names longer than 63 characters are cut and suffixed with a hash so they stay
valid DNS labels and label values; the same rule gives the label values.
"""

from __future__ import annotations

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
from specops.domain import drafts
from specops.domain.engine_pod import PodInputs, engine_pod, revision_labels
from specops.domain.engines import engine_for
from specops.domain.engines.base import Engine
from specops.domain.engines.schedule import Revision
from specops.domain.names import (
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


@dataclass(frozen=True)
class RenderOptions:
    """Operator-wide inputs of rendering."""

    triton_model_source: str = ""
    """Text of assets/llmapi_model/model.py (the Triton backend's model)."""
    default_image: str | None = None
    """Serving image used when spec.serving.image is empty; None: the backend's own default."""
    pod_monitor: bool = True
    """Also render a monitoring.coreos.com/v1 PodMonitor (needs the prometheus-operator CRDs)."""

    def engine(self, backend: str) -> Engine:
        return engine_for(backend, self.triton_model_source)


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


def _configmap(
    name: str, namespace: str, variant: str, owner: Mapping[str, Any], data: Mapping[str, str]
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
        "data": dict(data),
    }


def _pod_spec(
    resource: SpeculativeDeployment,
    engine: Engine,
    revision: Revision,
    draft: DraftSpec,
    image: str,
    configmap_name: str,
) -> tuple[dict[str, str], dict[str, Any], dict[str, str]]:
    spec = resource.spec
    serving = spec.serving
    inputs = PodInputs(
        image=image,
        target_uri=spec.target.uri,
        draft_uri=draft.uri,
        gpus=serving.gpu.count,
        tensor_parallel=serving.tensor_parallel,
        served_model_name=spec.target.model,
        fetcher_image=serving.checkpoint_fetcher_image,
    )
    data, pod, annotations = engine_pod(engine, revision, inputs, configmap_name)
    (container,) = pod["containers"]
    container["resources"] = _container_resources(serving.resources, str(serving.gpu.count))
    pod["tolerations"] = [
        *pod["tolerations"],
        *(toleration.model_dump(by_alias=True, exclude_none=True) for toleration in serving.tolerations),
    ]
    if serving.service_account_name:
        pod["serviceAccountName"] = serving.service_account_name
    pod.update(_placement(serving))
    _add_user_volumes(serving, pod, container)
    return data, pod, annotations


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
    revision: Revision,
    engine: Engine,
    replicas: int,
    pod: tuple[dict[str, str], dict[str, Any], dict[str, str]],
    owner: Mapping[str, Any],
    receives_traffic: bool = True,
) -> dict[str, Any]:
    name, namespace, _ = _metadata(resource)
    serving = resource.spec.serving
    _, pod_spec, annotations = pod
    traffic = TRAFFIC_SERVE if receives_traffic else TRAFFIC_HOLD
    pod_labels = dict(
        sorted(
            {
                **_labels(name, variant, COMPONENT_SERVING),
                LABEL_DRAFT_VERSION: draft.version,
                LABEL_DRAFT: drafts.draft_identity(draft) if revision.mode == "spec" else "",
                LABEL_TRAFFIC: traffic,
                **revision_labels(engine, revision),
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
            # A new revision replaces pods one by one within these bounds (a restart each).
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": serving.max_surge, "maxUnavailable": serving.max_unavailable},
            },
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 3600,
            "template": {
                "metadata": {
                    # The user's extra labels and annotations first: specops' own always win.
                    "labels": dict(sorted({**(serving.pod_labels or {}), **pod_labels}.items())),
                    "annotations": dict(sorted({**(serving.pod_annotations or {}), **annotations}.items())),
                },
                "spec": pod_spec,
            },
        },
    }


def _service(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    selector: Mapping[str, str],
    owner: Mapping[str, Any],
    engine: Engine,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _object_meta(name, namespace, labels, owner),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector),
            "ports": [
                {"name": port.name, "port": port.number, "targetPort": port.name, "protocol": "TCP"}
                for port in engine.ports
            ],
        },
    }


def _relabel(source: str, target: str) -> dict[str, Any]:
    return {"action": "replace", "sourceLabels": [source], "targetLabel": target}


def _pod_monitor(resource: SpeculativeDeployment, owner: Mapping[str, Any], engine: Engine) -> dict[str, Any]:
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
                    "port": engine.metrics_port,
                    "path": engine.metrics_path,
                    "interval": _prometheus_duration(resource.spec.metrics.interval),
                    "relabelings": [
                        _relabel("__meta_kubernetes_pod_label_specops_dev_deployment", "specops_deployment"),
                        _relabel("__meta_kubernetes_pod_label_specops_dev_variant", "variant"),
                        _relabel("__meta_kubernetes_pod_label_specops_dev_draft", "specops_draft"),
                        _relabel("__meta_kubernetes_pod_label_specops_dev_revision", "specops_revision"),
                        _relabel("__meta_kubernetes_namespace", "namespace"),
                        _relabel("__meta_kubernetes_pod_name", "pod"),
                    ],
                }
            ],
        },
    }


def check_renderable(resource: SpeculativeDeployment, options: RenderOptions) -> str:
    """What makes a spec unrenderable, checked before anything is built: pod labels and node
    selectors a real API server refuses. Returns the image."""
    serving = resource.spec.serving
    for field_name, labels in (("podLabels", serving.pod_labels), ("nodeSelector", serving.node_selector)):
        for key, value in (labels or {}).items():
            problem = label_problem(key, value)
            if problem:
                raise RenderError(f"spec.serving.{field_name}", problem)
    return serving.image or options.default_image or options.engine(serving.backend).default_image


def serving_deployment_name(resource: SpeculativeDeployment, variant: str = STABLE) -> str:
    """The name of the Deployment `render_children` renders for a variant (without rendering it:
    readiness refreshes need only this)."""
    return child_name(_metadata(resource)[0], variant)


def render_children(
    resource: SpeculativeDeployment,
    options: RenderOptions,
    revision: Revision,
    *,
    variant: str = STABLE,
    draft: DraftSpec | None = None,
    replicas: int | None = None,
    receives_traffic: bool = True,
) -> list[dict[str, Any]]:
    """Every object one variant needs, in apply order (ConfigMap before the Deployment mounting it).

    ``revision`` is what the variant's pods run; ``draft`` defaults to spec.draft (a canary
    passes the new draft), ``replicas`` to spec.serving.replicas; ``receives_traffic=False``
    keeps the pods out of the shared Service (a canary before its lossless check).
    """
    name, namespace, uid = _metadata(resource)
    image = check_renderable(resource, options)
    engine = options.engine(resource.spec.serving.backend)
    draft = draft or resource.spec.draft
    replicas = resource.spec.serving.replicas if replicas is None else replicas
    owner = owner_reference(name, uid)
    configmap_name = repository_configmap_name(name, variant)
    pod = _pod_spec(resource, engine, revision, draft, image, configmap_name)
    objects = []
    if pod[0]:
        objects.append(_configmap(name, namespace, variant, owner, pod[0]))
    objects += [
        _deployment(resource, variant, draft, revision, engine, replicas, pod, owner, receives_traffic),
        _service(
            variant_service_name(name, variant),
            namespace,
            _labels(name, variant, COMPONENT_SERVING),
            {LABEL_COMPONENT: COMPONENT_SERVING, **selector_labels(name, variant)},
            owner,
            engine,
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
                engine,
            )
        )
        if options.pod_monitor:
            objects.append(_pod_monitor(resource, owner, engine))
    return objects
