"""A short chaos soak (`make soak` runs the long one): faults really injected, invariants really checked, none broken."""

from __future__ import annotations

from pathlib import Path

import pytest

from specops_local.soak import INVARIANTS, SoakSettings, exit_code, run_soak, summary

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only, pytest.mark.timeout(240)]

KINDS = ("api-5xx-burst", "new-draft", "watch-cut", "operator-restart", "pod-crash")


async def test_a_short_seeded_soak_injects_faults_and_breaks_no_invariant(tmp_path: Path) -> None:
    # Given the local stack with three resources and a seeded schedule of short faults
    settings = SoakSettings(seconds=35.0, seed=5, gap_s=(1.0, 3.0), kinds=KINDS, fault_scale=0.4)

    # When the soak runs
    report = await run_soak(settings, tmp_path)
    print(summary(report))

    # Then it injected faults of several kinds (API writes really answered 503) and checked every tick
    injected = {kind for kind, count in report["faults"].items() if count}
    assert len(injected) >= 3, report["faults"]
    assert "api-5xx-burst" not in injected or report["writes_failed"] + report["reads_failed"] > 0
    assert report["checks"] >= 15
    assert report["invariants"] == list(INVARIANTS)
    # And no invariant was violated, and every fault that ended was recovered from
    assert report["violations_total"] == 0, report["violation_samples"]
    assert all(row["unrecovered"] == 0 for row in report["recovery"].values()), report["recovery"]
    assert exit_code(report) == 0
