"""The operator's garbage collector: start-up objects out of every pass, later garbage reclaimed, pauses counted."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from specops.adapters import gc_tuning, operator_metrics


class _Node:
    def __init__(self) -> None:
        self.partner: _Node | None = None


@pytest.fixture
def collector_settings() -> Iterator[None]:
    """Put back the interpreter's callbacks and frozen set after the test."""
    callbacks = list(gc.callbacks)
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        gc.callbacks[:] = callbacks
        gc_tuning._configured = False


def _counted(generation: int) -> float:
    value = operator_metrics.METRICS.registry.get_sample_value(
        "specops_gc_seconds_total", {"generation": str(generation)}
    )
    return value or 0.0


def test_start_up_objects_leave_the_collector_and_later_garbage_is_still_reclaimed_and_counted(
    collector_settings: None,
) -> None:
    # Given a structure made at start-up, and the operator's collector settings applied after it
    start_up = [_Node()]
    start_up[0].partner = start_up[0]
    made_at_start_up = weakref.ref(start_up[0])
    gc_tuning.configure()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    gc_tuning.configure()  # once per process
    assert gc.get_freeze_count() == frozen
    # and full passes spaced out: one after every FULL_PASS_AFTER_MIDDLE middle passes, not 10
    assert gc.get_threshold()[2] == gc_tuning.FULL_PASS_AFTER_MIDDLE > 10

    # When it is dropped, and so is a cycle made later (a deleted resource's structures)
    later = _Node()
    later.partner = later
    made_later = weakref.ref(later)
    start_up.clear()
    del later
    before = _counted(2)

    # Then a full pass reclaims the later one only (start-up's objects are no longer scanned),
    # and its time is counted as generation 2
    assert gc.collect() >= 1
    assert made_later() is None
    assert made_at_start_up() is not None
    assert _counted(2) > before


def test_a_paused_block_runs_without_the_collector_and_leaves_it_as_it_was() -> None:
    # Given the collector on
    assert gc.isenabled()
    # When a block runs paused, even one that fails
    with gc_tuning.paused():
        assert not gc.isenabled()
    with pytest.raises(RuntimeError), gc_tuning.paused():
        raise RuntimeError("a failed decode")
    # Then the collector is on again; and a block paused while it was off leaves it off
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_tuning.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_young_passes_are_timed_one_in_sixteen_and_counted_for_all_older_ones_each() -> None:
    # Given the pause clock on a CPU clock where every pass takes 1 ms (young) or 40 ms (older)
    clock = [0.0]
    reads = 0

    def counting_clock() -> float:
        nonlocal reads
        reads += 1
        return clock[0]

    pauses = gc_tuning.PauseClock(clock=counting_clock)
    young, middle = _counted(0), _counted(1)

    # When 64 young passes and 2 middle ones run
    for generation, spent, passes in ((0, 0.001, 64), (1, 0.040, 2)):
        for _ in range(passes):
            pauses("start", {"generation": generation})
            clock[0] += spent
            pauses("stop", {"generation": generation, "collected": 0, "uncollectable": 0})

    # Then the young passes' time is counted in full from 4 of them (8 clock reads, not 128), and
    # each middle pass's time as it was
    assert _counted(0) - young == pytest.approx(0.064)
    assert _counted(1) - middle == pytest.approx(0.080)
    assert reads == 2 * (64 // gc_tuning.YOUNG_SAMPLE) + 2 * 2
