"""A resource whose serving pods changed ticks now, not at its next interval.

A serving pod boots with speculation off (domain/render.py: the control loop switches it on at run
time, once its draft passed the lossless check) and gets the decided setting at its resource's
next full tick: up to a whole interval (15 s by default) of plain decoding on a new pod. After a
promotion every stable pod is new, so all of a resource's traffic decoded plain for up to an
interval (in a run of the local demo, at 1 s intervals, the pods' draft length fell to 0 for
1-2 s at each promotion, and the p99 token latency went from 4 to 12 ms for about 5 s after one).

So the pod watch (handlers/control.py, the serving-pod index) tells this registry of each ready
serving pod. One not seen before (a new pod, or a restarted container: a new incarnation), of a
resource whose last decision speculates, wakes that resource's daemon: out of its sleep, out of
the rest pass (services/rest_pass.py), or, when it is ticking, with no wait before its next tick.
The tick it runs is an ordinary full tick, which sets every pod not yet set. A resource not
speculating is not woken: a new pod already runs what it decided. Nothing here reads or writes
the API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from specops.services.rest_pass import RestPass

ResourceKey = tuple[str, str]
"""(namespace, name) of a SpeculativeDeployment: its daemon's key."""
PodsKey = tuple[str, str]
"""(namespace, specops.dev/deployment label value): how its serving pods are indexed."""
PodIdentity = tuple[str, str]
"""A pod's name and its serving container's incarnation (`PodEndpoint`)."""

SEEN_KEPT = 64
"""Pods remembered per resource; past this the memory starts again (a forgotten pod seen again
costs at most one early tick), so a resource whose pods come and go for months holds no more."""


INDEX_WAIT_S = 0.01
INDEX_WAITS = 100
"""A wake comes from the pod watch's index handler, before Kopf stores the pod in the index: it
waits, looking every INDEX_WAIT_S, until the index holds the pod (at most a second)."""


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Wakeups:
    """Which daemon a pod's resource has, which pods each has seen, and the wakes between them."""

    def __init__(self, rests: RestPass, speculating: Callable[[str, str], bool]) -> None:
        self._rests = rests
        self._speculating = speculating
        self._daemons: dict[PodsKey, ResourceKey] = {}
        self._seen: dict[PodsKey, set[PodIdentity]] = {}
        self._sleeping: dict[ResourceKey, asyncio.Future[None]] = {}
        self._pending: set[ResourceKey] = set()
        self.woken = 0
        """Daemons woken for a new pod since start (a tick each)."""

    def watch(self, key: ResourceKey, pods: PodsKey) -> None:
        """The daemon of ``key`` runs; its pods are indexed under ``pods``."""
        self._daemons[pods] = key

    def forget(self, key: ResourceKey, pods: PodsKey) -> None:
        """The daemon of ``key`` stopped (a daemon stopping late leaves its successor's entry alone)."""
        if self._daemons.get(pods) == key:
            del self._daemons[pods]
            self._seen.pop(pods, None)
        self._pending.discard(key)
        self._sleeping.pop(key, None)

    def pod_ready(self, pods: PodsKey, pod: PodIdentity, indexed: Callable[[], bool] = lambda: True) -> bool:
        """A serving pod is ready (every watch event of one): whether it wakes its resource, which
        happens once ``indexed()`` says the pod watch's index holds the pod (see ``_wake_when``)."""
        seen = self._seen.get(pods)
        if seen is None:
            seen = self._seen[pods] = set()
        if pod in seen:
            return False
        if len(seen) >= SEEN_KEPT:
            seen.clear()
        seen.add(pod)
        key = self._daemons.get(pods)
        if key is None or not self._speculating(*key):
            return False
        asyncio.get_running_loop().call_soon(self._wake_when, key, indexed, INDEX_WAITS)
        return True

    def _wake_when(self, key: ResourceKey, indexed: Callable[[], bool], waits: int) -> None:
        """Wake ``key`` once ``indexed()``; until then look again every INDEX_WAIT_S, at most
        ``waits`` times (then wake anyway: the tick lists what the index holds by then)."""
        if waits > 0 and not indexed():
            asyncio.get_running_loop().call_later(INDEX_WAIT_S, self._wake_when, key, indexed, waits - 1)
            return
        self.wake(key)

    def wake(self, key: ResourceKey) -> None:
        """Bring the next tick of ``key`` forward to now."""
        self.woken += 1
        if self._rests.wake(key):
            return
        sleeping = self._sleeping.pop(key, None)
        if sleeping is not None and not sleeping.done():
            sleeping.set_result(None)
            return
        self._pending.add(key)  # ticking now: that tick may have listed its pods before this one

    def take_pending(self, key: ResourceKey) -> bool:
        """Whether a wake came while ``key`` ticked (then it ticks again at once); clears it."""
        if key in self._pending:
            self._pending.discard(key)
            return True
        return False

    async def sleep(self, key: ResourceKey, wait_s: float) -> None:
        """Sleep ``wait_s`` seconds, or until ``key`` is woken. A timer and a future, as
        `asyncio.sleep` itself is: no task or `wait_for` per sleep (handlers/control.py, ``pause``)."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(max(0.0, wait_s), _resolve, woken)
        self._sleeping[key] = woken
        try:
            await woken
        finally:
            timer.cancel()
            if self._sleeping.get(key) is woken:
                del self._sleeping[key]
