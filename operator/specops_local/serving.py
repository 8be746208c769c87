"""Plays the cluster's Deployment controller and kubelet for specops serving Deployments.

The emulated API server runs no controllers. For every Deployment specops renders, this reads
the pod template's container ``engine`` (command, args, env, and its ConfigMap volume mounts
resolved to files through the ConfigMap's ``items``) and starts the simulated engine that
command names (`specops_local.sim.engines`): a real HTTP server on 127.0.0.1 that reads its
speculative config from exactly those args and files and refuses what the real engine would.

Like a kubelet it publishes each pod as a Pod object carrying the template's labels (the
``specops.dev/revision`` label included), its podIP and the engine's real ports; the Pod is
Ready only once the engine's health endpoint would answer, and a refused config shows as a
waiting container (CrashLoopBackOff) whose message is the engine's error. Like the Deployment
controller it replaces pods when the template changes (a new revision), a few at a time as the
Deployment's ``strategy.rollingUpdate`` (maxSurge, maxUnavailable) allows; every new pod is down
for the engine's ``restart_s`` before it is ready. Prometheus scrapes every engine with the
labels a PodMonitor would set (namespace, pod, specops_deployment, variant, specops_draft,
specops_revision) at the engine's own metrics path (``__metrics_path__``).

The controller reaches the cluster through `ServingCluster` (a handful of operations) and
publishes scrape targets through `TargetSink`: in-process (`InProcessCluster`, the tests and the
demo) or over the emulator's HTTP API from another process (`specops_local.remote_cluster`, the
scale benchmark's pod farms).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from specops.domain import perf
from specops_local.cluster import EmulatedCluster
from specops_local.prometheus import PrometheusProcess
from specops_local.sim import EngineConfigError, LoadPoint, SimEngine, launch
from specops_local.sim.engines.base import DEFAULT_SETUP

log = logging.getLogger(__name__)

DEPLOYMENT_LABEL = "specops.dev/deployment"
VARIANT_LABEL = "specops.dev/variant"
DRAFT_LABEL = "specops.dev/draft"
REVISION_LABEL = "specops.dev/revision"
DRAFT_VERSION_LABEL = "specops.dev/draft-version"
ENGINE_CONTAINER = "engine"
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=specops"
"""The label selector of the Deployments specops renders (the controller serves only those)."""

Body = dict[str, Any]
PodOptions = Callable[[Any, str], dict[str, Any]]
"""(owner, variant) -> engine keyword arguments; owner is the SpeculativeDeployment model, or its
raw body when it does not validate."""


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
    """How a draft version behaves in the simulated engines: its acceptance, and whether it is lossless."""

    alpha: float
    lossless: bool = True


class MountPending(Exception):
    """A volume the kubelet cannot mount yet (the pod stays ContainerCreating and is retried)."""


@dataclass
class PodSlot:
    """One pod of a serving Deployment: its engine, or why it has none running."""

    name: str
    template_key: str
    labels: dict[str, str]
    engine: SimEngine | None = None
    error: str | None = None
    """The engine refused its configuration (the container crash-loops with this message)."""
    pending: str | None = None
    """A volume could not be mounted yet (retried at every sync)."""
    published: str | None = None
    transitioned: str | None = None
    """When the Ready condition last changed (RFC 3339), as a kubelet reports it."""
    was_ready: bool = False

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.ready

    @property
    def revision(self) -> str:
        return self.labels.get(REVISION_LABEL, "")


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
    slots: list[PodSlot] = field(default_factory=list)
    template_key: str | None = None
    seen_version: str | None = None
    """The Deployment's resourceVersion template_key was taken from."""
    uid: str | None = None
    """The Deployment's uid: one deleted and created again under its name is another Deployment."""
    serial: int = 0

    @property
    def pods(self) -> list[SimEngine]:
        """The engines of this set's pods (pods whose engine refused its config have none)."""
        return [slot.engine for slot in self.slots if slot.engine is not None]


class ServingController:
    """Reconciles serving Deployments into running simulated engines (a poll loop).

    ``restart_s`` overrides every engine's start-to-ready time (else the serving profile's,
    else 120 s); ``drafts`` maps a draft (its ``specops.dev/draft`` label, or the version at
    the label's end) to its behaviour; ``pod_options`` adds engine keyword arguments per owner
    and variant (e.g. ``serving_profile``). ``select`` narrows which Deployments this controller
    serves (a pod farm serves its shard); ``concurrency`` > 1 syncs that many Deployments at a
    time (a pod farm, over HTTP).
    """

    def __init__(
        self,
        cluster: EmulatedCluster | ServingCluster,
        prometheus: PrometheusProcess | TargetSink | None = None,
        *,
        load: LoadPoint | None = None,
        pod_options: PodOptions | None = None,
        drafts: dict[str, DraftBehaviour] | None = None,
        restart_s: float | None = None,
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
        self.drafts = drafts if drafts is not None else {}
        self.restart_s = restart_s
        self.poll_s = poll_s
        self.sets: dict[tuple[str, str], ServingSet] = {}
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._published: list[dict[str, Any]] | None = None

    # ------------------------------------------------------------------ control from tests

    def all_pods(self, variant: str | None = None) -> list[SimEngine]:
        """Every running engine (of one variant, when named)."""
        return [p for s in self.sets.values() if variant in (None, s.variant) for p in s.pods]

    def all_slots(self, variant: str | None = None) -> list[PodSlot]:
        return [slot for s in self.sets.values() if variant in (None, s.variant) for slot in s.slots]

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
            for slot in serving.slots:
                if slot.engine is not None:
                    await slot.engine.stop()

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
                serving = self.sets.pop(key)
                for slot in list(serving.slots):
                    await self._remove(serving, slot)
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

    async def _sync_deployment(self, key: tuple[str, str], deployment: Body) -> None:
        namespace, name = key
        labels = deployment["metadata"]["labels"]
        label = labels.get(DEPLOYMENT_LABEL, name)
        owner = next(
            (
                str(ref["name"])
                for ref in deployment["metadata"].get("ownerReferences") or []
                if ref.get("kind") == "SpeculativeDeployment" and ref.get("name")
            ),
            label,
        )
        serving = self.sets.get(key)
        uid = deployment["metadata"].get("uid")
        if serving is not None and serving.uid != uid:
            # deleted and created again between two passes: its pods went with the old one (a
            # real cluster's garbage collector deletes them with their ReplicaSet)
            for slot in list(serving.slots):
                await self._remove(serving, slot)
            serial, serving = serving.serial, None
        else:
            serial = 0
        if serving is None:
            serving = self.sets[key] = ServingSet(
                namespace, name, owner, labels.get(VARIANT_LABEL, "stable"), label=label, uid=uid
            )
            serving.serial = serial  # the new pods' names are new (a real cluster's are random)
        version = deployment["metadata"].get("resourceVersion")
        if version is None or version != serving.seen_version or serving.template_key is None:
            serving.template_key = _template_key(deployment["spec"]["template"])
        serving.seen_version = version
        await self._rollout(serving, deployment)
        for slot in serving.slots:
            await self._publish_pod(serving, slot)
        await self._publish_deployment(serving, deployment)

    # ------------------------------------------------------------------ the Deployment controller

    async def _rollout(self, serving: ServingSet, deployment: Body) -> None:
        """One pass of a rolling update (or a scale) toward the current template."""
        desired = int(deployment["spec"].get("replicas", 1))
        surge, unavailable = rolling_update_bounds(deployment, desired)
        recreate = ((deployment["spec"].get("strategy") or {}).get("type")) == "Recreate"
        key = serving.template_key
        for slot in [s for s in serving.slots if s.pending is not None and s.template_key == key]:
            await self._start_engine(serving, slot, deployment)  # a volume that was missing: try again
            if slot.pending is None:  # the Pod object gets the engine's ports
                with contextlib.suppress(Exception):
                    await self.cluster.delete("pods", slot.name, serving.namespace)
                template = deployment["spec"]["template"]
                await self.cluster.create("pods", self._pod_body(serving, slot, template), serving.namespace)
                slot.published = None

        def new() -> list[PodSlot]:
            return [s for s in serving.slots if s.template_key == key]

        def old() -> list[PodSlot]:
            return [s for s in serving.slots if s.template_key != key]

        async def scale_up() -> None:
            if recreate and old():
                return
            room = desired + (0 if recreate else surge) - len(serving.slots)
            for _ in range(max(0, min(desired - len(new()), room))):
                await self._create(serving, deployment)

        await scale_up()
        # Old pods that are not ready cost no availability: they go first, as the controller's cleanup.
        for slot in [s for s in old() if not s.ready or recreate]:
            await self._remove(serving, slot)
        min_available = desired - unavailable
        for slot in old():
            available = sum(1 for s in serving.slots if s.ready)
            if available - 1 < min_available:
                break
            await self._remove(serving, slot)
        extra = len(new()) - desired
        if extra > 0:
            # Scale down: pods that are not ready first, then the newest.
            ordered = sorted(new(), key=lambda s: (s.ready, -serving.slots.index(s)))
            for slot in ordered[:extra]:
                await self._remove(serving, slot)
        await scale_up()

    async def _create(self, serving: ServingSet, deployment: Body) -> None:
        template = deployment["spec"]["template"]
        assert serving.template_key is not None
        serving.serial += 1
        hash_part = hashlib.sha256(serving.template_key.encode()).hexdigest()[:8]
        slot = PodSlot(
            name=f"{serving.deployment}-{hash_part}-{serving.serial}",
            template_key=serving.template_key,
            labels=dict((template.get("metadata") or {}).get("labels") or {}),
        )
        serving.slots.append(slot)
        await self._start_engine(serving, slot, deployment)
        await self.cluster.create("pods", self._pod_body(serving, slot, template), serving.namespace)

    async def _start_engine(self, serving: ServingSet, slot: PodSlot, deployment: Body) -> None:
        template = deployment["spec"]["template"]
        container = engine_container(template)
        try:
            files = await self.mounted_files(serving.namespace, template, container)
        except MountPending as pending:
            slot.pending = str(pending)
            return
        slot.pending = None
        env = {e["name"]: str(e.get("value", "")) for e in container.get("env") or [] if "name" in e}
        options = await self._engine_options(serving, slot)
        try:
            engine = launch(
                slot.name,
                container.get("command") or [],
                container.get("args") or [],
                files=files,
                env=env,
                **options,
            )
        except EngineConfigError as error:
            slot.error = str(error)
            log.info(
                "pod %s/%s: the engine refused its configuration: %s", serving.namespace, slot.name, error
            )
            return
        await engine.start()
        slot.engine = engine

    async def _engine_options(self, serving: ServingSet, slot: PodSlot) -> dict[str, Any]:
        draft = slot.labels.get(DRAFT_LABEL, "")
        options: dict[str, Any] = {
            "load": self.load,
            "seed": serving.serial,
            "draft_identity": draft,
        }
        owner, setup = await self._owner(serving)
        options["setup"] = setup
        behaviour = self._behaviour(slot.labels)
        if behaviour is not None:
            options["draft_alpha"] = behaviour.alpha
            options["lossless"] = behaviour.lossless
        if self.pod_options is not None and owner is not None:
            options.update(self.pod_options(owner, serving.variant))
        if self.restart_s is not None:
            options["restart_s"] = self.restart_s
        return options

    async def _owner(self, serving: ServingSet) -> tuple[Any, perf.ModelSetup]:
        """The owning resource (the validated model where it validates, else its body) and the
        roofline world of its spec (used by engines without a serving profile)."""
        try:
            body = await self.cluster.get("speculativedeployments", serving.owner, serving.namespace)
        except Exception:  # the resource is not served here (a cluster without the CRD)
            body = None
        if body is None:
            return None, DEFAULT_SETUP
        setup = roofline_setup(body)
        try:
            from specops.api.models import SpeculativeDeployment

            return SpeculativeDeployment.model_validate(body), setup
        except Exception:
            return body, setup

    def _behaviour(self, labels: Mapping[str, str]) -> DraftBehaviour | None:
        """The draft's behaviour: by its label, else by the version at the label's end."""
        for candidate in (labels.get(DRAFT_VERSION_LABEL), labels.get(DRAFT_LABEL)):
            if not candidate:
                continue
            for key in (candidate, re.split(r"[:@/]", candidate)[-1], re.split(r"[-_.]", candidate)[-1]):
                if key in self.drafts:
                    return self.drafts[key]
        return None

    async def mounted_files(self, namespace: str, template: Body, container: Body) -> dict[str, str]:
        """The container's ConfigMap volume mounts as {absolute path: content} (``items``, ``subPath``)."""
        volumes = {v.get("name"): v for v in (template.get("spec") or {}).get("volumes") or []}
        files: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            source = (volumes.get(mount.get("name")) or {}).get("configMap")
            if not source:
                continue
            optional = bool(source.get("optional"))
            config_map = await self.cluster.get("configmaps", source["name"], namespace)
            if config_map is None:
                if optional:
                    continue
                raise MountPending(
                    f'MountVolume.SetUp failed for volume "{mount["name"]}": configmap "{source["name"]}" not found'
                )
            data = config_map.get("data") or {}
            items = source.get("items") or [{"key": key, "path": key} for key in data]
            for item in items:
                if item["key"] not in data:
                    if optional:
                        continue
                    raise MountPending(
                        f'MountVolume.SetUp failed for volume "{mount["name"]}": configmap references '
                        f"non-existent config key: {item['key']}"
                    )
                sub_path = mount.get("subPath")
                if sub_path:
                    if posixpath.normpath(item["path"]) == posixpath.normpath(sub_path):
                        files[posixpath.normpath(mount["mountPath"])] = data[item["key"]]
                    continue
                files[posixpath.normpath(posixpath.join(mount["mountPath"], item["path"]))] = data[
                    item["key"]
                ]
        return files

    async def _remove(self, serving: ServingSet, slot: PodSlot) -> None:
        if slot in serving.slots:
            serving.slots.remove(slot)
        if slot.engine is not None:
            await slot.engine.stop()
        with contextlib.suppress(Exception):
            await self.cluster.delete("pods", slot.name, serving.namespace)

    # ------------------------------------------------------------------ the kubelet

    def _pod_body(self, serving: ServingSet, slot: PodSlot, template: Body) -> Body:
        container = engine_container(template)
        engine = slot.engine
        ports: list[Body] = []
        for port in container.get("ports") or []:
            port = dict(port)
            if engine is not None and port.get("name") == "metrics":
                port["containerPort"] = engine.metrics_port
            elif engine is not None and port.get("name") != "grpc":
                port["containerPort"] = engine.http_port
            ports.append(port)
        if engine is not None and not ports:
            ports.append({"name": "http", "containerPort": engine.http_port})
            if engine.metrics_port != engine.http_port:
                ports.append({"name": "metrics", "containerPort": engine.metrics_port})
        published = {
            key: container[key]
            for key in ("name", "image", "command", "args", "env", "volumeMounts")
            if key in container
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": slot.name, "namespace": serving.namespace, "labels": dict(slot.labels)},
            "spec": {
                "containers": [{**published, "ports": ports}],
                "volumes": list((template.get("spec") or {}).get("volumes") or []),
            },
        }

    async def _publish_pod(self, serving: ServingSet, slot: PodSlot) -> None:
        if slot.transitioned is None or slot.ready != slot.was_ready:
            slot.was_ready = slot.ready
            slot.transitioned = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = pod_status(slot)
        digest = json.dumps(status, sort_keys=True)
        if digest == slot.published:
            return
        with contextlib.suppress(Exception):
            await self.cluster.patch_status("pods", slot.name, status, serving.namespace)
            slot.published = digest

    async def _publish_deployment(self, serving: ServingSet, deployment: Body) -> None:
        updated = [s for s in serving.slots if s.template_key == serving.template_key]
        ready = sum(1 for s in serving.slots if s.ready)
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(serving.slots),
            "updatedReplicas": len(updated),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(0, len(serving.slots) - ready),
        }
        if any(deployment.get("status", {}).get(k) != v for k, v in status.items()):
            await self.cluster.patch_status("deployments", serving.deployment, status, serving.namespace)

    def _publish_targets(self) -> None:
        if self.prometheus is None:
            return
        groups = [
            {
                "targets": [f"{slot.engine.host}:{slot.engine.metrics_port}"],
                "labels": {
                    "__metrics_path__": slot.engine.metrics_path,
                    "namespace": serving.namespace,
                    "pod": slot.name,
                    "specops_deployment": serving.label,
                    "variant": serving.variant,
                    "specops_draft": slot.labels.get(DRAFT_LABEL, ""),
                    "specops_revision": slot.revision,
                },
            }
            for serving in self.sets.values()
            for slot in serving.slots
            if slot.engine is not None
        ]
        if groups != self._published:
            self.prometheus.set_targets(groups)
            self._published = groups


def roofline_setup(owner: Body) -> perf.ModelSetup:
    """The roofline of a SpeculativeDeployment's spec (GPU, parameters, precision, TP); the
    default world where the spec does not say."""
    spec = owner.get("spec") or {}
    target, draft, serving = spec.get("target") or {}, spec.get("draft") or {}, spec.get("serving") or {}
    try:
        return perf.ModelSetup(
            gpu=perf.GPUS[str((serving.get("gpu") or {}).get("type", "H100"))],
            target_params=float(
                target.get("activeParameterCount")
                or target.get("parameterCount")
                or DEFAULT_SETUP.target_params
            ),
            draft_params=float(draft.get("parameterCount") or DEFAULT_SETUP.draft_params),
            bytes_per_param=perf.BYTES_PER_PARAM[str(target.get("precision", "fp16"))],
            tensor_parallel=int(serving.get("tensorParallel") or DEFAULT_SETUP.tensor_parallel),
            context_tokens=perf.DEFAULT_CONTEXT_TOKENS,
        )
    except (KeyError, TypeError, ValueError):
        return DEFAULT_SETUP


def _template_key(template: Body) -> str:
    return json.dumps(template, sort_keys=True)


def engine_container(template: Body) -> Body:
    """The pod template's container ``engine`` (else its first container)."""
    containers = (template.get("spec") or {}).get("containers") or []
    for container in containers:
        if container.get("name") == ENGINE_CONTAINER:
            return dict(container)
    return dict(containers[0]) if containers else {}


def rolling_update_bounds(deployment: Body, replicas: int) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) as pod counts: percentages of replicas, surge rounded up,
    unavailability down, default 25 % each; never both 0 (the API server refuses that)."""
    rolling = ((deployment["spec"].get("strategy") or {}).get("rollingUpdate")) or {}

    def count(value: object, round_up: bool) -> int:
        if value is None:
            value = "25%"
        if isinstance(value, str) and value.endswith("%"):
            share = replicas * float(value[:-1]) / 100.0
            return math.ceil(share) if round_up else math.floor(share)
        return int(str(value))

    surge = count(rolling.get("maxSurge"), True)
    unavailable = count(rolling.get("maxUnavailable"), False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def pod_status(slot: PodSlot) -> Body:
    """What a kubelet reports for the pod's current state."""
    engine = slot.engine
    ready = slot.ready
    container: Body = {"name": ENGINE_CONTAINER, "ready": ready, "restartCount": 0}
    if slot.pending is not None:
        container["state"] = {"waiting": {"reason": "ContainerCreating", "message": slot.pending}}
        container["started"] = False
        phase = "Pending"
    elif slot.error is not None:
        container["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": slot.error}}
        container["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "message": slot.error}}
        container["restartCount"] = 1
        container["started"] = False
        phase = "Running"
    else:
        container["state"] = {"running": {}}
        container["started"] = engine is not None and engine.running
        phase = "Running"
    reason = None if ready else "ContainersNotReady"
    since = {"lastTransitionTime": slot.transitioned} if slot.transitioned else {}
    conditions: list[Body] = [
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            **({"reason": reason} if reason else {}),
            **since,
        },
        {"type": "ContainersReady", "status": "True" if ready else "False", **since},
    ]
    status: Body = {"phase": phase, "conditions": conditions, "containerStatuses": [container]}
    if phase == "Running":
        status["podIP"] = engine.host if engine is not None else "127.0.0.1"
    return status
