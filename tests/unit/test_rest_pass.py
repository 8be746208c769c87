"""The rest pass: resources at rest looked at by one task, each on its own schedule, and their
daemons woken only when a look ends the rest (services/rest_pass.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from specops.services import rest_pass
from specops.services.rest_pass import RestPass


class Looks:
    """Scripted looks: each key rests while its script says a wait, and ends its rest on None."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def of(self, key: str, script: list[float | None]) -> Callable[[], float | None]:
        answers = iter(script)

        def look() -> float | None:
            self.seen.append(key)
            return next(answers)

        return look


async def test_each_resource_is_looked_at_on_its_own_schedule_until_a_look_ends_its_rest() -> None:
    passes = RestPass()
    looks = Looks()
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        slow = passes.hold("slow", looks.of("slow", [10.0, 10.0, None]), 10.0)
        fast = passes.hold("fast", looks.of("fast", [1.0, None]), 1.0)
        # the pass's own task runs on the real clock: drive the schedule by hand instead
        assert passes._task is not None
        passes._task.cancel()
        passes.look_due(start + 0.5)
        assert looks.seen == []
        passes.look_due(start + 1.5)
        assert looks.seen == ["fast"] and not fast.done()
        passes.look_due(start + 2.6)  # fast's second look ends its rest: its daemon wakes
        assert looks.seen == ["fast", "fast"] and fast.done() and not slow.done()
        passes.look_due(start + 10.5)  # each look's wait counts from that look
        passes.look_due(start + 20.6)
        assert looks.seen[2:] == ["slow", "slow"] and not slow.done()
        assert passes.look_due(start + 30.7) is None and slow.done()
        assert passes.holding == 0 and passes.looks == 5 and passes.ended == 2
    finally:
        await passes.close()


async def test_a_released_hold_is_never_looked_at_again_and_a_late_release_spares_its_successor() -> None:
    passes = RestPass()
    looks = Looks()
    start = asyncio.get_running_loop().time()
    try:
        first = passes.hold("a", looks.of("first", [1.0] * 10), 1.0)
        assert passes._task is not None
        passes._task.cancel()
        passes.release("a", first)  # its daemon stopped
        assert first.cancelled()
        second = passes.hold("a", looks.of("second", [1.0] * 10), 1.0)  # the resource created again
        passes.release("a", first)  # the first daemon's cleanup comes late: it must not end the second
        passes.look_due(start + 1.5)
        assert looks.seen == ["second"] and not second.done() and passes.holding == 1
    finally:
        await passes.close()
    assert second.cancelled()


async def test_a_look_that_fails_wakes_its_daemon_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    passes = RestPass()
    looks = Looks()

    def broken() -> float | None:
        raise ZeroDivisionError("a bug")

    start = asyncio.get_running_loop().time()
    try:
        failing = passes.hold("broken", broken, 1.0)
        steady = passes.hold("steady", looks.of("steady", [1.0, 1.0]), 1.0)
        assert passes._task is not None
        passes._task.cancel()
        passes.look_due(start + 1.5)
        assert failing.done() and failing.exception() is None  # woken to tick in full, which reports it
        assert not steady.done() and looks.seen == ["steady"]
        assert "deciding it in full" in caplog.text
    finally:
        await passes.close()


async def test_the_pass_task_wakes_daemons_and_yields_between_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a fleet of 10 resources due at once, looked at in slices of 3
    monkeypatch.setattr(rest_pass, "LOOKS_PER_SLICE", 3)
    passes = RestPass(grid_s=0.01)
    order: list[str] = []

    def look_of(key: str) -> Callable[[], float | None]:
        def look() -> float | None:
            order.append(key)
            return None  # each rest ends at its first look

        return look

    async def other_work() -> None:
        for _ in range(5):
            order.append("other")
            await asyncio.sleep(0)

    try:
        woken = [passes.hold(f"r{i}", look_of(f"r{i}"), 0.0) for i in range(10)]
        # When the pass's task runs beside other work
        await asyncio.gather(asyncio.wait_for(asyncio.gather(*woken), 5.0), other_work())
    finally:
        await passes.close()
    # Then every daemon woke, and other work ran between the slices, not only after all ten looks
    assert all(f.done() for f in woken) and passes.ended == 10
    first_other_after_looks = order.index("other", order.index("r0"))
    assert first_other_after_looks < order.index("r9"), order
    # and with nothing held the pass waits without looking
    assert passes.holding == 0
