"""The control daemon's wait between ticks, and its tick: a stop ends either quietly, any other
cancellation propagates.

Kopf cancels a stopped daemon at once; re-raising that cancellation makes Kopf log "is cancelled"
as a warning (posted as a Warning Event on the resource) on every ordinary deletion.
"""

from __future__ import annotations

import asyncio

import pytest

from specops.handlers.control import pause, tick_unless_stopped


class Flag:
    def __init__(self) -> None:
        self.set = False

    def __bool__(self) -> bool:
        return self.set


async def test_a_stop_ends_the_wait_without_a_cancellation() -> None:
    stopped = Flag()
    task = asyncio.create_task(pause(stopped, 30.0))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    stopped.set = True
    task.cancel()
    assert await task is False


async def test_a_cancellation_without_a_stop_propagates() -> None:
    task = asyncio.create_task(pause(Flag(), 30.0))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_wait_that_runs_out_means_tick_again() -> None:
    assert await pause(Flag(), 0.01) is True  # type: ignore[arg-type]


async def _a_tick_on_hold(release: asyncio.Event) -> tuple[float, bool]:
    await release.wait()  # a status write or a pod's reload in flight
    return 15.0, False


async def test_a_stop_during_a_tick_ends_the_daemon_without_a_cancellation() -> None:
    stopped = Flag()
    task = asyncio.create_task(tick_unless_stopped(stopped, _a_tick_on_hold(asyncio.Event())))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    stopped.set = True
    task.cancel()
    assert await task is None


async def test_a_cancellation_during_a_tick_without_a_stop_propagates() -> None:
    task = asyncio.create_task(tick_unless_stopped(Flag(), _a_tick_on_hold(asyncio.Event())))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_tick_that_finishes_hands_its_result_on() -> None:
    release = asyncio.Event()
    release.set()
    assert await tick_unless_stopped(Flag(), _a_tick_on_hold(release)) == (15.0, False)  # type: ignore[arg-type]
