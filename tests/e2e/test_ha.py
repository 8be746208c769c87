"""High availability: two operator replicas, one acting leader, and a failover mid-canary."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
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
    return canary_e2e.create_route(cluster)


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

        async def step_announced() -> bool:
            # Events are posted after the status write; a kill in between loses them (Kopf's posting
            # is best effort), which is not what this test is about.
            return any(e["reason"] == "CanaryStepStarted" for e in await events_for(kube, NAME))

        await eventually(step_announced, timeout_s=10, what="CanaryStepStarted posted")

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
    once = dict.fromkeys(CANARY_REASONS, 1)
    once["LosslessCheckPassed"] = 2  # the first draft's check on a stable pod, then the canary's
    assert {reason: posted[reason] for reason in CANARY_REASONS} == once, posted
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
    # Kopf stops, the Lease is released, a follower takes it at its next try
    assert handover_s <= LeaseTimings().retry_period_s + 2


async def _one_leads(replicas: list[Replica]) -> bool:
    return sum(r.is_leader for r in replicas) == 1


def test_peering_is_refused_loudly() -> None:
    result = CliRunner().invoke(main, ["run", "--peering", "--metrics-port", "0"])
    assert result.exit_code == 2
    assert "--leader-election" in result.output and "not supported" in result.output


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_replica(index: int, port: int, logs: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "specops.cli",
        "run",
        "--leader-election",
        "--lease-namespace",
        NAMESPACE,
    ]
    command += ["--metrics-port", "0", "--liveness", f"http://127.0.0.1:{port}/healthz"]
    with (logs / f"replica-{index}.log").open("wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            command, env={**os.environ, "HOSTNAME": f"pod-{index}"}, stdout=subprocess.DEVNULL, stderr=log
        )


async def _holder(kube: KubeClient) -> str:
    lease = await kube.get("coordination.k8s.io/v1", "Lease", NAMESPACE, "specops-operator")
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


async def test_specops_run_processes_hand_over_on_sigterm_and_on_sigkill(
    cluster: Any, kube: KubeClient, operator_env: None, tmp_path: Path
) -> None:
    """Three `specops run --leader-election` processes, as three pods would run them."""
    ports = [_free_port() for _ in range(3)]
    processes = [_start_replica(index, port, tmp_path) for index, port in enumerate(ports)]
    loop = asyncio.get_running_loop()
    try:
        first = await eventually(lambda: _holder(kube), timeout_s=30, what="a holder")
        leader = int(first.split("_")[0].removeprefix("pod-"))
        # Every replica answers its liveness probe, leader (Kopf) and followers alike
        async with httpx.AsyncClient() as http:
            for port in ports:
                answer = await eventually(
                    lambda port=port: _healthy(http, port), timeout_s=20, what=f"health on {port}"
                )
                assert answer

        # SIGTERM (a rolling update): the leader releases the Lease and a follower takes it at once
        stopped = loop.time()
        processes[leader].send_signal(signal.SIGTERM)
        second = await eventually(
            lambda: _holder_other_than(kube, first), timeout_s=20, what="a new holder after SIGTERM"
        )
        graceful_s = loop.time() - stopped
        assert await asyncio.to_thread(processes[leader].wait, 10) == 0

        # SIGKILL (a lost node): the Lease runs out, then the last replica takes it
        leader = int(second.split("_")[0].removeprefix("pod-"))
        killed = loop.time()
        processes[leader].kill()
        await eventually(
            lambda: _holder_other_than(kube, second), timeout_s=30, what="a holder after SIGKILL"
        )
        crash_s = loop.time() - killed
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            await asyncio.to_thread(process.wait, 15)
    print(f"specops run: handover after SIGTERM {graceful_s:.1f} s, after SIGKILL {crash_s:.1f} s")
    assert graceful_s <= LeaseTimings().retry_period_s + 2
    assert crash_s <= 30


async def _healthy(http: httpx.AsyncClient, port: int) -> bool:
    try:
        return (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
    except httpx.HTTPError:
        return False


async def _holder_other_than(kube: KubeClient, previous: str) -> str:
    holder = await _holder(kube)
    return holder if holder and holder != previous else ""
