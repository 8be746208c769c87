"""The README's demo (`make demo`) runs its scenes and shows what it promises, so it cannot silently rot."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from specops_local.demo import DENSE, EXAMPLES, ON_OFF_REASONS, SCENES, Demo, Pace, printer_columns, run_demo
from specops_local.sim import LoadPoint
from specops_local.stack import LocalStack

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only, pytest.mark.timeout(120)]


async def test_demo_switches_speculation_off_past_break_even_and_back_on(tmp_path: Path) -> None:
    # Given the demo's scenes, plus one that remembers the stack so its shutdown can be checked
    stacks: list[LocalStack] = []

    async def remember_stack(demo: Demo) -> None:
        stacks.append(demo.stack)

    kubeconfig_before = os.environ.get("KUBECONFIG")
    out = io.StringIO()

    # When it runs in fast mode
    result = await run_demo(fast=True, workdir=tmp_path, out=out, scenes=[*SCENES, remember_stack])
    printed = out.getvalue()

    # Then it succeeded and saw speculation switch off under load and back on after it
    assert result.exit_code == 0, printed
    assert result.failure is None
    assert result.switched_off_and_on
    assert result.off_after_s is not None and result.off_after_s < 10, printed

    # And it printed what a user would see: the children, the sdep table with the CRD's columns, Events
    for _, name in EXAMPLES:
        assert (
            f"Deployment   {name}" in printed
            and f"speculativedeployment.specops.dev/{name} created" in printed
        )
    columns = ["NAME", *(c["name"].upper() for c in printer_columns())]
    assert columns == ["NAME", "PHASE", "SPECULATION", "DRAFT", "LEN", "ACCEPT", "P99", "SPEEDUP", "AGE"]
    assert any(line.split() == columns for line in printed.splitlines())
    assert printed.count("$ kubectl get sdep -o wide") >= 2
    assert any(line.split()[:3] == [DENSE, "Dynamic", "on"] for line in printed.splitlines())
    assert "sdep  on len" in printed and "sdep off len 0" in printed
    events = printed[printed.index("Events") :]
    for reason in ON_OFF_REASONS:
        assert f"sdep/{DENSE}" in events and reason in events
    assert "Done in" in printed
    # And the draft's life is shown: a promoted canary, then a retraining round promoted by its own canary
    assert printed.count("CanaryPromoted") >= 2, printed
    for reason in ("LosslessCheckPassed", "RetrainingStarted", "RetrainingSucceeded"):
        assert reason in printed

    # And everything it started is stopped, and the environment is as it was
    (stack,) = stacks
    assert not stack.prometheus.running
    assert not any(pod.running for pod in stack.serving.all_pods())
    assert not stack.operator.running
    assert os.environ.get("KUBECONFIG") == kubeconfig_before
    assert (tmp_path / "operator.log").stat().st_size > 0


async def test_demo_fails_clearly_when_speculation_never_switches_off(tmp_path: Path) -> None:
    # Given a demo whose "high" load stays below break-even, with a short deadline for the switch
    async def keep_load_below_break_even(demo: Demo) -> None:
        demo.high_load = LoadPoint(batch=100, alpha=0.8)

    apply, rollout, load_cycle = SCENES[:3]
    pace = Pace(baseline="1s", soak="1s", low_hold_s=0, high_hold_s=0, settle_hold_s=0, off_timeout_s=3)
    out = io.StringIO()

    # When it runs
    result = await run_demo(
        pace=pace, workdir=tmp_path, out=out, scenes=[apply, rollout, keep_load_below_break_even, load_cycle]
    )

    # Then it exits non-zero and says what did not happen
    assert result.exit_code == 1
    assert result.failure is not None and "speculation off on every pod past break-even" in result.failure
    assert "DEMO FAILED: speculation off on every pod past break-even: not within 3 s" in out.getvalue()
    assert not result.switched_off_and_on
