"""Work that may outlast a tick: one call per owner runs in the background, and each tick waits
for it at most a budget (the owner's interval), so a slow or hung pod never holds the owner's
decisions longer. The tick that finds the call done takes its result; a call for something else
(other pods, another draft) replaces the owner's earlier one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Outlasting(Generic[T]):
    """At most one background call per owner, keyed by what it is about."""

    def __init__(self) -> None:
        self._calls: dict[Hashable, tuple[Hashable, asyncio.Task[T]]] = {}

    async def within(
        self, owner: Hashable, about: Hashable, start: Callable[[], Awaitable[T]], budget_s: float
    ) -> T | None:
        """The result of the owner's call about ``about`` (started now unless one runs), or None
        when it has not ended within ``budget_s``: the next tick asks again."""
        running = self._calls.get(owner)
        if running is not None and running[0] != about:
            running[1].cancel()
            running = None
        if running is None:
            running = (about, asyncio.ensure_future(start()))
            self._calls[owner] = running
        task = running[1]
        done, _ = await asyncio.wait({task}, timeout=max(0.0, budget_s))
        if task not in done:
            return None
        del self._calls[owner]
        return task.result()

    def running(self, owner: Hashable) -> bool:
        return owner in self._calls

    async def close(self) -> None:
        tasks = [task for _, task in self._calls.values()]
        self._calls.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
