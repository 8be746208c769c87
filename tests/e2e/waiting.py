"""Poll-with-deadline helpers for end-to-end tests (no sleeps as synchronisation)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from specops.adapters.kube import KubeClient
from specops.api.models import API_VERSION, KIND

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout_s: float = 15.0, interval_s: float = 0.1, what: str = ""
) -> T:
    """Await `probe()` until it returns something truthy; fail with the last value after the deadline."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: Any = None
    while True:
        last = await probe()
        if last:
            return last
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s}s waiting for {what or probe}; last value: {last!r}"
            )
        await asyncio.sleep(interval_s)


async def resource(kube: KubeClient, name: str, namespace: str = "default") -> dict[str, Any] | None:
    return await kube.get(API_VERSION, KIND, namespace, name)


def condition(body: dict[str, Any] | None, condition_type: str) -> dict[str, Any] | None:
    for found in ((body or {}).get("status") or {}).get("conditions") or []:
        if found.get("type") == condition_type:
            return found
    return None


async def wait_condition(
    kube: KubeClient,
    name: str,
    condition_type: str,
    status: str,
    reason: str | None = None,
    timeout_s: float = 15.0,
) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        body = await resource(kube, name)
        found = condition(body, condition_type)
        if found and found["status"] == status and (reason is None or found["reason"] == reason):
            return body
        return None

    try:
        return await eventually(
            probe, timeout_s=timeout_s, what=f"{name} {condition_type}={status} {reason or ''}"
        )
    except AssertionError as error:
        body = await resource(kube, name)
        shown = {k: v for k, v in ((body or {}).get("status") or {}).items() if k != "baseline"}
        raise AssertionError(f"{error}\nstatus: {shown}") from None


async def events_for(kube: KubeClient, name: str, namespace: str = "default") -> list[dict[str, Any]]:
    events = await kube.list("v1", "Event", namespace)
    return [e for e in events if (e.get("involvedObject") or {}).get("name") == name]
