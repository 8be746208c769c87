"""The operator's own API requests under API Priority and Fairness: a 429 is honoured fleet-wide.

Against the emulated API server answering 429 with Retry-After, as a shedding API server does.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import kmock
import pytest
import yaml

from specops.adapters.kube import BACKOFF_BASE_S, KubeClient, RetryBudget, Throttle, load_connection_settings
from specops.api.models import API_VERSION, KIND
from specops.ports import KubeApiError
from specops_local.cluster import EmulatedCluster
from tests.conftest import EXAMPLES

NAMESPACE = "default"
RETRY_AFTER_S = 1


class TimedClient(KubeClient):
    """The production client, noting when each request goes on the wire."""

    def __init__(self, cluster: EmulatedCluster) -> None:
        super().__init__(load_connection_settings(str(cluster.kubeconfig_path)))
        self.sent_at: list[float] = []

    async def _send(
        self, method: str, path: str, data: bytes | None, params: Mapping[str, str] | None, content_type: str
    ) -> tuple[int, str, bytes, str | None]:
        self.sent_at.append(time.monotonic())
        return await super()._send(method, path, data, params, content_type)


@pytest.fixture
async def kube(cluster: EmulatedCluster) -> AsyncIterator[TimedClient]:
    client = TimedClient(cluster)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def storm(cluster: EmulatedCluster) -> dict[str, bool]:
    """While `on`, every request for a SpeculativeDeployment answers 429 with Retry-After: 1."""
    switch = {"on": False}

    def matches(request: Any) -> bool:
        return switch["on"] and "/speculativedeployments" in str(request.url)

    body = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "code": 429}
    cluster.emulator[matches] << 429 << kmock.headers({"Retry-After": str(RETRY_AFTER_S)}) << body
    return switch


def resource(name: str) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": NAMESPACE}
    return body


async def test_a_429_storm_is_waited_out_fleet_wide_not_retried_at_every_tick(
    cluster: EmulatedCluster, kube: TimedClient, storm: dict[str, bool]
) -> None:
    # Given two resources whose status is written at every 0.1 s tick (as a busy control loop does)
    names = ["a", "b"]
    for name in names:
        cluster.create("speculativedeployments", resource(name))
    refused: list[int] = []

    async def ticks(name: str, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                patch = {"status": {"phase": "Dynamic"}}
                await kube.patch(API_VERSION, KIND, NAMESPACE, name, patch, subresource="status")
            except KubeApiError as error:
                refused.append(error.status)
            await asyncio.sleep(0.1)

    # When the API server sheds load with 429 and Retry-After: 1 for 4 s
    storm["on"] = True
    started = time.monotonic()
    await asyncio.gather(*(ticks(name, 4.0) for name in names))
    during = [at for at in kube.sent_at if started <= at <= started + 4.0]

    # Then the client sends about one request per Retry-After for the whole fleet, not one per
    # resource and tick (2 x 40 = 80), and never before the server's Retry-After has passed
    print(f"requests during a 4 s storm: {len(during)}, refusals seen by callers: {len(refused)}")
    assert len(during) <= 7, len(during)
    assert refused, "callers learn of the throttling (their next tick tries again)"
    # (the two first requests go together, before any answer said to wait)
    gaps = [later - earlier for earlier, later in itertools.pairwise(during[1:])]
    assert all(gap >= RETRY_AFTER_S * 0.95 for gap in gaps), gaps
    assert set(refused) <= {429}

    # When the storm ends, then writes go through again within a Retry-After and its jitter
    storm["on"] = False
    began = time.monotonic()
    for name in names:
        await kube.patch(
            API_VERSION, KIND, NAMESPACE, name, {"status": {"phase": "Dynamic"}}, subresource="status"
        )
    assert time.monotonic() - began <= RETRY_AFTER_S * 1.5 * 1.5 + 0.5
    live = cluster.get("speculativedeployments", "a")
    assert live is not None and live["status"]["phase"] == "Dynamic"


def test_the_retry_budget_caps_retries_for_the_whole_process() -> None:
    now = [0.0]
    budget = RetryBudget(capacity=3, per_s=0.5, clock=lambda: now[0])
    assert [budget.take() for _ in range(5)] == [True, True, True, False, False]
    now[0] = 2.0  # refills at 0.5 a second
    assert [budget.take() for _ in range(2)] == [True, False]


def test_waits_honour_retry_after_and_back_off_with_jitter_without_one() -> None:
    draws = iter([0.0, 1.0, 0.5, 0.5, 0.5])
    throttle = Throttle(clock=lambda: 100.0, rand=lambda: next(draws))
    # never less than Retry-After, at most half again
    assert throttle.throttled(5.0) == pytest.approx(5.0)
    assert throttle.throttled(5.0) == pytest.approx(7.5)
    throttle.answered()
    # without Retry-After: exponential from the base, each with its jitter
    waits = [throttle.throttled(None) for _ in range(3)]
    assert waits == pytest.approx(
        [BACKOFF_BASE_S * 1.25, BACKOFF_BASE_S * 2 * 1.25, BACKOFF_BASE_S * 4 * 1.25]
    )
