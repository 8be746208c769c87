"""High availability: two operator replicas, one acting leader, and a failover mid-canary."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import kopf
import pytest
from click.testing import CliRunner

from specops.adapters.kube import KubeClient
from specops.adapters.leader import LeaseTimings
from specops.cli import main
from specops_local.kopf_runner import Replica
from specops_local.prometheus import PrometheusProcess
from specops_local.serving import DraftBehaviour, ServingController
from specops_local.sim import LoadPoint
from tests.e2e import test_canary as canary_e2e
from tests.e2e.conftest import NAMESPACE
from tests.e2e.waiting import events_for, eventually, resource, wait_condition

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only]

NAME = canary_e2e.NAME
CANARY_REASONS = ("CanaryStarted", "LosslessCheckPassed", "CanaryStepStarted", "CanaryPromoted")


@pytest.fixture
def serving_load() -> LoadPoint:
    return LoadPoint(batch=16, alpha=0.75)


@pytest.fixture
def draft_behaviours() -> dict[str, DraftBehaviour]:
    return canary_e2e.DRAFTS


@pytest.fixture
def route(cluster: Any) -> dict[str, Any]:
    return canary_e2e.route.__wrapped__(cluster)  # type: ignore[attr-defined]


async def test_the_leader_is_killed_mid_canary_and_the_other_replica_finishes_it(
    cluster: Any,
    kube: KubeClient,
    operator_env: None,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    # Given two replicas as the chart runs them: one leads, the other follows
    first, second = Replica(kopf.get_default_registry(), identity="specops-a"), None
    await first.start()
    await first.wait_leading(timeout_s=20)
    second = Replica(kopf.get_default_registry(), identity="specops-b")
    await second.start()
    try:
        await kube.create(
            canary_e2e.canary_resource(
                prometheus, steps=[{"weight": 25, "pause": "20s"}, {"weight": 100, "pause": "1s"}]
            )
        )
        await canary_e2e.serving_ready(kube)
        assert not second.is_leader
        await canary_e2e.new_draft(kube, "v4")
        await eventually(lambda: _canary_phase(kube, "Progressing"), timeout_s=40, what="canary progressing")

        # When the leader's pod is killed mid-canary (its Lease stays held until it expires)
        killed = asyncio.get_running_loop().time()
        await first.crash()
        await second.wait_leading(timeout_s=30)
        failover_s = asyncio.get_running_loop().time() - killed

        # Then the other replica takes over within 30 s and finishes the same canary
        body = await wait_condition(kube, NAME, "CanaryRollout", "False", "CanaryPromoted", timeout_s=90)
    finally:
        await second.stop()
        await first.stop()
    print(f"failover after a killed leader: {failover_s:.1f} s")
    assert failover_s <= 30
    assert body["status"]["draft"]["version"] == "v4"
    lease = await kube.get("coordination.k8s.io/v1", "Lease", NAMESPACE, "specops-operator")
    assert lease is not None and (lease["spec"].get("leaseTransitions") or 0) >= 1
    # And every canary Event was posted once, not once per replica
    events = await events_for(kube, NAME)
    posted = collections.Counter(e["reason"] for e in events)
    assert {reason: posted[reason] for reason in CANARY_REASONS} == dict.fromkeys(CANARY_REASONS, 1), posted
    created = collections.Counter(e["message"] for e in events if e["reason"] == "ChildCreated")
    assert set(created.values()) == {1}, created  # each child object created (and announced) once


async def _canary_phase(kube: KubeClient, phase: str) -> bool:
    live = await resource(kube, NAME)
    return ((live or {}).get("status", {}).get("canary") or {}).get("phase") == phase


async def test_replicas_started_together_elect_exactly_one_leader_at_once(
    cluster: Any, kube: KubeClient, operator_env: None
) -> None:
    replicas = [Replica(kopf.get_default_registry(), identity=f"specops-{i}") for i in range(3)]
    started = asyncio.get_running_loop().time()
    await asyncio.gather(*(replica.start() for replica in replicas))
    try:
        await eventually(
            lambda: _one_leads(replicas), timeout_s=10, what="one replica leading"
        )  # no pause: the first to write the Lease leads
        elected_s = asyncio.get_running_loop().time() - started
        await asyncio.sleep(3 * LeaseTimings().retry_period_s)
        assert [r.identity for r in replicas if r.is_leader] == [
            r.identity for r in replicas if r.ready.is_set()
        ]  # the followers never started Kopf
        assert sum(r.is_leader for r in replicas) == 1
        leader = next(r for r in replicas if r.is_leader)

        # When the leader stops gracefully (a rolling update), then it hands over within a retry period
        stopped = asyncio.get_running_loop().time()
        await leader.stop()
        await eventually(lambda: _one_leads(replicas), timeout_s=10, what="another replica leading")
        handover_s = asyncio.get_running_loop().time() - stopped
    finally:
        for replica in replicas:
            await replica.stop()
    print(f"first election: {elected_s:.1f} s; graceful handover: {handover_s:.1f} s")
    assert handover_s <= 10  # Kopf stops, releases the Lease, a follower takes it at its next try


async def _one_leads(replicas: list[Replica]) -> bool:
    return sum(r.is_leader for r in replicas) == 1


def test_peering_is_refused_loudly() -> None:
    result = CliRunner().invoke(main, ["run", "--peering", "--metrics-port", "0"])
    assert result.exit_code == 2
    assert "--leader-election" in result.output and "not supported" in result.output
