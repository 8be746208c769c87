"""The per-resource control-loop daemon: one tick per metrics interval, stopped with the resource.

Ticks are spread out: the first comes after a random share of the interval (so that thousands of
resources found at start-up do not all tick at once, nor during their own first reconcile), and
every wait is jittered by a few percent, so that ticks that happen to line up drift apart again.

Every tick runs the control loop's one pure step (domain.control_step), whose fast path makes
the tick of a resource whose inputs did not move cheap: there is no second path for resources
at rest.

The liveness probe fails when ticks are long overdue and none has finished for as long: an
operator whose watches keep running while its tick loop is stuck (a jammed client, a livelock) is
restarted, not called healthy. Ticks that are late while others still finish are a slow API server
or Prometheus, not a stuck process: a restart would only add a start-up's requests to their load.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import kopf

from specops.adapters import operator_metrics
from specops.api.models import GROUP, PLURAL, VERSION
from specops.domain.discovery import PodEndpoint, ready_endpoint
from specops.domain.names import COMPONENT_SERVING, LABEL_COMPONENT, LABEL_DEPLOYMENT, label_value
from specops.handlers.lifecycle import live_bodies, now, post_events
from specops.services.container import Services
from specops.services.tick import interval_of

TICK_JITTER = 0.05
"""Each wait is the interval times a random factor within 1 +- this."""


WAKE_GRID_S = 0.5
"""Each wait ends on a grid of this many seconds (at most a thirtieth of the interval): thousands of
daemons then wake in a few dozen batches a cycle instead of one by one. Each separate wake of the
event loop costs CPU of its own (timers, the selector's wait, the handle): 2,000 tasks sleeping 15 s
each, spread out, cost 0.24 CPU-s a cycle in asyncio alone on a 2-core VM, against 0.03 on a
0.5 s grid (`on_grid`)."""


def on_grid(now: float, wait_s: float, interval_s: float) -> float:
    """``wait_s`` from ``now`` (the event loop's clock), lengthened to end on the wake grid."""
    grid = min(WAKE_GRID_S, interval_s / 30.0)
    if grid <= 0.0:
        return wait_s
    return max(0.0, math.ceil((now + wait_s) / grid) * grid - now)


def first_tick_delay(interval_s: float) -> float:
    return random.uniform(0.0, interval_s)  # spreading load, not security


def jittered(interval_s: float) -> float:
    return interval_s * random.uniform(1.0 - TICK_JITTER, 1.0 + TICK_JITTER)


MIN_OVERDUE_S = 300.0
"""A tick is overdue when it has not finished this long (or two intervals, if longer) after it was due."""


class TickWatchdog:
    """When each resource's next tick should have finished, and when the last one did, for the
    liveness probe."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._due: dict[Hashable, float] = {}
        self._progress = clock()

    def expect(self, key: Hashable, wait_s: float, interval_s: float) -> None:
        """``key``'s daemon finished a tick (or started) and waits ``wait_s`` for its next."""
        self._progress = self._clock()
        self._due[key] = self._progress + wait_s + max(MIN_OVERDUE_S, 2.0 * interval_s)

    def forget(self, key: Hashable) -> None:
        self._due.pop(key, None)

    @property
    def watched(self) -> int:
        return len(self._due)

    def overdue(self) -> list[Hashable]:
        now = self._clock()
        return [key for key, due in self._due.items() if due < now]

    def stalled(self) -> list[Hashable]:
        """The overdue ticks when no tick at all has finished for MIN_OVERDUE_S (none otherwise)."""
        if self._clock() - self._progress <= MIN_OVERDUE_S:
            return []
        return self.overdue()


def watchdog(memo: kopf.Memo) -> TickWatchdog:
    found = memo.get("tick_watchdog")
    if not isinstance(found, TickWatchdog):
        found = memo["tick_watchdog"] = TickWatchdog()
    return found


@kopf.on.startup()
def share_the_watchdog(memo: kopf.Memo, **_: Any) -> None:
    """One watchdog for every resource's daemon and the probe (see lifecycle.SHARED_STATE_NOTE)."""
    watchdog(memo)


@kopf.on.probe(id="ticks")
def ticks_on_time(memo: kopf.Memo, **_: Any) -> int:
    """Liveness: fails (HTTP 500) while ticks are long overdue and none finishes; else how many tick."""
    dog = watchdog(memo)
    late = dog.stalled()
    if late:
        shown = ", ".join("/".join(map(str, key)) if isinstance(key, tuple) else str(key) for key in late[:5])
        raise kopf.PermanentError(f"{len(late)} resources' ticks are overdue (stalled tick loop): {shown}")
    return dog.watched


@kopf.index("", "v1", "pods", labels={LABEL_COMPONENT: COMPONENT_SERVING, LABEL_DEPLOYMENT: kopf.PRESENT})
async def serving_pods(
    namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], PodEndpoint] | None:
    """Ready serving pods by (namespace, specops.dev/deployment): each tick reads its pods here, not
    with a LIST (the watch replaces one LIST per resource per interval). Pods not ready are left out.

    A coroutine although it awaits nothing: Kopf runs a plain function in its thread pool, a
    hand-off to another thread (and back) for every event of every serving pod."""
    endpoint = ready_endpoint(body)
    if endpoint is None or namespace is None:
        return None
    return {(namespace, str(labels[LABEL_DEPLOYMENT])): endpoint}


async def pause(
    stopped: kopf.DaemonStopped,
    wait_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> bool:
    """Sleep until the next tick; False when Kopf stopped the daemon meanwhile.

    Kopf cancels a daemon as soon as it is stopped (no cancellation_backoff) and waits up to
    cancellation_timeout for it to exit, so the wait is a plain sleep: Kopf discourages
    `await stopped.wait(n)` in async daemons, and each one was an asyncio.wait_for with a task and
    a cancellation, an eighth of the operator's CPU at 2,000 resources. A cancellation that comes
    with the stop flag is the normal end (a deleted resource, a shutdown): the daemon returns
    instead of re-raising, so Kopf does not log (and post as a Warning Event) "is cancelled".
    """
    try:
        await sleep(wait_s)
    except asyncio.CancelledError:
        if stopped:
            return False
        raise
    return True


async def tick_once(
    services: Services,
    namespace: str,
    name: str,
    body: kopf.Body,
    pods: kopf.Index[tuple[str, str], PodEndpoint] | None,
) -> tuple[float, bool]:
    """One tick, its Events and metrics; (when to come back, whether the resource is gone).

    Its own function so that nothing the tick made (the status it computed, about 10 KiB) stays
    referenced from the daemon's frame while it sleeps: at 2,000 resources that was 20 MiB."""
    with operator_metrics.time_tick():
        serving = None if pods is None else list(pods.get((namespace, label_value(name)), ()))
        # Kopf's live body and pod index: no GET, no LIST
        outcome = await services.tick(namespace, name, now, body, serving)
    operator_metrics.count_tick(outcome.unchanged)
    if outcome.events:
        post_events(outcome.body or body, outcome.events)
    if outcome.body is not None and not outcome.unchanged:  # unchanged: the metrics shown still hold
        shown = outcome.status if outcome.status is not None else outcome.body.get("status")
        operator_metrics.observe_status(namespace, name, shown or {}, outcome.body.get("spec"))
    return outcome.interval_s, outcome.gone


async def tick_unless_stopped(
    stopped: kopf.DaemonStopped, tick: Awaitable[tuple[float, bool]]
) -> tuple[float, bool] | None:
    """``tick``'s result, or None when Kopf stopped the daemon while it ran (a shutdown, a deletion):
    as in ``pause``, the stop's cancellation ends the daemon quietly instead of a Warning Event
    "is cancelled" on the resource at every rolling upgrade of the operator. What the tick had not
    finished is as after a crash: the next tick resumes from status."""
    try:
        return await tick
    except asyncio.CancelledError:
        if stopped:
            return None
        raise


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def speculation_control(
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str | None,
    body: kopf.Body,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    assert namespace is not None  # SpeculativeDeployments are namespaced
    services: Services = memo.services
    dog, key = watchdog(memo), (namespace, name)
    pods: kopf.Index[tuple[str, str], PodEndpoint] | None = kwargs.get("serving_pods")  # the index above
    live_bodies(memo)[key] = body
    try:
        interval_s = interval_of(dict(body), services.config.default_interval_s)
        loop = asyncio.get_running_loop()
        wait_s = on_grid(loop.time(), first_tick_delay(interval_s), interval_s)
        dog.expect(key, wait_s, interval_s)
        if not await pause(stopped, wait_s):
            return
        while not stopped:
            ticked = await tick_unless_stopped(stopped, tick_once(services, namespace, name, body, pods))
            if ticked is None:
                return
            interval_s, gone = ticked
            if gone:
                return
            wait_s = on_grid(loop.time(), jittered(interval_s), interval_s)
            dog.expect(key, wait_s, interval_s)
            if not await pause(stopped, wait_s):
                return
    finally:
        if live_bodies(memo).get(key) is body:
            del live_bodies(memo)[key]
        dog.forget(key)
        services.forget(namespace, name)
        operator_metrics.forget(namespace, name)
