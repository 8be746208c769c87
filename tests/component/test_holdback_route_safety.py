"""A holdback on the user's HTTPRoute against the emulated API server, route writes failing on purpose.

The invariant is the canary's: no route the operator manages ever sends users to a holdback
Service that is gone. The holdback's objects are pruned only once the route no longer names its
Service; a deletion takes it out of the route first.
"""

from __future__ import annotations

from typing import Any

import pytest

from specops.adapters.kube import KubeApiError, KubeClient
from specops.adapters.routing import GatewayApiRouter, ReplicaRatioRouter
from specops.api.models import SpeculativeDeployment
from specops.assets import llmapi_model_source
from specops.domain.control_status import revision_to_status
from specops.domain.engines.schedule import PLAIN, Revision, Schedule
from specops.domain.names import HOLDBACK
from specops.domain.render import RenderOptions, render_children
from specops.services.canary import CanaryService, RouteNotReleased
from specops.services.reconciler import Reconciler
from specops_local.cluster import EmulatedCluster
from tests.component.test_canary_route_safety import (
    HTTPROUTE,
    NAME,
    NAMESPACE,
    ROUTE,
    EchoEngines,
    NoMetrics,
    resource_body,
    route,
    route_backends,
)

OPTIONS = RenderOptions(
    triton_model_source=llmapi_model_source(), default_image="tritonserver:test", pod_monitor=False
)
SPECULATING = revision_to_status(
    Revision("spec", "draftModel", "v3@pvc://models/llama-70b-draft/v3", Schedule.constant(3))
).model_dump(by_alias=True, mode="json", exclude_none=True)


def status(*, holdback: bool) -> dict[str, Any]:
    speculation: dict[str, Any] = {
        "controlPhase": "Baseline" if holdback else "Dynamic",
        "phaseSince": "2026-12-01T11:00:00Z",
        "revision": SPECULATING,
    }
    if holdback:
        speculation["holdback"] = {"pods": 1, "since": "2026-12-01T11:00:00Z", "weight": 25}
    return {
        "phase": "Baseline" if holdback else "Dynamic",
        "draft": {"model": "llama-3.1-8b-draft", "version": "v3", "uri": "pvc://models/llama-70b-draft/v3"},
        "speculation": speculation,
    }


async def given_a_holdback_on_the_route(
    cluster: EmulatedCluster, kube: KubeClient, *, ended: bool
) -> tuple[SpeculativeDeployment, Reconciler]:
    body = resource_body("u-1")
    body["spec"]["serving"]["replicas"] = 4
    cluster.create("speculativedeployments", body)
    cluster.patch_status("speculativedeployments", NAME, status(holdback=True))
    cluster.create("httproutes", route({f"{NAME}-stable": 75, f"{NAME}-holdback": 25}))
    reconciler = Reconciler(kube, OPTIONS, routes=GatewayApiRouter(kube))
    live = cluster.get("speculativedeployments", NAME)
    assert live is not None
    held = SpeculativeDeployment.model_validate(live)
    await reconciler.apply(
        render_children(held, OPTIONS, PLAIN, variant=HOLDBACK, replicas=1), live["metadata"]["uid"]
    )
    if ended:
        cluster.patch_status("speculativedeployments", NAME, {"speculation": {"holdback": None}})
        live = cluster.get("speculativedeployments", NAME)
        assert live is not None
    return SpeculativeDeployment.model_validate(live), reconciler


async def test_an_ended_holdback_leaves_the_route_before_its_service_goes(
    cluster: EmulatedCluster, kube: KubeClient, failing_route_writes: dict[str, bool]
) -> None:
    resource, reconciler = await given_a_holdback_on_the_route(cluster, kube, ended=True)
    assert resource.status.speculation.holdback is None
    failing_route_writes["on"] = True
    with pytest.raises(KubeApiError, match="stays until HTTPRoute"):
        await reconciler.roll_stable(resource)
    # the route still names the holdback, so its Service stays
    assert await route_backends(kube) == {f"{NAME}-stable": 75, f"{NAME}-holdback": 25}
    assert await kube.get("v1", "Service", NAMESPACE, f"{NAME}-holdback") is not None

    failing_route_writes["on"] = False
    report = await reconciler.roll_stable(resource)
    assert await route_backends(kube) == {f"{NAME}-stable": 100}
    assert await kube.get("v1", "Service", NAMESPACE, f"{NAME}-holdback") is None
    assert f"Service/{NAME}-holdback" in report.pruned


async def test_deletion_takes_the_holdback_out_of_the_route_first(
    cluster: EmulatedCluster, kube: KubeClient, failing_route_writes: dict[str, bool]
) -> None:
    _, reconciler = await given_a_holdback_on_the_route(cluster, kube, ended=False)
    service = CanaryService(
        kube,
        NoMetrics(),
        EchoEngines(),
        reconciler,
        routers={"GatewayAPI": GatewayApiRouter(kube), "ReplicaRatio": ReplicaRatioRouter()},
        gateway_api=True,
    )
    body = cluster.get("speculativedeployments", NAME)
    assert body is not None
    failing_route_writes["on"] = True
    with pytest.raises(RouteNotReleased, match="deletion waits for the route"):
        await service.release(body)
    failing_route_writes["on"] = False
    events = await service.release(body)
    assert [e.reason for e in events] == ["RouteReleased"]
    assert await route_backends(kube) == {f"{NAME}-stable": 100}
    live = await kube.get(*HTTPROUTE, NAMESPACE, ROUTE)
    assert live is not None and [p["name"] for p in live["spec"]["parentRefs"]] == [
        "gateway"
    ]  # the user's part
