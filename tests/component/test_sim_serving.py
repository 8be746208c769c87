"""The serving controller on an emulated cluster: Deployment pod templates become simulated engines.

Hand-written Deployments and ConfigMaps in the rendering contract's shape: the controller
resolves the mounted files through the ConfigMap's items, starts the engine the command names,
publishes Pods (labels, readiness, a crash-loop reason for a refused config) and scrape targets,
and rolls a template change out pod by pod within maxSurge / maxUnavailable.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from specops_local.cluster import EmulatedCluster, emulated_cluster
from specops_local.serving import DraftBehaviour, ServingController, rolling_update_bounds
from specops_local.sim import LoadPoint
from specops_local.sim.text import greedy_text
from tests.component.test_sim import EAGLE3, TRTLLM_CMD, trtllm_args, trtllm_yaml

RESTART_S = 0.5
NAMESPACE = "default"


class Targets:
    def __init__(self) -> None:
        self.groups: list[Mapping[str, Any]] = []

    def set_targets(self, groups: Sequence[Mapping[str, Any]]) -> None:
        self.groups = list(groups)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmulatedCluster]:
    async with emulated_cluster([], tmp_path) as running:
        yield running


def config_map(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"config.yaml": trtllm_yaml(spec)},
    }


def deployment(
    revision: str, config: str, replicas: int = 2, surge: int | str = 1, unavailable: int | str = 0
) -> dict[str, Any]:
    labels = {
        "app.kubernetes.io/managed-by": "specops",
        "specops.dev/deployment": "chat",
        "specops.dev/variant": "stable",
        "specops.dev/draft": "chat-draft-v3",
        "specops.dev/revision": revision,
        "specops.dev/mode": "spec",
        "specops.dev/backend": "trtllm-serve",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"specops.dev/deployment": "chat"}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable},
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": "nvcr.io/nvidia/tensorrt-llm/release:1.3.0",
                            "command": TRTLLM_CMD,
                            "args": trtllm_args(),
                            "ports": [{"name": "http", "containerPort": 8000}],
                            "volumeMounts": [
                                {
                                    "name": "engine-config",
                                    "mountPath": "/etc/specops/engine",
                                    "readOnly": True,
                                }
                            ],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "engine-config",
                            "configMap": {
                                "name": config,
                                "items": [{"key": "config.yaml", "path": "config.yaml"}],
                            },
                        }
                    ],
                },
            },
        },
    }


def pods(cluster: EmulatedCluster) -> list[dict[str, Any]]:
    return cluster.objects("pods", NAMESPACE)


def ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


async def until(predicate: Any, within_s: float = 10.0) -> None:
    """Poll the emulated cluster (it has no event to wait on here) until the predicate holds."""
    async with asyncio.timeout(within_s):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def replace(cluster: EmulatedCluster, body: dict[str, Any]) -> None:
    current = cluster.get("deployments", body["metadata"]["name"], NAMESPACE)
    assert current is not None
    cluster.emulator.patch_object(
        cluster.resource("deployments"),
        NAMESPACE,
        body["metadata"]["name"],
        {"spec": body["spec"], "metadata": body["metadata"]},
    )


async def test_pods_run_the_engine_of_the_template_and_roll_to_a_new_revision(
    cluster: EmulatedCluster,
) -> None:
    targets = Targets()
    cluster.create("configmaps", config_map("chat-a", EAGLE3), namespace=NAMESPACE)
    cluster.create("deployments", deployment("rev-a", "chat-a"), namespace=NAMESPACE)
    drafts = {"v3": DraftBehaviour(alpha=0.6)}
    async with ServingController(
        cluster, targets, load=LoadPoint(batch=8, alpha=0.8), drafts=drafts, restart_s=RESTART_S, poll_s=0.02
    ) as serving:
        await until(lambda: len(pods(cluster)) == 2 and all(ready(p) for p in pods(cluster)))
        engines = serving.all_pods()
        assert [e.backend for e in engines] == ["trtllm-serve", "trtllm-serve"]
        assert all(e.spec is not None and e.spec.k_at(5) == 2 for e in engines)
        assert all(e.draft_alpha == 0.6 for e in engines)
        pod = pods(cluster)[0]
        assert pod["metadata"]["labels"]["specops.dev/revision"] == "rev-a"
        assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] in {e.http_port for e in engines}
        assert {g["labels"]["specops_revision"] for g in targets.groups} == {"rev-a"}
        group = targets.groups[0]["labels"]
        assert group["__metrics_path__"] == "/prometheus/metrics"
        assert {"namespace", "pod", "specops_deployment", "variant", "specops_draft"} <= set(group)
        assert group["specops_draft"] == "chat-draft-v3"
        status = cluster.get("deployments", "chat", NAMESPACE)["status"]  # type: ignore[index]
        assert status["readyReplicas"] == 2 and status["updatedReplicas"] == 2

        # A new revision: a new schedule in a new ConfigMap. maxSurge 1, maxUnavailable 0:
        # never fewer than 2 ready pods, never more than 3 pods, each new pod down restart_s.
        cluster.create(
            "configmaps",
            config_map("chat-b", {**EAGLE3, "draft_len_schedule": {4: 4, 8: 1}}),
            namespace=NAMESPACE,
        )
        replace(cluster, deployment("rev-b", "chat-b"))
        seen_counts, seen_ready = set(), set()
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with asyncio.timeout(15):
            while True:
                current = pods(cluster)
                seen_counts.add(len(current))
                seen_ready.add(sum(1 for p in current if ready(p)))
                revisions = {p["metadata"]["labels"]["specops.dev/revision"] for p in current}
                if revisions == {"rev-b"} and len(current) == 2 and all(ready(p) for p in current):
                    break
                await asyncio.sleep(0.01)
        assert max(seen_counts) == 3
        assert min(seen_ready) >= 2
        assert loop.time() - started >= 2 * RESTART_S * 0.8  # two new pods, one after the other
        assert all(e.spec is not None and e.spec.k_at(5) == 1 for e in serving.all_pods())
        await until(lambda: {g["labels"]["specops_revision"] for g in targets.groups} == {"rev-b"})


async def test_a_refused_config_crash_loops_with_the_engines_message(cluster: EmulatedCluster) -> None:
    bad = {**EAGLE3, "draft_len_schedule": {4: 2, 16: 1}}
    cluster.create("configmaps", config_map("chat-bad", bad), namespace=NAMESPACE)
    cluster.create("deployments", deployment("rev-bad", "chat-bad", replicas=1), namespace=NAMESPACE)
    async with ServingController(cluster, Targets(), restart_s=RESTART_S, poll_s=0.02) as serving:

        def waiting() -> dict[str, Any] | None:
            for pod in pods(cluster):
                for container in (pod.get("status") or {}).get("containerStatuses") or []:
                    state = container.get("state", {}).get("waiting")
                    if state:
                        return dict(state)
            return None

        await until(lambda: waiting() is not None)
        state = waiting()
        assert state is not None
        assert state["reason"] == "CrashLoopBackOff"
        assert "must map to max_draft_len" in state["message"]
        await asyncio.sleep(RESTART_S * 1.5)
        assert not any(ready(p) for p in pods(cluster))
        assert serving.all_pods() == []


async def test_a_missing_config_map_keeps_the_pod_creating_until_it_appears(cluster: EmulatedCluster) -> None:
    cluster.create("deployments", deployment("rev-a", "chat-late", replicas=1), namespace=NAMESPACE)
    async with ServingController(cluster, Targets(), restart_s=0.1, poll_s=0.02) as serving:
        await until(
            lambda: (
                len(pods(cluster)) == 1 and (pods(cluster)[0].get("status") or {}).get("phase") == "Pending"
            )
        )
        message = pods(cluster)[0]["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
        assert 'configmap "chat-late" not found' in message
        cluster.create("configmaps", config_map("chat-late", EAGLE3), namespace=NAMESPACE)
        await until(lambda: len(pods(cluster)) == 1 and ready(pods(cluster)[0]))
        engine = serving.all_pods()[0]
        assert pods(cluster)[0]["spec"]["containers"][0]["ports"][0]["containerPort"] == engine.http_port


async def test_a_lossy_draft_diverges_through_the_controller(cluster: EmulatedCluster) -> None:
    cluster.create("configmaps", config_map("chat-a", EAGLE3), namespace=NAMESPACE)
    cluster.create("deployments", deployment("rev-a", "chat-a", replicas=1), namespace=NAMESPACE)
    drafts = {"v3": DraftBehaviour(alpha=0.7, lossless=False)}
    async with ServingController(cluster, Targets(), drafts=drafts, restart_s=0.0, poll_s=0.02) as serving:
        await until(lambda: len(serving.all_pods()) == 1 and serving.all_pods()[0].ready)
        engine = serving.all_pods()[0]
        assert await engine.complete("hello there", 20, 0.0) != greedy_text("hello there", 20)


def test_rolling_update_bounds() -> None:
    def bounds(surge: Any, unavailable: Any, replicas: int) -> tuple[int, int]:
        return rolling_update_bounds(
            {"spec": {"strategy": {"rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}}},
            replicas,
        )

    assert bounds(None, None, 4) == (1, 1)  # 25 % each
    assert bounds("50%", "10%", 4) == (2, 0)  # surge rounds up, unavailability down
    assert bounds(0, 0, 3) == (0, 1)
    assert bounds(2, 1, 3) == (2, 1)
    assert json.dumps(rolling_update_bounds({"spec": {}}, 1)) == "[1, 0]"


async def test_a_deployment_deleted_and_created_again_under_its_name_gets_new_pods(
    cluster: EmulatedCluster,
) -> None:
    # Given a one-pod Deployment serving (a draft's check pod)
    cluster.create("configmaps", config_map("chat-a", EAGLE3), namespace=NAMESPACE)
    cluster.create("deployments", deployment("rev-a", "chat-a", replicas=1), namespace=NAMESPACE)
    async with ServingController(cluster, Targets(), restart_s=RESTART_S, poll_s=0.02):
        await until(lambda: len(pods(cluster)) == 1 and ready(pods(cluster)[0]))
        first = pods(cluster)[0]["metadata"]["name"]
        # When it is deleted and created again under the same name and template at once, between
        # two of the controller's passes
        cluster.emulator.delete_object(cluster.resource("deployments"), NAMESPACE, "chat")
        cluster.create("deployments", deployment("rev-a", "chat-a", replicas=1), namespace=NAMESPACE)
        # Then the new Deployment gets a pod of its own (the old one went with the old Deployment),
        # ready once its engine started, as a real cluster's would be
        await until(lambda: [p["metadata"]["name"] for p in pods(cluster)] not in ([], [first]), within_s=10)
        assert not ready(pods(cluster)[0])
        await until(lambda: len(pods(cluster)) == 1 and ready(pods(cluster)[0]), within_s=10)
        status = cluster.get("deployments", "chat", NAMESPACE)["status"]  # type: ignore[index]
        assert status["readyReplicas"] == 1 and status["updatedReplicas"] == 1
