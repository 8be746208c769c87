"""A hung pod never holds its resource's decisions longer than one interval.

The canary of draft v4 runs its lossless check through the real engine client: the stable pods'
engine is a real HTTP server on 127.0.0.1 answering greedily, the canary pod's is one that
accepts connections and never answers. The production tick runs against the emulated API server,
one after the other as a daemon would run them: every tick (its decisions and their write) ends
within one interval of wall time, although a call to the hung pod may wait the engine deadline,
three intervals. The hung pod is asked once, not at every tick, and
the canary ends rolled back naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import timedelta

from aiohttp import web

from specops.adapters.engine_client import EngineHttpClient
from specops.domain.canary_rollout import LOSSLESS_ATTEMPTS
from specops.domain.names import CANARY
from specops.services.container import Services
from specops_local.cluster import EmulatedCluster
from tests.component.test_canary_fault_table import (
    NAME,
    NAMESPACE,
    T0,
    LosslessEngines,
    VariantMetrics,
    new_draft_v4,
    rewire,
    services,
    serving_v3,
    sync_workloads,
)

__all__ = ["services"]  # the fixture

INTERVAL_S = 2.0
ENGINE_DEADLINE_S = 6.0
"""Three intervals: before the fix, every tick of the check waited this long on the hung pod."""


@contextlib.asynccontextmanager
async def engine(hung: bool) -> AsyncIterator[tuple[int, list[str]]]:
    """A real engine on 127.0.0.1 (its port, and the requests it got): greedy, or never answering."""
    asked: list[str] = []
    never = asyncio.Event()

    async def generate(request: web.Request) -> web.Response:  # Triton's, the example's backend
        asked.append(request.path)
        body = await request.json()
        if hung:
            await never.wait()
        return web.json_response({"text_output": f"greedy {body['text_input']}"})

    async def health(request: web.Request) -> web.Response:
        asked.append(request.path)
        if hung:
            await never.wait()
        return web.Response()

    app = web.Application()
    app.router.add_post("/v2/models/tensorrt_llm/generate", generate)
    app.router.add_get("/v2/models/tensorrt_llm/ready", health)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], asked
    finally:
        never.set()
        await runner.cleanup()


def address_pods(cluster: EmulatedCluster, stable_port: int, canary_port: int) -> None:
    """The pods the workloads made, served by the real engines on 127.0.0.1 (as simulated pods are)."""
    for pod in cluster.objects("pods", NAMESPACE):
        canary = (pod["metadata"].get("labels") or {}).get("specops.dev/variant") == CANARY
        port = canary_port if canary else stable_port
        if (pod.get("status") or {}).get("podIP") == "127.0.0.1":
            continue
        containers = [{"name": "engine", "ports": [{"name": "http", "containerPort": port}]}]
        cluster.emulator.patch_object(
            cluster.resource("pods"), NAMESPACE, pod["metadata"]["name"], {"spec": {"containers": containers}}
        )
        cluster.patch_status("pods", pod["metadata"]["name"], {"podIP": "127.0.0.1"})


async def test_a_hung_canary_pod_never_holds_the_resource_s_ticks_past_one_interval(
    cluster: EmulatedCluster, services: Services
) -> None:
    rewire(services, VariantMetrics(canary_alpha=0.8), LosslessEngines(cluster))
    services.canary.engine_deadline_s = ENGINE_DEADLINE_S
    engines = EngineHttpClient()
    async with engine(hung=False) as (stable_port, _), engine(hung=True) as (canary_port, hung_asked):
        now = T0
        try:
            now = await serving_v3(cluster, services, now)  # its first draft checked, then real engines
            services.canary.engines = engines
            live = cluster.get("speculativedeployments", NAME)
            assert live is not None
            spec = dict(live["spec"])
            spec["metrics"] = {**spec["metrics"], "interval": f"{INTERVAL_S:g}s"}
            cluster.emulator.patch_object(
                cluster.resource("speculativedeployments"), NAMESPACE, NAME, {"spec": spec}
            )
            new_draft_v4(cluster)
            durations: list[float] = []
            ended = None
            for _ in range(LOSSLESS_ATTEMPTS + 3 * int(ENGINE_DEADLINE_S / INTERVAL_S) + 5):
                sync_workloads(cluster)
                address_pods(cluster, stable_port, canary_port)
                now += timedelta(seconds=INTERVAL_S)
                started = time.monotonic()
                await services.tick(NAMESPACE, NAME, lambda at=now: at)
                durations.append(time.monotonic() - started)
                resource = cluster.get("speculativedeployments", NAME)
                assert resource is not None
                if resource["status"].get("canary") is None and durations[1:]:
                    ended = resource["status"]
                    break
        finally:
            await engines.close()
    assert max(durations) < INTERVAL_S, f"ticks took {[round(d, 2) for d in durations]} s"
    assert ended is not None, "the canary of a hung pod never ended"
    assert hung_asked == ["/v2/models/tensorrt_llm/generate"], "a pod known hung was asked again"
    rollout = next(c for c in ended["conditions"] if c["type"] == "CanaryRollout")
    assert "did not answer within 6 s" in rollout["message"], rollout
    assert ended["draft"]["version"] == "v3", ended["draft"]
