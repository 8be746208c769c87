"""The fleet's rests, looked at by one task instead of one daemon wake each.

A resource at rest (services/tick.py, SETTLED_DECISIONS_PER_S) is looked at every interval and
decided in full only when something moved or its budget of rests in a row is spent. A look need
not wake its daemon (the event loop's timer and task step, Kopf's body copied, the interval
parsed, the tick timed, the outcome handed back). Measured at 2,000 under py-spy, that plumbing
was a small part of a rest: everything of the tick outside the control loop and the status write
went from 17.2 % of the samples to 16.1 % with the pass; the rest itself (``ControlLoop.rest``,
about 0.2 ms) is what a look costs. The pass is where the fleet's rests run one after another,
the place to decide them together next (docs/scale.md, What is left).

So a daemon whose tick left its resource at rest hands the resource to the pass and waits on a
future; the pass looks at every held resource at that resource's own time (each keeps its phase
in the interval and its jitter, as its daemon would), in batches on the daemons' wake grid, and
resolves the future when a look finds the rest over: the daemon then ticks in full at once, as
it would have on that look. A look that raises ends the rest the same way (the full tick reports
what is wrong). Nothing here reads or writes the API: a look is ``ResourceTick.rest``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Look = Callable[[], "float | None"]
"""One look at a held resource: the wait until its next look (still at rest), or None (rest over)."""

LOOKS_PER_SLICE = 64
"""Looks made before the pass yields to the event loop: a whole fleet due at once (a restart's
first ticks lined up) must not hold the loop for the length of all its looks."""


@dataclass
class _Held:
    look: Look
    woken: asyncio.Future[None]
    turn: int
    """The heap entry that is this resource's current one (earlier entries of it are stale)."""


class RestPass:
    """Resources at rest, each looked at on its own schedule by one shared task.

    ``hold`` returns a future the daemon awaits: it resolves when a look ends the rest, and is
    cancelled by ``release`` (the daemon stopped). The task starts with the first hold and ends
    with ``close``; while nothing is held it waits without waking."""

    def __init__(self, grid_s: float = 0.5) -> None:
        self.grid_s = grid_s
        """The longest the pass sleeps between two batches: a resource's look is late by at most this."""
        self._held: dict[Hashable, _Held] = {}
        self._due: list[tuple[float, int, Hashable]] = []
        self._turns = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._more = asyncio.Event()
        self.looks = 0
        self.ended = 0
        """Rests a look ended."""
        self.woken = 0
        """Rests ended from outside, without a look (``wake``)."""

    @property
    def holding(self) -> int:
        return len(self._held)

    def hold(self, key: Hashable, look: Look, wait_s: float) -> asyncio.Future[None]:
        """Look at ``key`` in ``wait_s`` seconds and every wait its looks return, until one ends the rest."""
        loop = asyncio.get_running_loop()
        self.release(key)
        turn = next(self._turns)
        held = _Held(look, loop.create_future(), turn)
        self._held[key] = held
        heapq.heappush(self._due, (loop.time() + max(0.0, wait_s), turn, key))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="specops rest pass")
        self._more.set()
        return held.woken

    def release(self, key: Hashable, woken: asyncio.Future[None] | None = None) -> None:
        """Stop looking at ``key`` (its daemon stopped); with ``woken``, only if that is still its
        hold: a daemon stopping late must not end the hold of the one that replaced it (a resource
        deleted and created again under its name)."""
        held = self._held.get(key)
        if held is None or (woken is not None and held.woken is not woken):
            return
        del self._held[key]
        if not held.woken.done():
            held.woken.cancel()

    def wake(self, key: Hashable) -> bool:
        """End ``key``'s rest now, without a look (its pods changed: services/wakeups.py): its
        daemon ticks in full at once. False when it is not held."""
        held = self._held.pop(key, None)
        if held is None:
            return False
        if held.woken.done():  # its daemon was cancelled meanwhile
            return False
        self.woken += 1
        held.woken.set_result(None)
        return True

    async def close(self) -> None:
        for key in list(self._held):
            self.release(key)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def look_due(self, now: float, limit: int | None = None) -> float | None:
        """Make the looks due by ``now`` (the event loop's clock), at most ``limit`` of them; when the
        next one is due (``now`` or earlier: more are), or None when nothing is held."""
        due = self._due
        looked = 0
        while due and due[0][0] <= now and (limit is None or looked < limit):
            _, turn, key = heapq.heappop(due)
            held = self._held.get(key)
            if held is None or held.turn != turn:
                continue  # released, or held again since
            if held.woken.done():  # its daemon was cancelled meanwhile
                del self._held[key]
                continue
            self.looks += 1
            looked += 1
            try:
                wait_s = held.look()
            except Exception:  # a bug in a look: the full tick runs and reports it
                log.exception("a look at the rest of %s failed; deciding it in full", key)
                wait_s = None
            if wait_s is None:
                del self._held[key]
                self.ended += 1
                held.woken.set_result(None)
                continue
            held.turn = next(self._turns)
            heapq.heappush(due, (now + max(0.0, wait_s), held.turn, key))
        return due[0][0] if due else None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._held:
                self._due.clear()
                self._more.clear()
                await self._more.wait()
            next_due = self.look_due(loop.time(), LOOKS_PER_SLICE)
            if next_due is None:  # the last look ended the last rest: wait for the next hold
                continue
            wait_s = next_due - loop.time()
            if wait_s > 0:
                await asyncio.sleep(min(wait_s, self.grid_s))
            else:
                await asyncio.sleep(0)  # more looks due: let the loop run between slices
