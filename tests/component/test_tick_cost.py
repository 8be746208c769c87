"""`specops bench tick`: the production tick for a small fleet on a simulated clock.

The benchmark's use is to show that a change costs less without deciding differently: the same
code and seed must end every resource in the same status (its digest), and a different world
must not. Timings are not asserted (the benchmark measures them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specops.bench import BENCHMARKS, load
from specops_local import tick_cost

pytestmark = pytest.mark.timeout(120)


async def test_the_same_seed_ends_every_resource_in_the_same_status_and_another_does_not() -> None:
    first = await tick_cost.measure(4, 2, seed=3, settle_cycles=12)
    again = await tick_cost.measure(4, 2, seed=3, settle_cycles=12)
    other = await tick_cost.measure(4, 2, seed=4, settle_cycles=12)

    assert first.status_digest == again.status_digest
    assert other.status_digest != first.status_digest
    assert first.tick_cpu_ms > 0
    assert first.status_writes_per_cycle <= first.resources


def test_the_bench_command_writes_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "tick.json"
    code = load("tick")(["--resources", "3", "--cycles", "2", "--settle-cycles", "6", "--json", str(out)])

    assert "tick" in BENCHMARKS and code == 0
    figures = json.loads(out.read_text())
    assert figures["resources"] == 3 and figures["cycles"] == 2
    # both are rounded to four decimals: a small fleet's cycle is a few thousandths of a second
    assert figures["cycle_cpu_seconds"] == pytest.approx(
        figures["tick_cpu_ms"] * 3 / 1000.0, rel=0.01, abs=5e-5
    )
    assert len(figures["status_digest"]) == 16
