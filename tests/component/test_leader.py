"""Lease leader election against the emulated API server: one holder, takeover, step-down."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kmock
import kopf
import pytest

from specops.adapters.kube import KubeClient
from specops.adapters.leader import LEASE_API, LEASE_KIND, LeadershipLost, LeaseElector, LeaseTimings, lead
from specops.handlers.lifecycle import login
from specops.ports import KubeApiError

FAST = LeaseTimings(lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.5)
NAME = "specops-operator"
HANDLED = "kopf.zalando.org/last-handled-configuration"
"""What Kopf writes on an object once its create handlers succeeded."""


def elector(kube: KubeClient, identity: str) -> LeaseElector:
    return LeaseElector(kube, namespace="default", identity=identity, timings=FAST)


async def test_one_holder_at_a_time_and_a_release_hands_over_at_once(cluster: Any, kube: KubeClient) -> None:
    a, b = elector(kube, "a"), elector(kube, "b")
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    assert await a.try_acquire_or_renew()  # renewal
    await a.release()
    assert await b.try_acquire_or_renew()
    lease = await kube.get(LEASE_API, LEASE_KIND, "default", NAME)
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"


async def test_a_crashed_holder_is_replaced_after_the_lease_duration(cluster: Any, kube: KubeClient) -> None:
    a, b = elector(kube, "a"), elector(kube, "b")
    assert await a.try_acquire_or_renew()
    a.abandon()  # killed: it never writes again
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(b.acquire(), timeout=10)
    waited = loop.time() - started
    assert FAST.lease_duration_s <= waited <= FAST.lease_duration_s + 2 * FAST.retry_period_s
    lease = await kube.get(LEASE_API, LEASE_KIND, "default", NAME)
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1


async def _run_until_lost(leader: LeaseElector) -> tuple[asyncio.Event, asyncio.Task[None]]:
    started, stopped = asyncio.Event(), asyncio.Event()

    async def operate(stop_flag: asyncio.Event) -> None:
        started.set()  # lead() runs the operator only once the Lease is held
        await stop_flag.wait()
        stopped.set()

    task = asyncio.ensure_future(lead(leader, operate, stop_grace_s=1.0))
    await asyncio.wait_for(started.wait(), timeout=10)
    assert leader.is_leader
    return stopped, task


async def test_a_leader_that_cannot_renew_steps_down_before_the_lease_expires(
    cluster: Any, kube: KubeClient
) -> None:
    leader = elector(kube, "a")
    stopped, task = await _run_until_lost(leader)
    cluster.emulator[kmock.method.PATCH, kmock.resource("coordination.k8s.io", "v1", "leases")] << 503
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LeadershipLost, match="not renewed"):
        await asyncio.wait_for(task, timeout=10)
    # The operator was told to stop within the renew deadline: before anyone else may take the Lease
    assert stopped.is_set()
    assert loop.time() - started < FAST.lease_duration_s


async def test_a_leader_whose_lease_was_taken_steps_down(cluster: Any, kube: KubeClient) -> None:
    leader = elector(kube, "a")
    stopped, task = await _run_until_lost(leader)
    await kube.patch(LEASE_API, LEASE_KIND, "default", NAME, {"spec": {"holderIdentity": "intruder"}})
    with pytest.raises(LeadershipLost, match="held by another replica"):
        await asyncio.wait_for(task, timeout=10)
    assert stopped.is_set()


class FrozenClock:
    """A monotonic clock that can jump, as a process's does when it was stopped and resumed."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


async def test_a_leader_resumed_past_its_renew_deadline_writes_nothing_more(
    cluster: Any, kube: KubeClient
) -> None:
    clock = FrozenClock()
    leader = LeaseElector(kube, namespace="default", identity="a", timings=FAST, clock=clock)
    deposed, wrote = asyncio.Event(), asyncio.Event()
    writes: list[tuple[bool, str]] = []  # (after the freeze, what came of the write)
    await kube.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "state", "namespace": "default"}}
    )

    async def operate(stop_flag: asyncio.Event) -> None:
        """A tick writing status and Events as fast as it can, until it is stopped."""
        tick = 0
        while not stop_flag.is_set():
            tick += 1
            after = deposed.is_set()
            try:
                await kube.patch("v1", "ConfigMap", "default", "state", {"data": {"tick": str(tick)}})
                await kube.create(
                    {
                        "apiVersion": "v1",
                        "kind": "Event",
                        "metadata": {"name": f"state.{tick}", "namespace": "default"},
                        "involvedObject": {"kind": "ConfigMap", "name": "state", "namespace": "default"},
                        "reason": "Tick",
                        "message": str(tick),
                    }
                )
            except KubeApiError as refused:
                writes.append((after, refused.reason))
            else:
                writes.append((after, "sent"))
                wrote.set()
            await asyncio.sleep(0.01)

    task = asyncio.ensure_future(lead(leader, operate, stop_grace_s=1.0))
    await asyncio.wait_for(wrote.wait(), timeout=10)
    # frozen past the Lease: its clock jumps, and another replica took the Lease meanwhile
    clock.offset += FAST.lease_duration_s + 1.0
    deposed.set()
    await kube.patch(LEASE_API, LEASE_KIND, "default", NAME, {"spec": {"holderIdentity": "b"}})
    with pytest.raises(LeadershipLost):
        await asyncio.wait_for(task, timeout=10)
    before = [outcome for after, outcome in writes if not after]
    after = [outcome for after, outcome in writes if after]
    assert before and set(before) == {"sent"}
    assert after and set(after) == {"NotLeader"}, f"a deposed leader wrote {after.count('sent')} more time(s)"
    state = await kube.get("v1", "ConfigMap", "default", "state")
    assert state is not None and state["data"]["tick"] == str(len(before))


async def test_kopfs_own_writes_stop_at_the_renew_deadline_too(cluster: Any, kube: KubeClient) -> None:
    # Given a leader running Kopf through specops' login (its session), with a handler under way
    clock = FrozenClock()
    leader = LeaseElector(kube, namespace="default", identity="a", timings=FAST, clock=clock)
    deposed = asyncio.Event()
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login)

    @kopf.on.create("v1", "configmaps", registry=registry)
    async def created(body: kopf.Body, **_: Any) -> None:
        if body["metadata"]["name"] == "after":
            await deposed.wait()  # returns only once the leader is deposed
        kopf.info(body, reason="Handled", message="posted by Kopf")

    @kopf.on.delete("v1", "configmaps", registry=registry)
    async def deleted(**_: Any) -> None:
        pass

    async def operate(stop_flag: asyncio.Event) -> None:
        await kopf.operator(registry=registry, namespaces=["default"], standalone=True, stop_flag=stop_flag)

    task = asyncio.ensure_future(lead(leader, operate, stop_grace_s=2.0))
    for name in ("before", "after"):
        await kube.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})

    async def handled(name: str) -> bool:
        found = await kube.get("v1", "ConfigMap", "default", name) or {}
        return HANDLED in (found.get("metadata", {}).get("annotations") or {})

    async def finalized(name: str) -> bool:
        found = await kube.get("v1", "ConfigMap", "default", name) or {}
        return bool(found.get("metadata", {}).get("finalizers"))

    async def posted() -> set[str]:
        return {e["involvedObject"]["name"] for e in await kube.list("v1", "Event", "default")}

    async with asyncio.timeout(15):
        while not (await handled("before") and await finalized("after") and await posted()):  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    # When it is frozen past its Lease (its clock jumps, another replica takes the Lease) and its
    # handler then completes
    clock.offset += FAST.lease_duration_s + 1.0
    await kube.patch(LEASE_API, LEASE_KIND, "default", NAME, {"spec": {"holderIdentity": "b"}})
    deposed.set()

    # Then Kopf records nothing more (no progress annotation, no Event), and the operator steps down
    with pytest.raises(LeadershipLost):
        await asyncio.wait_for(task, timeout=10)
    assert not await handled("after")
    assert await posted() == {"before"}
