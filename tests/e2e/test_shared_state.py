"""State the operator shares between resources is shared, however Kopf hands out memos.

Kopf gives each resource's handlers a shallow copy of the operator's memo, made when it first
sees the resource. Anything made lazily inside a handler lands in that one resource's copy: the
liveness probe (which Kopf calls with the operator's own memo) would see no resource ticking, and
the bound on concurrent reconciles would be one per resource. The startup handlers put the shared
state on the operator's memo before any resource is seen.
"""

from __future__ import annotations

from typing import Any

import pytest

from specops.adapters.kube import KubeClient
from specops.handlers.control import ticks_on_time
from specops.handlers.lifecycle import live_bodies
from tests.e2e.conftest import Operator, example
from tests.e2e.waiting import eventually

pytestmark = pytest.mark.e2e

NAMES = ("chat-a", "chat-b")


async def test_the_liveness_probe_sees_every_resource_found_at_start(
    cluster: Any, kube: KubeClient, operator_env: None
) -> None:
    # Given two resources that exist before the operator starts (a restart, an upgrade), and
    # nothing probing its liveness until they are found (a kubelet's first probe comes later)
    for name in NAMES:
        body = example()
        body["metadata"]["name"] = name
        await kube.create(body)
    handle = Operator()
    await handle.start()
    try:
        assert handle.run is not None
        memo = handle.run.memo

        async def daemons_running() -> bool:
            return len(live_bodies(memo)) == len(NAMES)

        # the daemons' live bodies, which Deployment events read the owner from, are shared too
        await eventually(daemons_running, timeout_s=20, what="both control daemons' bodies shared")
        # When Kopf probes liveness with the operator's memo, then both resources' ticks are watched
        assert ticks_on_time(memo=memo) == len(NAMES)
    finally:
        await handle.stop()
