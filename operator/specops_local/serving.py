"""Plays the cluster's Deployment controller and kubelet for specops serving Deployments.

The emulated API server runs no controllers. For every Deployment specops renders,
this starts that many simulated Triton pods (real HTTP servers on 127.0.0.1),
publishes them as Pod objects the way a kubelet would (Ready condition, podIP,
the container's real ports), keeps the Deployment's status current, and points
Prometheus at their metrics ports with the labels a PodMonitor would set. The
operator's discovery, metrics and actuation code paths are therefore the
production ones.

The controller reaches the cluster through `ServingCluster` (a handful of operations) and
publishes scrape targets through `TargetSink`: in-process (`InProcessCluster`, the tests and the
demo) or over the emulator's HTTP API from another process (`specops_local.remote_cluster`, the
scale benchmark's pod farms).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from specops.api.models import SpeculativeDeployment
from specops.domain.control_status import policy_config
from specops_local.cluster import EmulatedCluster
from specops_local.prometheus import PrometheusProcess
from specops_local.sim import LoadPoint, SimPod

log = logging.getLogger(__name__)

DEPLOYMENT_LABEL = "specops.dev/deployment"
VARIANT_LABEL = "specops.dev/variant"
DRAFT_LABEL = "specops.dev/draft"
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=specops"
"""The label selector of the Deployments specops renders (the controller serves only those)."""

Body = dict[str, Any]


class ServingCluster(Protocol):
    """The cluster operations the controller uses (resources by plural: deployments, pods, ...)."""

    async def objects(self, resource: str, label_selector: str = "") -> list[Body]:
        """Every stored object of the resource in all namespaces that matches the selector."""
        ...

    async def get(self, resource: str, name: str, namespace: str) -> Body | None: ...

    async def create(self, resource: str, body: Body, namespace: str) -> Body: ...

    async def patch_status(self, resource: str, name: str, status: Body, namespace: str) -> Body: ...

    async def delete(self, resource: str, name: str, namespace: str) -> None: ...


class TargetSink(Protocol):
    """Where the controller writes Prometheus's file_sd target groups (PrometheusProcess is one)."""

    def set_targets(self, groups: Sequence[Mapping[str, Any]]) -> None: ...


class InProcessCluster:
    """`ServingCluster` over an emulated cluster in this process: direct calls, no HTTP."""

    def __init__(self, cluster: EmulatedCluster) -> None:
        self.cluster = cluster

    async def objects(self, resource: str, label_selector: str = "") -> list[Body]:
        return self.cluster.emulator.list_objects(self.cluster.resource(resource), None, label_selector)

    async def get(self, resource: str, name: str, namespace: str) -> Body | None:
        return self.cluster.get(resource, name, namespace=namespace)

    async def create(self, resource: str, body: Body, namespace: str) -> Body:
        return self.cluster.create(resource, body, namespace=namespace)

    async def patch_status(self, resource: str, name: str, status: Body, namespace: str) -> Body:
        return self.cluster.patch_status(resource, name, status, namespace=namespace)

    async def delete(self, resource: str, name: str, namespace: str) -> None:
        self.cluster.emulator.delete_object(self.cluster.resource(resource), namespace, name)


@dataclass(frozen=True)
class DraftBehaviour:
    """How a draft version behaves in the simulated pods: its acceptance, and whether it is lossless."""

    alpha: float
    lossless: bool = True


@dataclass
class ServingSet:
    """The simulated pods behind one serving Deployment."""

    namespace: str
    deployment: str
    owner: str
    """The owning SpeculativeDeployment's name (from the ownerReference)."""
    variant: str
    label: str = ""
    """The ``specops.dev/deployment`` label value: the name, or a hashed form of a long one."""
    pods: list[SimPod] = field(default_factory=list)
    template_key: str | None = None
    seen_version: str | None = None
    """The Deployment's resourceVersion template_key was taken from."""
    draft_label: str = ""
    """The pods' ``specops.dev/draft`` label, which the PodMonitor relabels into ``specops_draft``."""


class ServingController:
    """Reconciles serving Deployments into running simulated pods (a poll loop).

    ``select`` narrows which Deployments this controller serves (a pod farm serves its shard);
    ``concurrency`` > 1 syncs that many Deployments at a time (a pod farm, over HTTP).
    """

    def __init__(
        self,
        cluster: EmulatedCluster | ServingCluster,
        prometheus: PrometheusProcess | TargetSink | None = None,
        *,
        load: LoadPoint | None = None,
        pod_options: Callable[[SpeculativeDeployment, str], dict[str, Any]] | None = None,
        drafts: dict[str, DraftBehaviour] | None = None,
        poll_s: float = 0.1,
        select: Callable[[Body], bool] | None = None,
        concurrency: int = 1,
    ) -> None:
        self.cluster: ServingCluster = (
            InProcessCluster(cluster) if isinstance(cluster, EmulatedCluster) else cluster
        )
        self.select = select
        self.concurrency = concurrency
        self.prometheus = prometheus
        self.load = load or LoadPoint(batch=8, alpha=0.8)
        self.pod_options = pod_options
        self.drafts = drafts or {}
        self.poll_s = poll_s
        self.sets: dict[tuple[str, str], ServingSet] = {}
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._published: list[dict[str, Any]] | None = None

    # ------------------------------------------------------------------ control from tests

    def all_pods(self, variant: str | None = None) -> list[SimPod]:
        return [p for s in self.sets.values() if variant in (None, s.variant) for p in s.pods]

    def set_load(self, load: LoadPoint, variant: str | None = None) -> None:
        if variant is None:
            self.load = load
        for pod in self.all_pods(variant):
            pod.set_load(load)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> ServingController:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="serving controller")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        for serving in self.sets.values():
            for pod in serving.pods:
                await pod.stop()

    async def _run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.sync()
            except Exception:  # keep playing the controller; a test assertion will tell
                log.exception("serving controller sync failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.poll_s)

    async def sync(self) -> None:
        live_keys = set()
        work: list[tuple[tuple[str, str], Body]] = []
        for deployment in await self.cluster.objects("deployments", MANAGED_SELECTOR):
            meta = deployment["metadata"]
            labels = meta.get("labels") or {}
            if labels.get("app.kubernetes.io/managed-by") != "specops" or meta.get("deletionTimestamp"):
                continue
            if self.select is not None and not self.select(deployment):
                continue
            key = (meta["namespace"], meta["name"])
            live_keys.add(key)
            if self.concurrency <= 1:
                await self._sync_deployment(key, deployment)
            else:
                work.append((key, deployment))
        if work:
            await self._sync_concurrently(work)
        for key in list(self.sets):
            if key not in live_keys:
                await self._scale(self.sets.pop(key), 0, None)
        self._publish_targets()

    async def _sync_concurrently(self, work: list[tuple[tuple[str, str], Body]]) -> None:
        """Up to ``concurrency`` Deployments at a time: over HTTP, starting 2,000 pods one request
        after another would take minutes. One Deployment's failure does not hold up the others."""
        bound = asyncio.Semaphore(self.concurrency)

        async def one(key: tuple[str, str], deployment: Body) -> None:
            async with bound:
                try:
                    await self._sync_deployment(key, deployment)
                except Exception:
                    log.exception("serving controller sync of %s/%s failed", *key)

        await asyncio.gather(*(one(key, deployment) for key, deployment in work))

    async def _sync_deployment(self, key: tuple[str, str], deployment: dict[str, Any]) -> None:
        namespace, name = key
        labels = deployment["metadata"]["labels"]
        label = labels[DEPLOYMENT_LABEL]
        owner = next(
            (
                str(ref["name"])
                for ref in deployment["metadata"].get("ownerReferences") or []
                if ref.get("kind") == "SpeculativeDeployment" and ref.get("name")
            ),
            label,
        )
        serving = self.sets.get(key)
        if serving is None:
            serving = self.sets[key] = ServingSet(
                namespace, name, owner, labels.get(VARIANT_LABEL, "stable"), label=label
            )
        version = deployment["metadata"].get("resourceVersion")
        if version is None or version != serving.seen_version or serving.template_key is None:
            template_key = json.dumps(deployment["spec"]["template"], sort_keys=True)
        else:
            template_key = serving.template_key  # the same version: the same template (2,000 per poll)
        serving.seen_version = version
        if serving.template_key not in (None, template_key):
            await self._scale(serving, 0, None)  # a new pod template: replace every pod (a fast "rollout")
        serving.template_key = template_key
        serving.draft_label = (deployment["spec"]["template"]["metadata"].get("labels") or {}).get(
            DRAFT_LABEL, ""
        )
        await self._scale(serving, int(deployment["spec"].get("replicas", 1)), deployment)
        ready = sum(1 for p in serving.pods if p.running and p.ready)
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(serving.pods),
            "updatedReplicas": len(serving.pods),
            "readyReplicas": ready,
            "availableReplicas": ready,
        }
        if any(deployment.get("status", {}).get(k) != v for k, v in status.items()):
            await self.cluster.patch_status("deployments", name, status, namespace)

    async def _scale(self, serving: ServingSet, replicas: int, deployment: dict[str, Any] | None) -> None:
        while len(serving.pods) > replicas:
            pod = serving.pods.pop()
            await pod.stop()
            with contextlib.suppress(Exception):
                await self.cluster.delete("pods", pod.name, serving.namespace)
        while len(serving.pods) < replicas and deployment is not None:
            pod = await self._start_pod(serving, deployment, len(serving.pods))
            serving.pods.append(pod)

    async def _start_pod(self, serving: ServingSet, deployment: dict[str, Any], index: int) -> SimPod:
        owner = await self.cluster.get("speculativedeployments", serving.owner, serving.namespace)
        if owner is None:
            raise LookupError(f"owner {serving.owner} of {serving.deployment} not found")
        resource = SpeculativeDeployment.model_validate(owner)
        spec = resource.spec
        template = deployment["spec"]["template"]
        draft_version = template["metadata"]["labels"].get("specops.dev/draft-version", spec.draft.version)
        options: dict[str, Any] = {
            "max_draft_len": spec.target.engine.max_draft_len,
            "draft_length": 0,  # as the rendered BLS config: the control loop switches speculation on
            "draft_version": draft_version,
            "load": self.load,
            "deployment": serving.label,
            "variant": serving.variant,
            "seed": index,
        }
        behaviour = self.drafts.get(draft_version)
        if behaviour is not None:
            options["engine_alpha_by_draft"] = {draft_version: behaviour.alpha}
            options["lossless"] = behaviour.lossless
        if self.pod_options is not None:
            options.update(self.pod_options(resource, serving.variant))
        pod = SimPod(f"{serving.deployment}-{index}", policy_config(spec).setup, **options)
        await pod.start()
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": serving.namespace,
                "labels": dict(template["metadata"].get("labels") or {}),
            },
            "spec": {
                "containers": [
                    {
                        "name": "triton",
                        "image": template["spec"]["containers"][0]["image"],
                        "ports": [
                            {"name": "http", "containerPort": pod.http_port},
                            {"name": "metrics", "containerPort": pod.metrics_port},
                        ],
                    }
                ]
            },
        }
        await self.cluster.create("pods", body, serving.namespace)
        await self.cluster.patch_status(
            "pods",
            pod.name,
            {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
            },
            serving.namespace,
        )
        return pod

    def _publish_targets(self) -> None:
        if self.prometheus is None:
            return
        groups = [
            {
                "targets": [f"127.0.0.1:{pod.metrics_port}"],
                "labels": {
                    "namespace": serving.namespace,
                    "specops_deployment": serving.label,
                    "variant": serving.variant,
                    "specops_draft": serving.draft_label,
                    "pod": pod.name,
                },
            }
            for serving in self.sets.values()
            for pod in serving.pods
        ]
        if groups != self._published:
            self.prometheus.set_targets(groups)
            self._published = groups
