"""The liveness probe: an operator whose ticks stall fails it, whatever its watches do."""

from __future__ import annotations

import kopf
import pytest

from specops.handlers.control import (
    MIN_OVERDUE_S,
    TickWatchdog,
    first_tick_delay,
    jittered,
    on_grid,
    ticks_on_time,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_stalled_tick_loop_fails_the_probe_and_a_finished_tick_clears_it() -> None:
    clock = Clock()
    memo = kopf.Memo()
    dog = memo["tick_watchdog"] = TickWatchdog(clock)
    dog.expect(("default", "a"), wait_s=15.0, interval_s=15.0)
    dog.expect(("default", "b"), wait_s=15.0, interval_s=15.0)
    assert ticks_on_time(memo=memo) == 2

    clock.now += 15.0 + MIN_OVERDUE_S - 1  # late, but within the grace
    assert ticks_on_time(memo=memo) == 2
    clock.now += 2  # both overdue, and nothing finished for longer than the grace: stuck
    with pytest.raises(kopf.PermanentError, match=r"2 resources' ticks are overdue.*default/a, default/b"):
        ticks_on_time(memo=memo)

    dog.expect(("default", "a"), wait_s=15.0, interval_s=15.0)  # a tick finished: the loop moves
    assert dog.overdue() == [("default", "b")] and ticks_on_time(memo=memo) == 2
    dog.forget(("default", "b"))  # its daemon stopped
    assert ticks_on_time(memo=memo) == 1


def test_ticks_late_behind_a_slow_api_server_do_not_fail_the_probe_while_others_finish() -> None:
    """Two thousand resources behind a saturated API server: every tick is minutes late, but ticks
    keep finishing, so the process is slow, not stuck, and a restart would only add load."""
    clock = Clock()
    dog = TickWatchdog(clock)
    keys = [("default", f"r{i}") for i in range(20)]
    for key in keys:
        dog.expect(key, wait_s=15.0, interval_s=15.0)
    for minute in range(1, 30):
        clock.now += 60.0
        dog.expect(keys[minute % len(keys)], wait_s=15.0, interval_s=15.0)  # one finishes a minute
        assert dog.stalled() == []
    assert len(dog.overdue()) > 10  # most are long overdue
    clock.now += 15.0 + MIN_OVERDUE_S + 1  # then none finishes for longer than the grace: stuck
    assert len(dog.stalled()) == len(keys)


def test_long_intervals_get_a_longer_grace() -> None:
    clock = Clock()
    dog = TickWatchdog(clock)
    dog.expect("slow", wait_s=3600.0, interval_s=3600.0)
    clock.now += 3600.0 + MIN_OVERDUE_S + 1
    assert dog.overdue() == []  # two intervals of grace for an hourly resource
    clock.now += 2 * 3600.0
    assert dog.overdue() == ["slow"]


def test_ticks_are_spread_over_the_interval_and_jittered_by_a_few_percent() -> None:
    firsts = [first_tick_delay(15.0) for _ in range(500)]
    assert all(0.0 <= delay <= 15.0 for delay in firsts)
    assert min(firsts) < 3.0 and max(firsts) > 12.0  # spread, not all at once
    waits = [jittered(15.0) for _ in range(500)]
    assert all(14.25 <= wait <= 15.75 for wait in waits)
    assert len({round(wait, 3) for wait in waits}) > 100


@pytest.mark.parametrize(("interval_s", "grid_s"), [(15.0, 0.5), (60.0, 0.5), (1.0, 1.0 / 30.0)])
def test_waits_end_on_a_grid_so_that_thousands_of_daemons_wake_in_batches(
    interval_s: float, grid_s: float
) -> None:
    # Given daemons whose jittered waits start at scattered moments of the event loop's clock
    ends = set()
    for k in range(2000):
        now = 1000.0 + k * 0.0073
        wait = jittered(interval_s)
        # When each wait is put on the wake grid
        gridded = on_grid(now, wait, interval_s)
        # Then it is never shorter, at most one grid step longer, and ends on the grid
        assert wait <= gridded < wait + grid_s + 1e-9
        end = now + gridded
        assert abs(end / grid_s - round(end / grid_s)) < 1e-6
        ends.add(round(end / grid_s))
    # so 2,000 waits end at a few dozen moments a cycle, not 2,000
    assert len(ends) <= (2000 * 0.0073 + 1.1 * interval_s) / grid_s + 1
