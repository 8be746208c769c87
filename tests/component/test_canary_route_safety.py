"""Canary traffic safety against the emulated API server, with route writes failing on purpose.

The invariant: no route the operator manages ever sends users to a canary backend whose
objects are gone. A route write is read back before it counts; a rollback whose route write
fails keeps the canary (objects and status) and tries again next tick; an idle resource
repairs a route that still names the canary; deletion waits for the route.
"""

from __future__ import annotations

from collections.abc import Hashable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import yaml

from specops.adapters.kube import KubeClient
from specops.adapters.routing import GatewayApiRouter, ReplicaRatioRouter
from specops.api.models import SpeculativeDeployment
from specops.assets import llmapi_model_source
from specops.domain.metrics import Measurement
from specops.domain.names import CANARY, child_name
from specops.domain.render import RenderOptions, render_children
from specops.ports import GenerateOutput
from specops.services.canary import CanaryService, RouteNotReleased, canary_revision
from specops.services.reconciler import Reconciler
from specops_local.cluster import EmulatedCluster
from tests.conftest import EXAMPLES

NAME, NAMESPACE, ROUTE = "chat", "default", "chat-route"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
HTTPROUTE = ("gateway.networking.k8s.io/v1", "HTTPRoute")


class NoMetrics:
    def register(self, key: Hashable, url: str, backend: str, interval_s: float) -> None:
        return None

    def unregister(self, key: Hashable) -> None:
        return None

    def lookup(self, *args: Any, **kwargs: Any) -> Measurement:
        return Measurement.failed(T0, "MetricsUnavailable", "no Prometheus in this test")

    async def close(self) -> None:
        return None


class EchoEngines:
    """Engines that answer every prompt with itself (no test here reaches the lossless check)."""

    async def generate(
        self, url: str, backend: str, model: str, prompt: str, max_tokens: int, timeout_s: float
    ) -> GenerateOutput:
        return GenerateOutput(ok=True, text=prompt)

    async def healthy(self, url: str, backend: str, timeout_s: float = 2.0) -> bool:
        return True

    async def close(self) -> None:
        return None


def resource_body(uid: str) -> dict[str, Any]:
    body = yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())
    body["metadata"] = {"name": NAME, "namespace": NAMESPACE, "uid": uid}
    body["spec"]["draft"]["version"] = "v4"
    body["spec"]["draft"]["uri"] = "pvc://models/llama-70b-draft/v4"
    body["spec"]["canary"] = {
        "steps": [{"weight": 10, "pause": "1m"}, {"weight": 50, "pause": "1m"}],
        "trafficRouting": {"gatewayAPI": {"httpRoute": ROUTE}},
    }
    return body


def route(weights: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": HTTPROUTE[0],
        "kind": HTTPROUTE[1],
        "metadata": {"name": ROUTE, "namespace": NAMESPACE},
        "spec": {
            "parentRefs": [{"name": "gateway"}],
            "rules": [
                {"backendRefs": [{"name": svc, "port": 8000, "weight": w} for svc, w in weights.items()]}
            ],
        },
    }


CANARY_STATUS = {
    "phase": "Canary",
    "observedSpecDraft": "v4@pvc://models/llama-70b-draft/v4",
    "draft": {
        "model": "llama-3.1-8b-draft",
        "version": "v3",
        "uri": "pvc://models/llama-70b-draft/v3",
    },
    "speculation": {"controlPhase": "Dynamic", "phaseSince": "2026-12-01T11:00:00Z"},
    "canary": {
        "phase": "Progressing",
        "source": "Spec",
        "draft": {
            "model": "llama-3.1-8b-draft",
            "version": "v4",
            "uri": "pvc://models/llama-70b-draft/v4",
        },
        "startedAt": "2026-12-01T11:50:00Z",
        "step": 0,
        "weight": 10,
        "requestedWeight": 10,
        "stepStartedAt": "2026-12-01T11:55:00Z",
        "trafficRouting": "GatewayAPI",
    },
}


async def given_a_canary(
    cluster: EmulatedCluster, kube: KubeClient
) -> tuple[SpeculativeDeployment, CanaryService]:
    created = cluster.create("speculativedeployments", resource_body("u-1"))
    cluster.patch_status("speculativedeployments", NAME, CANARY_STATUS)
    cluster.create("httproutes", route({f"{NAME}-stable": 90, f"{NAME}-canary": 10}))
    options = RenderOptions(
        triton_model_source=llmapi_model_source(), default_image="tritonserver:test", pod_monitor=False
    )
    reconciler = Reconciler(kube, options)
    live = cluster.get("speculativedeployments", NAME)
    assert live is not None and created is not None
    resource = SpeculativeDeployment.model_validate(live)
    draft = resource.spec.draft
    await reconciler.apply(
        render_children(
            resource,
            options,
            canary_revision(resource, draft),
            variant=CANARY,
            draft=draft,
            replicas=1,
            receives_traffic=True,
        ),
        live["metadata"]["uid"],
    )
    service = CanaryService(
        kube,
        NoMetrics(),
        EchoEngines(),
        reconciler,
        routers={"GatewayAPI": GatewayApiRouter(kube), "ReplicaRatio": ReplicaRatioRouter()},
        gateway_api=True,
    )
    return resource, service


async def route_backends(kube: KubeClient) -> dict[str, int]:
    live = await kube.get(*HTTPROUTE, NAMESPACE, ROUTE)
    assert live is not None
    return {
        ref["name"]: ref.get("weight", 1) for rule in live["spec"]["rules"] for ref in rule["backendRefs"]
    }


async def test_a_rollback_whose_route_write_fails_keeps_the_canary_until_the_route_is_released(
    cluster: EmulatedCluster, kube: KubeClient, failing_route_writes: dict[str, bool]
) -> None:
    # Given a canary at 10 % on the user's HTTPRoute, aborted by a person
    resource, service = await given_a_canary(cluster, kube)
    aborting = resource.model_copy(
        update={"metadata": {**resource.metadata, "annotations": {"specops.dev/canary-action": "abort"}}}
    )

    # When the route write fails
    failing_route_writes["on"] = True
    result = await service.tick(aborting, resource.status, [], T0)

    # Then nothing is deleted and status keeps the canary: users still reach a live canary backend
    assert result.status.canary is not None and result.finished is None
    assert [u.reason for u in result.updates] == ["TrafficSplitFailed"]
    assert await kube.get("apps/v1", "Deployment", NAMESPACE, child_name(NAME, CANARY)) is not None
    assert await kube.get("v1", "Service", NAMESPACE, f"{NAME}-canary") is not None
    assert (await route_backends(kube))[f"{NAME}-canary"] == 10

    # When the API server answers again, then the next tick releases the route, then deletes the canary
    failing_route_writes["on"] = False
    result = await service.tick(aborting, resource.status, [], T0)
    assert result.finished == "RolledBack" and result.status.canary is None
    assert await route_backends(kube) == {f"{NAME}-stable": 100}
    assert await kube.get("apps/v1", "Deployment", NAMESPACE, child_name(NAME, CANARY)) is None


async def test_an_idle_resource_repairs_a_route_that_still_names_the_canary(
    cluster: EmulatedCluster, kube: KubeClient
) -> None:
    # Given no canary runs, but the route still sends 10 % to the canary Service (a lost write)
    resource, service = await given_a_canary(cluster, kube)
    idle = resource.status.model_copy(update={"canary": None, "phase": "Dynamic"})

    # When the resource ticks
    result = await service.tick(resource, idle, [], T0)

    # Then the route is repaired, with a Warning Event; a second tick finds nothing to repair
    assert await route_backends(kube) == {f"{NAME}-stable": 100}
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "RouteRepaired")]
    again = await service.tick(resource, idle, [], T0)
    assert again.events == []


async def test_an_action_set_while_no_canary_runs_is_removed_from_the_resource(
    cluster: EmulatedCluster, kube: KubeClient
) -> None:
    # Given the spec draft serves, no canary runs, and someone set specops.dev/canary-action: abort
    _, service = await given_a_canary(cluster, kube)
    await kube.patch(
        "specops.dev/v1alpha1",
        "SpeculativeDeployment",
        NAMESPACE,
        NAME,
        {"metadata": {"annotations": {"specops.dev/canary-action": "abort"}}},
        content_type="application/merge-patch+json",
    )
    live = SpeculativeDeployment.model_validate(cluster.get("speculativedeployments", NAME))
    v4 = live.status.canary.draft if live.status.canary is not None else None
    idle = live.status.model_copy(update={"canary": None, "phase": "Dynamic", "draft": v4})

    # When it ticks
    result = await service.tick(live, idle, [], T0)

    # Then the annotation is gone from the resource, unacted on, and a Warning Event says so
    stored = cluster.get("speculativedeployments", NAME) or {}
    assert "specops.dev/canary-action" not in (stored["metadata"].get("annotations") or {})
    assert ("Warning", "CanaryActionIgnored") in [(e.type, e.reason) for e in result.events]
    assert result.status.canary is None


async def test_deletion_waits_while_the_route_cannot_be_released(
    cluster: EmulatedCluster, kube: KubeClient, failing_route_writes: dict[str, bool]
) -> None:
    _resource, service = await given_a_canary(cluster, kube)
    body = cluster.get("speculativedeployments", NAME)
    assert body is not None
    failing_route_writes["on"] = True
    with pytest.raises(RouteNotReleased):
        await service.release(body)
    failing_route_writes["on"] = False
    events = await service.release(body)
    assert [e.reason for e in events] == ["RouteReleased"]
    assert await route_backends(kube) == {f"{NAME}-stable": 100}


async def test_a_route_write_is_confirmed_only_by_reading_it_back(
    cluster: EmulatedCluster, kube: KubeClient
) -> None:
    # Given an API server that answers the PATCH with success but does not store it
    await given_a_canary(cluster, kube)

    def swallow(request: Any) -> bool:
        return request.method == "PATCH" and "/httproutes/" in str(request.url)

    cluster.emulator[swallow] << httpx.codes.OK  # an empty 200: nothing stored
    result = await GatewayApiRouter(kube).set_route_weight(
        NAMESPACE, ROUTE, f"{NAME}-stable", f"{NAME}-canary", 50
    )

    # Then the write does not count
    assert not result.ok and "not confirmed" in result.message
    assert (await route_backends(kube))[f"{NAME}-canary"] == 10


async def test_a_route_that_never_named_the_canary_does_not_hold_deletion(
    cluster: EmulatedCluster, kube: KubeClient
) -> None:
    # Given a canary whose HTTPRoute names neither of its Services (a typo: the obvious name
    # "llama-3.1-70b-stable" instead of the derived "chat-stable")
    await given_a_canary(cluster, kube)
    cluster.emulator.patch_object(
        cluster.resource("httproutes"),
        NAMESPACE,
        ROUTE,
        {"spec": route({"llama-3.1-70b-stable": 100})["spec"]},
    )
    body = cluster.get("speculativedeployments", NAME)
    assert body is not None

    # When the resource is deleted, then nothing waits: no user reaches the canary through it
    events = await service_of(cluster, kube).release(body)
    assert [(e.type, e.reason) for e in events] == [("Normal", "RouteReleased")]
    assert "nothing to release" in events[0].message
    # And the user's route is left as it was
    assert await route_backends(kube) == {"llama-3.1-70b-stable": 100}


async def test_a_route_that_cannot_be_released_holds_deletion_only_for_a_bounded_time_and_says_why(
    cluster: EmulatedCluster, kube: KubeClient
) -> None:
    # Given a canary on a route the operator may no longer read (RBAC changed: 403)
    _resource, service = await given_a_canary(cluster, kube)

    def forbidden(request: Any) -> bool:
        return "/httproutes/" in str(request.url)

    cluster.emulator[forbidden] << 403
    body = cluster.get("speculativedeployments", NAME)
    assert body is not None

    # When deletion starts, then it waits, and status says why and for how long
    with pytest.raises(RouteNotReleased):
        await service.release(body, now=T0, waited_s=0)
    live = cluster.get("speculativedeployments", NAME)
    assert live is not None
    degraded = {c["type"]: c for c in live["status"]["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "RouteNotReleased")
    assert ROUTE in degraded["message"] and "300" in degraded["message"]

    # When it has waited the bound, then deletion goes on, with a Warning naming the route
    events = await service.release(body, now=T0, waited_s=301)
    assert [(e.type, e.reason) for e in events] == [("Warning", "RouteReleaseAbandoned")]
    assert ROUTE in events[0].message and f"{NAME}-canary" in events[0].message


def service_of(cluster: EmulatedCluster, kube: KubeClient) -> CanaryService:
    options = RenderOptions(
        triton_model_source=llmapi_model_source(), default_image="tritonserver:test", pod_monitor=False
    )
    return CanaryService(
        kube,
        NoMetrics(),
        EchoEngines(),
        Reconciler(kube, options),
        routers={"GatewayAPI": GatewayApiRouter(kube), "ReplicaRatio": ReplicaRatioRouter()},
        gateway_api=True,
    )


async def test_a_pending_first_check_applies_its_check_pod_once_until_its_inputs_move(
    cluster: EmulatedCluster, kube: KubeClient
) -> None:
    # Given a resource whose first draft waits for its check pod
    cluster.create("speculativedeployments", resource_body("u-1"))
    live = cluster.get("speculativedeployments", NAME)
    assert live is not None
    resource = SpeculativeDeployment.model_validate(live)
    service = service_of(cluster, kube)
    gets: list[str] = []

    def counted(request: Any) -> bool:
        if request.method == "GET" and "/deployments/" in str(request.url):
            gets.append(str(request.url))
        return False

    cluster.emulator[counted] << 200  # never answers: only counts
    draft = resource.spec.draft
    await service._apply_check_pod(resource, draft, T0)
    assert any(d["metadata"]["name"].endswith("-canary") for d in cluster.objects("deployments", NAMESPACE))
    first = len(gets)
    # When ticks come while nothing it is rendered from moved, nothing is read or written again
    for second in range(1, 30):
        await service._apply_check_pod(resource, draft, T0 + timedelta(seconds=second))
    assert len(gets) == first
    # Then a minute on it is applied again (a pod deleted by hand comes back), and a new spec at once
    await service._apply_check_pod(resource, draft, T0 + timedelta(seconds=61))
    assert len(gets) > first
    moved = SpeculativeDeployment.model_validate({**live, "metadata": {**live["metadata"], "generation": 2}})
    before = len(gets)
    await service._apply_check_pod(moved, draft, T0 + timedelta(seconds=62))
    assert len(gets) > before
