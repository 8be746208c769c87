"""API requests of a reconcile, counted on the wire against the emulated API server.

Thousands of new resources reconcile at start-up: a resource never reconciled creates its
children straight away (no GET of each first), while one reconciled before reads and compares
them. An object that already exists under a child's name, owned by nobody, is reported and left
alone either way.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from specops_local.cluster import EmulatedCluster
from tests.component.test_tick_requests import NAME, NAMESPACE, _ready_pods, _resource, counted_services

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CHILD_KINDS = ("deployments", "services", "configmaps")
RESOURCE_PATH = f"/apis/specops.dev/v1alpha1/namespaces/{NAMESPACE}/speculativedeployments/{NAME}"
STATUS_PATH = f"{RESOURCE_PATH}/status"


def _classify(method: str, path: str) -> str:
    """POST <kind>, GET <kind> (one object by name), LIST <kind>, or the method and path."""
    parts = path.rstrip("/").split("/")
    if method == "POST" and parts[-1] in CHILD_KINDS:
        return f"POST {parts[-1]}"
    if method == "GET" and parts[-1] in CHILD_KINDS:
        return f"LIST {parts[-1]}"
    if method == "GET" and len(parts) > 1 and parts[-2] in CHILD_KINDS:
        return f"GET {parts[-2]}"
    return f"{method} {path}"


async def _reconcile_counted(cluster: EmulatedCluster) -> tuple[Counter[str], list[str]]:
    services, counts = await counted_services(cluster, _classify)
    try:
        body = cluster.get("speculativedeployments", NAME)
        assert body is not None
        events = await services.reconciler.reconcile(body, T0)
    finally:
        await services.close()
    return counts, [f"{e.reason} {e.message}" for e in events]


async def test_a_new_resource_creates_its_children_without_reading_them_first(
    cluster: EmulatedCluster, operator_env: None
) -> None:
    cluster.create("speculativedeployments", _resource())

    first, events = await _reconcile_counted(cluster)

    # one Event names every child created: the model repository, the Deployment, the Services
    announced = [e for e in events if e.startswith("ChildCreated")]
    assert len(announced) == 1, events
    created = announced[0].removeprefix("ChildCreated created ").split(", ")
    assert len(created) >= 3 and f"Deployment/{NAME}" in created, created
    # no read at all: readiness judges the Deployment the create returned; nothing to prune either
    assert sum(first[f"GET {kind}"] + first[f"LIST {kind}"] for kind in CHILD_KINDS) == 0, dict(first)
    assert sum(first[f"POST {kind}"] for kind in CHILD_KINDS) == len(created), dict(first)

    # Reconciled once, the next reconcile reads and compares instead of creating
    again, events = await _reconcile_counted(cluster)
    assert not [e for e in events if e.startswith("ChildCreated")], events
    assert sum(again[f"GET {kind}"] for kind in CHILD_KINDS) >= len(created), dict(again)
    # prune: the stable and the holdback variant, each kind listed once
    assert sum(again[f"LIST {kind}"] for kind in CHILD_KINDS) == 2 * len(CHILD_KINDS), dict(again)
    assert not [kind for kind in again if kind.startswith("POST ")], dict(again)


async def test_an_object_in_the_way_of_a_new_resource_is_reported_and_left_alone(
    cluster: EmulatedCluster, operator_env: None
) -> None:
    cluster.create("speculativedeployments", _resource())
    stranger = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"team": "other"}},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "other"}},
    }
    cluster.create("services", stranger)

    _, events = await _reconcile_counted(cluster)

    assert any(e.startswith("ChildConflict") and f"Service/{NAME}" in e for e in events), events
    left = cluster.get("services", NAME)
    assert left is not None and left["spec"]["selector"] == {"app": "other"}
    assert left["metadata"].get("ownerReferences") in (None, [])


async def test_a_deployment_event_refreshes_its_owner_from_what_the_operator_holds(
    cluster: EmulatedCluster, operator_env: None
) -> None:
    # Given a reconciled resource whose Deployment's pods just became ready (the event's body)
    cluster.create("speculativedeployments", _resource())
    await _reconcile_counted(cluster)
    _ready_pods(cluster)
    (deployment,) = [d for d in cluster.objects("deployments", NAMESPACE) if d["metadata"]["name"] == NAME]
    owner = cluster.get("speculativedeployments", NAME)
    assert owner is not None

    # When the event's handler refreshes the owner with the daemon's live body and the Deployment
    services, counts = await counted_services(cluster, _classify)
    try:
        await services.reconciler.refresh(NAMESPACE, NAME, T0, owner=owner, deployment=deployment)
    finally:
        await services.close()

    # Then the owner is Ready, written with one status patch and not one read
    status = (cluster.get("speculativedeployments", NAME) or {})["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True", status
    assert dict(counts) == {f"PATCH {STATUS_PATH}": 1}, dict(counts)


async def test_a_stale_owner_costs_a_conflict_and_a_read_never_the_write(
    cluster: EmulatedCluster, operator_env: None
) -> None:
    # Given the operator's copy of the owner, older than the stored one
    cluster.create("speculativedeployments", _resource())
    stale = cluster.get("speculativedeployments", NAME)
    await _reconcile_counted(cluster)  # writes status: the stored resourceVersion moves on
    _ready_pods(cluster)
    (deployment,) = [d for d in cluster.objects("deployments", NAMESPACE) if d["metadata"]["name"] == NAME]

    services, counts = await counted_services(cluster, _classify)
    try:
        await services.reconciler.refresh(NAMESPACE, NAME, T0, owner=stale, deployment=deployment)
    finally:
        await services.close()

    # Then the write was refused once (409), the owner read, and Ready written all the same
    status = (cluster.get("speculativedeployments", NAME) or {})["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True", status
    assert counts[f"PATCH {STATUS_PATH}"] == 2 and counts[f"GET {RESOURCE_PATH}"] == 1, dict(counts)
