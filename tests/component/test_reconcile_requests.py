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
from tests.component.test_tick_requests import NAME, NAMESPACE, _resource, counted_services

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CHILD_KINDS = ("deployments", "services", "configmaps")


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

    created = [e for e in events if e.startswith("ChildCreated")]
    assert len(created) >= 3, events  # the model repository, the Deployment, the Services
    # one read: readiness reads the Deployment it created; nothing to prune either
    assert sum(first[f"GET {kind}"] + first[f"LIST {kind}"] for kind in CHILD_KINDS) == 1, dict(first)
    assert sum(first[f"POST {kind}"] for kind in CHILD_KINDS) == len(created), dict(first)

    # Reconciled once, the next reconcile reads and compares instead of creating
    again, events = await _reconcile_counted(cluster)
    assert not [e for e in events if e.startswith("ChildCreated")], events
    assert sum(again[f"GET {kind}"] for kind in CHILD_KINDS) >= len(created), dict(again)
    assert sum(again[f"LIST {kind}"] for kind in CHILD_KINDS) == len(CHILD_KINDS), dict(again)  # prune
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
