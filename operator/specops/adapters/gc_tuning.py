"""CPython's cyclic garbage collector in a long-running operator: what start-up made is never scanned again.

A full pass scans every tracked object of the oldest generation. The operator's own code,
Kopf, pydantic's schemas and the other imported modules are about 380,000 of them, none of which
will ever be garbage: `gc.freeze()` once the handlers are imported moves them out of every later
pass (at 2,000 resources a full pass covers about a million objects, so this is about a third of
each). Two further tunings were measured at 2,000 resources and left out:
a young threshold of 50,000 with full passes on a timer, and freezing the survivors of every full
pass (thawed every 15 minutes). Neither moved the cycle's CPU beyond the run-to-run spread, and
both held 60-80 MiB more: cyclic garbage waiting for its pass.

Full passes come after every FULL_PASS_AFTER_MIDDLE middle-generation passes instead of CPython's
10: a census at 2,000 resources found each full pass scanning about 380,000 objects to free about
3,000 (the objects it saw promoted were medium-lived and acyclic, already freed by reference
counting), two passes every 30 s. See docs/scale.md#what-the-operator-does-for-scale.

Collection time by generation is counted in `specops_gc_seconds_total` (young passes sampled).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

from specops.adapters import operator_metrics

YOUNG_SAMPLE = 16
"""One young (generation 0) pass in this many is timed, and counts for all of them. At 2,000
resources young passes run about a thousand times a second: timing each (two reads of the
process's CPU clock, a counter's lock) was 2.7 % of the operator's CPU in a profile, more than
the passes it timed are worth knowing apart; older passes are fewer and each is timed."""


class PauseClock:
    """Adds each collection's CPU time to the operator's metrics (a gc.callbacks entry).

    The process's CPU clock, not the wall clock: on a busy node a pass preempted by other
    processes (or paused by a sampling profiler) would count time it did not spend collecting.
    Young passes are sampled (`YOUNG_SAMPLE`): their total is an estimate, unbiased since which
    pass is timed does not depend on how long it takes."""

    def __init__(
        self, clock: Callable[[], float] = time.process_time, young_sample: int = YOUNG_SAMPLE
    ) -> None:
        self._clock = clock
        self._young_sample = max(1, young_sample)
        self._young_seen = 0
        self._started: dict[int, float] = {}

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        generation = info.get("generation", 0)
        if phase == "start":
            if generation == 0:
                self._young_seen += 1
                if self._young_seen < self._young_sample:
                    return
                self._young_seen = 0
            self._started[generation] = self._clock()
            return
        started = self._started.pop(generation, None)
        if started is not None:
            spent = self._clock() - started
            operator_metrics.count_gc(generation, spent * self._young_sample if generation == 0 else spent)


FULL_PASS_AFTER_MIDDLE = 100
"""CPython's third threshold: a full pass after this many middle-generation passes (its default,
10, ran one every 15 s at 2,000 resources). Measured at 2,000 over 12-cycle windows: the
collector from 12 % of the operator's CPU to 7-8 % in one round, from 15 % to 5-10 % in another
(the same day each way), the peak 8-15 MiB higher (cyclic garbage waiting longer)."""

_configured = False


def configure() -> None:
    """Freeze what start-up made, space full passes out, count collection pauses (once per process)."""
    global _configured
    if _configured:
        return
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_PASS_AFTER_MIDDLE)
    gc.callbacks.append(PauseClock())
    _configured = True


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector off for a block that makes many short-lived acyclic objects and drops them
    before it ends (no await inside: nothing else runs meanwhile); as it was afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
