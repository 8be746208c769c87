"""A revision whose rollout write failed reaches the stable Deployment at a later tick.

The revision is written to status first (the source of truth), then the stable Deployment is
rendered from it; when that second write fails (an API error, a 503 storm), nothing else would
ever render it again until the spec changed: the pods would keep the old revision while status
names the new one."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from specops.ports import KubeApiError
from specops_local.cluster import EmulatedCluster
from tests.component.test_tick_requests import NAME, NAMESPACE, T0, _ready_pods, counted_services, serve


def _stable_revision(cluster: EmulatedCluster) -> str:
    deployment = cluster.get("deployments", NAME)
    assert deployment is not None
    return str(deployment["spec"]["template"]["metadata"]["labels"]["specops.dev/revision"])


def _status_revision(cluster: EmulatedCluster) -> str | None:
    body = cluster.get("speculativedeployments", NAME)
    revision = ((body or {}).get("status") or {}).get("speculation", {}).get("revision") or {}
    return revision.get("digest")


async def test_a_rollout_that_failed_to_render_is_tried_again_until_the_pods_follow(
    cluster: EmulatedCluster, operator_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a resource leaving its plain baseline, whose first rollout write fails twice
    services, _ = await counted_services(cluster)
    reconciler = services.canary.reconciler
    real = reconciler.roll_stable
    failures = {"left": 2, "calls": 0}

    async def flaky(resource: Any) -> Any:
        failures["calls"] += 1
        if failures["left"]:
            failures["left"] -= 1
            raise KubeApiError(503, "ServiceUnavailable", "the API server is shedding load")
        return await real(resource)

    monkeypatch.setattr(reconciler, "roll_stable", flaky)
    try:
        await serve(cluster, services)
        now = T0
        plain = _stable_revision(cluster)
        changed_at = None
        for second in range(1, 30):
            now += timedelta(seconds=1)
            await services.tick(NAMESPACE, NAME, lambda at=now: at)
            _ready_pods(cluster)
            if changed_at is None and _status_revision(cluster) not in (None, plain):
                changed_at = second
            if changed_at is not None and _stable_revision(cluster) == _status_revision(cluster):
                break
    finally:
        await services.close()

    # Then status named the new revision first, the two failed renders were tried again at the
    # next ticks, and the stable Deployment runs what status names
    assert changed_at is not None, "the baseline never ended"
    assert failures["calls"] >= 3
    assert _stable_revision(cluster) == _status_revision(cluster) != plain
