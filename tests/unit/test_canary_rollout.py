"""The canary state machine, one step at a time: given a state and this tick's inputs, the exact next
state and actions (table-style, like Argo Rollouts' canary reconcile tests)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from specops.api.models import DraftSpec, SpeculativeDeployment
from specops.api.status import (
    CanaryStatus,
    CanaryWindow,
    DraftStatus,
    SpeculativeDeploymentStatus,
)
from specops.api.units import parse_duration
from specops.domain import canary_rollout as rollout
from specops.domain import canary_window
from specops.domain.canary import Sample
from specops.domain.canary_rollout import (
    ApplyCanary,
    CanaryInputs,
    ClearAction,
    DeleteCanary,
    LosslessDiffers,
    LosslessPassed,
    LosslessUnrunnable,
    RolloutStable,
    SetWeight,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "dense-70b-7b.yaml"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
V3 = "v3@pvc://models/llama-70b-draft/v3"
V4 = DraftSpec(model="llama-3.1-8b-draft", version="v4", parameters="7B", uri="pvc://engines/d/v4")


def resource(**canary: Any) -> SpeculativeDeployment:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": "chat", "namespace": "inference", "uid": "u-1"}
    body["spec"]["draft"]["version"] = "v4"
    body["spec"]["draft"]["uri"] = "pvc://engines/d/v4"
    body["spec"]["canary"] = {
        "steps": [{"weight": 10, "pause": "1m"}, {"weight": 50, "pause": "1m"}],
        **canary,
    }
    return SpeculativeDeployment.model_validate(body)


SPEC = resource().spec


def serving(**changes: Any) -> SpeculativeDeploymentStatus:
    base = SpeculativeDeploymentStatus(
        phase="Dynamic",
        observed_spec_draft=V3,
        draft=DraftStatus(model="llama-3.1-8b-draft", version="v3", uri="pvc://models/llama-70b-draft/v3"),
    )
    return base.model_copy(update=changes)


def canary_status(**changes: Any) -> CanaryStatus:
    base = CanaryStatus(
        phase="Progressing",
        source="Spec",
        draft=DraftStatus(model=V4.model, version="v4", parameters="7B", uri=V4.uri, source="Spec"),
        started_at=T0,
        step=0,
        weight=10,
        requested_weight=10,
        step_started_at=T0,
        lossless_check="Passed",
    )
    return base.model_copy(update=changes)


def inputs(status: SpeculativeDeploymentStatus, **changes: Any) -> CanaryInputs:
    return replace(CanaryInputs(spec=SPEC, status=status, now=T0), **changes)


def samples(alpha: float, n: int) -> list[Sample]:
    return [Sample(alpha=alpha, tpot_p99_s=0.02, tpot_p50_s=0.01, tokens_per_s=100.0) for _ in range(n)]


# ---------------------------------------------------------------- start


def test_nothing_happens_while_the_spec_draft_is_the_one_serving() -> None:
    status = serving(observed_spec_draft="v4@pvc://engines/d/v4")
    step = rollout.step(inputs(status))
    assert step.status == status and step.actions == () and not step.changed


def test_a_changed_spec_draft_starts_a_canary_held_out_of_traffic() -> None:
    step = rollout.step(inputs(serving(), routing="GatewayAPI"))
    canary = step.status.canary
    assert canary is not None
    assert (canary.phase, canary.source, canary.draft.version, canary.step, canary.weight) == (
        "LosslessCheck",
        "Spec",
        "v4",
        -1,
        0,
    )
    assert canary.traffic_routing == "GatewayAPI" and canary.started_at == T0
    assert step.status.observed_spec_draft == "v4@pvc://engines/d/v4"
    assert step.actions == (ApplyCanary(SPEC.draft, receives_traffic=False),)
    assert [e.reason for e in step.events] == ["CanaryStarted"]


def test_a_rejected_draft_is_not_tried_again_but_a_trained_candidate_is() -> None:
    rejected = serving(rejected_draft="v4@pvc://engines/d/v4")
    assert rollout.step(inputs(rejected)).status.canary is None
    trained = V4.model_copy(update={"version": "v5", "uri": "pvc://engines/d/v5"})
    step = rollout.step(inputs(rejected, candidate=trained))
    assert step.status.canary is not None and step.status.canary.source == "Retraining"
    assert step.status.canary.draft.version == "v5"
    assert step.status.observed_spec_draft == V3  # the spec draft was not acted on


# ---------------------------------------------------------------- lossless gate


def test_lossless_check_waits_for_canary_pods() -> None:
    status = serving(canary=canary_status(phase="LosslessCheck", step=-1, weight=0, lossless_check=None))
    step = rollout.step(inputs(status, lossless=None))
    assert step.status == status and step.actions == ()


def test_a_passed_lossless_check_enters_the_first_step_at_the_weight_the_router_can_give() -> None:
    status = serving(canary=canary_status(phase="LosslessCheck", step=-1, weight=0, lossless_check=None))
    step = rollout.step(inputs(status, lossless=LosslessPassed(), achievable=lambda w: 33))
    canary = step.status.canary
    assert canary is not None
    assert (canary.phase, canary.step, canary.weight, canary.requested_weight, canary.lossless_check) == (
        "Progressing",
        0,
        33,
        10,
        "Passed",
    )
    assert step.actions == (ApplyCanary(SPEC.draft, receives_traffic=True), SetWeight(10))
    assert [e.reason for e in step.events] == [
        "LosslessCheckPassed",
        "CanaryStepStarted",
        "CanaryWeightRounded",
    ]
    warning = step.events[-1]
    assert warning.type == "Warning"
    assert "asks 10% of traffic" in warning.message and "gives 33% with 2 stable replicas" in warning.message
    # once per step: the ticks of the step's bake say nothing more
    later = rollout.step(
        inputs(step.status, now=T0 + timedelta(seconds=15), stable_sample=GOOD, canary_sample=GOOD)
    )
    assert later.events == ()


def test_a_draft_that_changes_greedy_output_is_rolled_back_before_any_traffic() -> None:
    status = serving(canary=canary_status(phase="LosslessCheck", step=-1, weight=0, lossless_check=None))
    step = rollout.step(inputs(status, lossless=LosslessDiffers("prompt #2 differs")))
    assert step.status.canary is None
    assert step.status.rejected_draft == "v4@pvc://engines/d/v4"
    assert step.status.last_canary is not None
    assert (step.status.last_canary.result, step.status.last_canary.reason) == ("RolledBack", "NotLossless")
    assert step.actions == (SetWeight(0), DeleteCanary())
    assert step.finished == "RolledBack" and step.source == "Spec"


@pytest.mark.parametrize(("attempts", "ends"), [(0, False), (8, False), (9, True)])
def test_golden_prompts_that_cannot_run_are_retried_then_give_up(attempts: int, ends: bool) -> None:
    canary = canary_status(phase="LosslessCheck", step=-1, weight=0, lossless_attempts=attempts)
    step = rollout.step(inputs(serving(canary=canary), lossless=LosslessUnrunnable("503")))
    if ends:
        assert step.status.canary is None and step.status.last_canary is not None
        assert step.status.last_canary.reason == "LosslessCheckFailed"
    else:
        assert step.status.canary is not None and step.status.canary.lossless_attempts == attempts + 1


# ---------------------------------------------------------------- steps


def test_within_the_pause_a_step_only_collects_samples() -> None:
    status = serving(canary=canary_status())
    sample = Sample(alpha=0.8, tpot_p99_s=0.02, tokens_per_s=100.0, tpot_p50_s=0.01)
    step = rollout.step(
        inputs(status, now=T0 + timedelta(seconds=30), stable_sample=sample, canary_sample=sample)
    )
    assert step.status.canary is not None
    window = step.status.canary.window
    assert (window.stable.samples, window.canary.samples) == (1, 1)
    assert (window.canary.alpha, window.canary.p99) == (0.8, 0.02)
    assert step.actions == () and step.events == ()


def test_a_step_that_passes_moves_to_the_next_weight() -> None:
    status = serving(
        canary=canary_status(window=canary_window.replay(stable=samples(0.8, 12), canary=samples(0.8, 12)))
    )
    sample = Sample(alpha=0.8, tpot_p99_s=0.02, tokens_per_s=100.0, tpot_p50_s=0.01)
    now = T0 + timedelta(minutes=2)
    step = rollout.step(inputs(status, now=now, stable_sample=sample, canary_sample=sample))
    canary = step.status.canary
    assert canary is not None
    assert (canary.step, canary.weight, canary.step_started_at, canary.window) == (
        1,
        50,
        now,
        CanaryWindow(),
    )
    assert canary.last_analysis is not None and canary.last_analysis.verdict == "Pass"
    assert step.actions == (SetWeight(50),)
    assert [e.reason for e in step.events] == ["CanaryStepPassed", "CanaryStepStarted"]


def test_passing_the_last_step_promotes_the_draft_and_rolls_stable_after_the_write() -> None:
    canary = canary_status(
        step=1, weight=50, window=canary_window.replay(stable=samples(0.8, 12), canary=samples(0.8, 12))
    )
    sample = Sample(alpha=0.8, tpot_p99_s=0.02, tokens_per_s=100.0, tpot_p50_s=0.01)
    step = rollout.step(
        inputs(
            serving(canary=canary), now=T0 + timedelta(minutes=2), stable_sample=sample, canary_sample=sample
        )
    )
    assert step.status.canary is not None and step.status.canary.phase == "Promoting"
    assert step.status.canary.weight == 100
    assert step.status.draft.version == "v4" and step.status.draft.source == "Spec"
    assert step.actions == (SetWeight(100),)
    assert step.after_write == (RolloutStable(SPEC.draft),)


def test_a_worse_canary_holds_then_is_rolled_back_past_the_failure_limit() -> None:
    limit = SPEC.canary.analysis.failure_limit
    worse = canary_window.replay(stable=samples(0.8, 30), canary=samples(0.5, 30))
    sample = Sample(alpha=0.5, tpot_p99_s=0.02, tokens_per_s=100.0, tpot_p50_s=0.01)
    now = T0 + timedelta(minutes=2)

    def judged(failures: int) -> rollout.CanaryStep:
        canary = canary_status(window=worse).model_copy(
            update={"counters": canary_status().counters.model_copy(update={"failures": failures})}
        )
        return rollout.step(
            inputs(
                serving(canary=canary),
                now=now,
                stable_sample=replace(sample, alpha=0.8),
                canary_sample=sample,
            )
        )

    held = judged(limit - 1)
    assert held.status.canary is not None and held.status.canary.counters.failures == limit
    assert held.status.canary.window == CanaryWindow() and held.status.canary.step_started_at == now
    assert held.actions == () and [e.reason for e in held.events] == ["CanaryAnalysisFailed"]
    ended = judged(limit)
    assert ended.status.canary is None and ended.finished == "RolledBack"
    assert ended.status.last_canary is not None
    assert (
        ended.status.last_canary.reason == "CanaryFailureLimitExceeded" and ended.status.last_canary.evidence
    )
    assert ended.actions == (SetWeight(0), DeleteCanary())


def test_a_metrics_outage_pauses_judgement_without_advancing_or_rolling_back() -> None:
    broken = [Sample(ok=False) for _ in range(12)]
    status = serving(
        canary=canary_status(
            window=canary_window.replay(stable=samples(0.8, 6) + broken, canary=samples(0.8, 6) + broken)
        )
    )
    step = rollout.step(
        inputs(
            status,
            now=T0 + timedelta(minutes=2),
            stable_sample=Sample(ok=False),
            canary_sample=Sample(ok=False),
        )
    )
    assert step.status.canary is not None and step.status.canary.step == 0
    assert step.actions == ()
    assert [u.reason for u in step.updates] == ["CanaryMetricsUnavailable"]


def test_a_long_step_keeps_status_a_few_kb_and_its_medians_in_view() -> None:
    # Given a step whose bake runs 2,000 intervals of noisy readings (no two alike)
    rng = random.Random(7)
    status = serving(canary=canary_status())
    for tick in range(2000):
        stable, canary = (
            Sample(
                alpha=rng.uniform(0.6, 0.9),
                tpot_p99_s=rng.uniform(0.02, 0.05),
                tpot_p50_s=rng.uniform(0.009, 0.012),
            )
            for _ in range(2)
        )
        status = rollout.step(
            inputs(
                status, now=T0 + timedelta(seconds=tick * 0.01), stable_sample=stable, canary_sample=canary
            )
        ).status
    # Then the canary's block stays under 3 KB (every histogram full), with every reading counted
    wire = status.to_wire()
    assert len(json.dumps(wire["canary"])) < 3072, len(json.dumps(wire["canary"]))
    assert status.canary is not None
    window = status.canary.window
    assert (window.stable.samples, window.canary.samples) == (2000, 2000)
    assert canary_window.usable(window.canary) == 2000
    assert len(canary_window.parse_bins(window.canary.alpha_bins)) == canary_window.MAX_BINS
    # and the medians shown are those of the readings (to the bins' resolution)
    assert window.canary.alpha == pytest.approx(0.75, abs=0.02)
    assert window.canary.p99 == pytest.approx(0.035, abs=0.003)


# ---------------------------------------------------------------- promotion and manual gates


def test_promotion_waits_for_the_stable_rollout_then_removes_the_canary() -> None:
    status = serving(canary=canary_status(phase="Promoting", weight=100, promotion_evidence="alpha held"))
    waiting = rollout.step(inputs(status, stable_rolled_out=False))
    assert waiting.status.canary == status.canary and waiting.actions == (RolloutStable(SPEC.draft),)
    done = rollout.step(inputs(status, stable_rolled_out=True))
    assert done.status.canary is None and done.finished == "Promoted"
    assert done.actions == (SetWeight(0), DeleteCanary())
    assert [(u.type, u.status, u.reason) for u in done.updates] == [
        ("CanaryRollout", "False", "CanaryPromoted")
    ]


def test_abort_and_promote_annotations_act_once_and_are_cleared_after_they_took_effect() -> None:
    # The annotation goes last: when a route write or a delete fails, the next tick acts on it again.
    status = serving(canary=canary_status())
    aborted = rollout.step(inputs(status, action="abort"))
    assert aborted.actions == (SetWeight(0), DeleteCanary(), ClearAction())
    assert aborted.status.last_canary is not None and aborted.status.last_canary.reason == "CanaryAborted"
    promoted = rollout.step(inputs(status, action="promote"))
    assert promoted.actions == (SetWeight(100), ClearAction())
    assert promoted.status.canary is not None and promoted.status.canary.phase == "Promoting"


@pytest.mark.parametrize("action", ["abort", "promote"])
def test_an_action_set_while_no_canary_runs_is_removed_with_a_warning_and_spares_the_next_canary(
    action: str,
) -> None:
    # Given a stray specops.dev/canary-action while the spec draft serves and no canary runs
    idle = serving(observed_spec_draft="v4@pvc://engines/d/v4")
    cleared = rollout.step(inputs(idle, action=action))
    # Then it is removed unacted on, and an Event says so
    assert cleared.status == idle and cleared.actions == (ClearAction(),)
    assert [(e.type, e.reason) for e in cleared.events] == [("Warning", "CanaryActionIgnored")]
    assert f"canary-action: {action} ignored" in cleared.events[0].message
    # And a canary starting at that tick starts as it would without it: the action does not end it
    started = rollout.step(inputs(serving(), action=action))
    assert started.status.canary is not None and started.status.canary.phase == "LosslessCheck"
    assert started.actions == (ApplyCanary(SPEC.draft, receives_traffic=False), ClearAction())
    assert [e.reason for e in started.events] == ["CanaryStarted", "CanaryActionIgnored"]


def test_a_paused_canary_holds_everything() -> None:
    status = serving(canary=canary_status())
    step = rollout.step(inputs(status, paused=True, now=T0 + timedelta(hours=1)))
    assert step.status.canary is not None and step.status.canary.paused
    assert step.actions == () and step.status.canary.step == 0
    resumed = rollout.step(inputs(step.status, now=T0 + timedelta(seconds=5)))
    assert resumed.status.canary is not None and not resumed.status.canary.paused


def test_a_canary_whose_objects_are_gone_is_rendered_again_instead_of_waiting_forever() -> None:
    # A rollback ran its actions but its status write was lost: status still says LosslessCheck
    checking = serving(canary=canary_status(phase="LosslessCheck", step=-1, weight=0, lossless_check=None))
    step = rollout.step(inputs(checking, lossless=None, canary_missing=True))
    assert step.actions == (ApplyCanary(SPEC.draft, receives_traffic=False),)
    progressing = serving(canary=canary_status())
    step = rollout.step(inputs(progressing, canary_sample=Sample(ok=False), canary_missing=True))
    assert step.actions == (ApplyCanary(SPEC.draft, receives_traffic=True), SetWeight(10))
    # the bake goes on; the new pods warm up before their next sample
    assert progressing.canary is not None
    bake_ends = T0 + timedelta(minutes=1)  # the step's pause from the new pods' start (no warm-up here)
    assert step.status.canary == progressing.canary.model_copy(
        update={"traffic_started_at": T0, "judge_at": bake_ends}
    )


def test_judgement_resumes_at_once_after_a_metrics_outage() -> None:
    # Given a step that baked 12 healthy ticks, then a 30-tick outage of both variants, then recovery
    outage = [Sample(ok=False) for _ in range(30)]
    status = serving(
        canary=canary_status(
            window=canary_window.replay(
                stable=samples(0.8, 12) + outage + samples(0.8, 1),
                canary=samples(0.8, 12) + outage + samples(0.8, 1),
            )
        )
    )
    sample = Sample(alpha=0.8, tpot_p99_s=0.02, tokens_per_s=100.0, tpot_p50_s=0.01)
    # When the second healthy tick arrives
    step = rollout.step(
        inputs(status, now=T0 + timedelta(minutes=2), stable_sample=sample, canary_sample=sample)
    )
    # Then the step is judged on the healthy ticks (it passes) instead of waiting for the outage to age out
    assert step.status.canary is not None and step.status.canary.step == 1
    assert [e.reason for e in step.events] == ["CanaryStepPassed", "CanaryStepStarted"]


def test_ticks_at_which_only_the_canary_was_missing_still_count_against_it() -> None:
    missing = [Sample(ok=False) for _ in range(20)]
    status = serving(
        canary=canary_status(
            window=canary_window.replay(stable=samples(0.8, 32), canary=samples(0.8, 12) + missing)
        )
    )
    sample = Sample(alpha=0.8, tpot_p99_s=0.02, tokens_per_s=100.0, tpot_p50_s=0.01)
    step = rollout.step(
        inputs(status, now=T0 + timedelta(minutes=2), stable_sample=sample, canary_sample=sample)
    )
    assert step.status.canary is not None and step.status.canary.step == 0  # not advanced on thin evidence
    analysis = step.status.canary.last_analysis
    assert analysis is not None and analysis.verdict != "Pass"


# ---------------------------------------------------------------- warm-up: a full rate window of traffic first

GOOD = Sample(alpha=0.8, tpot_p99_s=0.02, tokens_per_s=100.0, tpot_p50_s=0.01)
WINDOW_S = 60.0


def test_traffic_starts_the_warm_up_when_the_lossless_check_passes() -> None:
    status = serving(canary=canary_status(phase="LosslessCheck", step=-1, weight=0, lossless_check=None))
    later = T0 + timedelta(seconds=7)
    step = rollout.step(inputs(status, now=later, lossless=LosslessPassed(), warm_up_s=WINDOW_S))
    assert step.status.canary is not None and step.status.canary.traffic_started_at == later


def test_a_canary_takes_no_samples_until_its_pods_served_traffic_for_a_full_rate_window() -> None:
    # Given a canary whose pods began to serve at T0 (what the rate window holds is still mostly before)
    status = serving(canary=canary_status(traffic_started_at=T0))
    # When ticks arrive within the first rate window, then one just after it
    young = rollout.step(
        inputs(
            status,
            now=T0 + timedelta(seconds=59),
            stable_sample=GOOD,
            canary_sample=GOOD,
            warm_up_s=WINDOW_S,
        )
    )
    warm = rollout.step(
        inputs(
            status,
            now=T0 + timedelta(seconds=60),
            stable_sample=GOOD,
            canary_sample=GOOD,
            warm_up_s=WINDOW_S,
        )
    )
    # Then only the tick after a full window is a sample, of both variants
    assert young.status.canary is not None and young.status.canary.window == CanaryWindow()
    assert warm.status.canary is not None
    assert (warm.status.canary.window.canary.samples, warm.status.canary.window.stable.samples) == (1, 1)


def test_the_first_steps_bake_counts_from_the_end_of_the_warm_up() -> None:
    # Given a first step of pause 1m whose pods began to serve at T0, with a sample each tick since the warm-up
    status = serving(
        canary=canary_status(
            traffic_started_at=T0,
            window=canary_window.replay(stable=samples(0.8, 29), canary=samples(0.8, 29)),
        )
    )
    # When the pause has passed since the step began, but not since the warm-up ended
    early = rollout.step(
        inputs(
            status,
            now=T0 + timedelta(seconds=90),
            stable_sample=GOOD,
            canary_sample=GOOD,
            warm_up_s=WINDOW_S,
        )
    )
    # Then the step only collects; a full pause after the warm-up, it is judged
    assert early.status.canary is not None and early.status.canary.last_analysis is None
    judged = rollout.step(
        inputs(
            status,
            now=T0 + timedelta(seconds=120),
            stable_sample=GOOD,
            canary_sample=GOOD,
            warm_up_s=WINDOW_S,
        )
    )
    assert judged.status.canary is not None and judged.status.canary.step == 1


def test_judgement_resumes_within_two_intervals_after_a_long_outage() -> None:
    # Given a first step baked on 12 healthy ticks (15 s apart), past its pause
    interval = timedelta(seconds=15)
    status = serving(
        canary=canary_status(
            traffic_started_at=T0 - timedelta(minutes=5),
            step_started_at=T0 - timedelta(minutes=3),
            window=canary_window.replay(stable=samples(0.8, 12), canary=samples(0.8, 12)),
        )
    )
    now = T0
    # When metrics are out for 15 minutes (60 ticks), judgement pauses every tick, never advancing
    for _ in range(60):
        now += interval
        step = rollout.step(
            inputs(
                status, now=now, stable_sample=Sample(ok=False), canary_sample=Sample(ok=False), warm_up_s=60
            )
        )
        status = step.status
        assert status.canary is not None and status.canary.step == 0
        assert status.canary.last_analysis is not None and status.canary.last_analysis.verdict == "Error"
    # Then once they are back, the step is judged again within two intervals (not after ~3x the outage)
    ticks = 0
    while status.canary is not None and status.canary.step == 0:
        ticks += 1
        assert ticks <= 2, status.canary.last_analysis
        now += interval
        status = rollout.step(
            inputs(status, now=now, stable_sample=GOOD, canary_sample=GOOD, warm_up_s=60)
        ).status
    assert status.canary is not None and status.canary.step == 1


# ---------------------------------------------------------------- the first draft: checked before speculation


def first_draft(check: str | None = "Pending") -> SpeculativeDeploymentStatus:
    """A resource just created (or deleted and created again): its spec draft serves, unchecked."""
    return serving(
        observed_spec_draft="v4@pvc://engines/d/v4",
        draft=DraftStatus(model=V4.model, version="v4", uri=V4.uri, source="Spec", lossless_check=check),
    )


def test_the_first_draft_waits_for_a_stable_pod_to_run_its_golden_prompts() -> None:
    step = rollout.step(inputs(first_draft(), lossless=None))
    assert step.status == first_draft() and step.actions == () and step.events == ()


def test_a_first_draft_check_that_cannot_run_backs_off_and_then_says_why() -> None:
    # Given a first draft whose stable pod answers its golden prompts with errors, try after try
    interval_s = parse_duration(SPEC.metrics.interval)
    status, now = first_draft(), T0
    waits, reasons, warned = [], [], []
    for _ in range(12):
        assert rollout.first_check_due(status, now)
        step = rollout.step(inputs(status, now=now, lossless=LosslessUnrunnable("HTTP 503: loading")))
        status = step.status
        retry_at = status.draft.lossless_retry_at
        assert retry_at is not None and not rollout.first_check_due(status, now)
        waits.append((retry_at - now).total_seconds())
        reasons.append([u.reason for u in step.updates])
        warned.append([(e.type, e.reason) for e in step.events])
        now = retry_at

    # Then each retry waits twice as long as the last, at most 10 minutes, and never gives up
    assert waits[:3] == [interval_s, 2 * interval_s, 4 * interval_s]
    assert max(waits) == 600.0 and waits[-1] == 600.0
    assert status.draft.lossless_check == "Pending" and status.draft.lossless_attempts == 12
    # and from the third try a condition carries the pod's error, with one Warning Event
    assert reasons[:2] == [[], []] and all(r == ["LosslessCheckUnrunnable"] for r in reasons[2:])
    assert warned[2] == [("Warning", "LosslessCheckUnrunnable")] and not any(warned[:2] + warned[3:])
    assert "HTTP 503: loading" in step.updates[0].message

    # When it finally runs and passes, the tries are forgotten and the condition says so
    passed = rollout.step(inputs(status, now=now, lossless=LosslessPassed()))
    assert passed.status.draft.lossless_check == "Passed"
    assert (passed.status.draft.lossless_attempts, passed.status.draft.lossless_retry_at) == (None, None)
    assert [(u.status, u.reason) for u in passed.updates] == [("False", "LosslessCheckPassed")]


def test_a_first_draft_that_passes_its_lossless_check_may_speculate() -> None:
    step = rollout.step(inputs(first_draft(), lossless=LosslessPassed()))
    assert step.status.draft.lossless_check == "Passed" and step.status.canary is None
    assert [e.reason for e in step.events] == ["LosslessCheckPassed"]


def test_a_first_draft_that_changes_greedy_output_never_speculates() -> None:
    step = rollout.step(inputs(first_draft(), lossless=LosslessDiffers("golden prompt #1 differs")))
    assert step.status.draft.lossless_check == "Failed" and step.status.canary is None
    assert [(e.type, e.reason) for e in step.events] == [("Warning", "NotLossless")]
    assert [(u.type, u.status, u.reason) for u in step.updates] == [("CanaryRollout", "False", "NotLossless")]
    assert "golden prompt #1 differs" in step.events[0].message


def test_no_canary_starts_before_the_first_draft_is_checked() -> None:
    # spec.draft changed again while the first draft's check has not run yet
    status = first_draft().model_copy(update={"observed_spec_draft": V3})
    step = rollout.step(inputs(status))
    assert step.status.canary is None and step.actions == ()


def test_a_new_draft_takes_the_place_of_a_first_draft_that_failed_and_is_checked_in_turn() -> None:
    # Given a first draft v3 that failed its check (speculation never went on), when spec.draft names v4
    failed = serving(
        draft=DraftStatus(
            model="llama-3.1-8b-draft",
            version="v3",
            uri="pvc://models/llama-70b-draft/v3",
            source="Spec",
            lossless_check="Failed",
        )
    )
    step = rollout.step(inputs(failed))
    # Then no canary (nothing to compare with): v4 serves on the stable pods, pending its own check
    assert step.status.canary is None
    assert (step.status.draft.version, step.status.draft.lossless_check) == ("v4", "Pending")
    assert step.status.observed_spec_draft == "v4@pvc://engines/d/v4"
    assert step.after_write == (RolloutStable(SPEC.draft),)
    assert [e.reason for e in step.events] == ["DraftReplaced"]
    assert (step.finished, step.source) == ("Promoted", "Spec")  # in service: retraining counts it current


def test_a_promoted_canary_records_its_draft_as_checked() -> None:
    last_step = canary_status(
        step=1, window=canary_window.replay(stable=samples(0.8, 12), canary=samples(0.8, 12))
    )
    status = serving(canary=last_step)
    step = rollout.step(inputs(status, now=T0 + timedelta(minutes=2), stable_sample=GOOD, canary_sample=GOOD))
    assert step.status.canary is not None and step.status.canary.phase == "Promoting"
    assert (step.status.draft.version, step.status.draft.lossless_check) == ("v4", "Passed")


def test_a_trained_draft_takes_the_place_of_a_failed_first_draft_and_retraining_counts_it_current() -> None:
    failed = first_draft("Failed")
    trained = V4.model_copy(update={"version": "v4-rt1", "uri": "pvc://engines/d/v4-rt1"})
    step = rollout.step(inputs(failed, candidate=trained))
    assert step.status.canary is None
    assert (step.status.draft.version, step.status.draft.source) == ("v4-rt1", "Retraining")
    assert step.status.draft.lossless_check == "Pending"
    assert step.status.observed_spec_draft == failed.observed_spec_draft
    assert (step.finished, step.source) == ("Promoted", "Retraining")


# ---------------------------------------------------------------- spec edits mid-canary

V4_KEY = "v4@pvc://engines/d/v4"
V3_DRAFT = DraftSpec(
    model="llama-3.1-8b-draft", version="v3", parameters="7B", uri="pvc://models/llama-70b-draft/v3"
)
V5 = V4.model_copy(update={"version": "v5", "uri": "pvc://engines/d/v5"})
V5_KEY = "v5@pvc://engines/d/v5"
PASSING = Sample(alpha=0.8, tpot_p99_s=0.02, tokens_per_s=100.0, tpot_p50_s=0.01)


def spec_naming(draft: DraftSpec) -> Any:
    return SPEC.model_copy(update={"draft": draft})


def mid_canary(phase: str) -> SpeculativeDeploymentStatus:
    """The canary of v4 (spec.draft was edited from v3 to v4) in `phase`, as the machine left it."""
    if phase == "LosslessCheck":
        return serving(
            observed_spec_draft=V4_KEY,
            canary=canary_status(phase="LosslessCheck", step=-1, weight=0, lossless_check=None),
        )
    if phase == "Progressing":
        return serving(observed_spec_draft=V4_KEY, canary=canary_status())
    # Promoting: the last step passed; status.draft names v4, the stable pods have not rolled yet
    last = canary_status(
        step=1, weight=50, window=canary_window.replay(stable=samples(0.8, 12), canary=samples(0.8, 12))
    )
    promoting = rollout.step(
        inputs(
            serving(observed_spec_draft=V4_KEY, canary=last),
            now=T0 + timedelta(minutes=2),
            stable_sample=PASSING,
            canary_sample=PASSING,
        )
    ).status
    assert promoting.canary is not None and promoting.canary.phase == "Promoting"
    return promoting


def edited(status: SpeculativeDeploymentStatus, draft: DraftSpec, **changes: Any) -> rollout.CanaryStep:
    """This tick's step once spec.draft names `draft`, with inputs that would otherwise move the canary on."""
    return rollout.step(
        inputs(
            status,
            spec=spec_naming(draft),
            now=T0 + timedelta(minutes=3),
            lossless=LosslessPassed(),
            stable_sample=PASSING,
            canary_sample=PASSING,
            stable_rolled_out=False,
            **changes,
        )
    )


PHASES = ["LosslessCheck", "Progressing", "Promoting"]


@pytest.mark.parametrize("phase", PHASES)
def test_a_revert_to_the_stable_draft_mid_canary_aborts_it_without_promoting_or_rejecting(phase: str) -> None:
    status = mid_canary(phase)
    step = edited(status, V3_DRAFT)
    # The canary ends here: weight back to stable, its objects gone, never promoted
    assert step.status.canary is None
    assert step.actions[:2] == (SetWeight(0), DeleteCanary())
    assert SetWeight(100) not in step.actions and RolloutStable(V4) not in (*step.actions, *step.after_write)
    assert step.finished != "Promoted"
    # The stable variant serves v3 (rolled back onto it when the promotion had begun)
    assert step.status.draft.version == "v3" and step.status.draft.uri == V3_DRAFT.uri
    expected_after = (RolloutStable(rollout.drafts.stable_draft(V3_DRAFT, step.status)),)
    assert step.after_write == (expected_after if phase == "Promoting" else ())
    # v3 is not rejected (it was never canaried), and the spec's draft is the one acted on
    assert step.status.rejected_draft is None
    assert step.status.observed_spec_draft == V3
    assert step.status.last_canary is not None
    assert (step.status.last_canary.draft, step.status.last_canary.result) == ("v4", "Superseded")
    # Why, said once in the condition and an Event naming both drafts
    [event] = step.events
    assert (event.type, event.reason) == ("Normal", "CanarySuperseded")
    assert "v4" in event.message and "v3" in event.message
    assert [(u.status, u.reason) for u in step.updates] == [("False", "CanarySuperseded")]
    # And nothing starts afterwards: v3 serves and spec names v3
    after = rollout.step(inputs(step.status, spec=spec_naming(V3_DRAFT), now=T0 + timedelta(minutes=4)))
    assert after.status.canary is None and not after.changed


@pytest.mark.parametrize("phase", PHASES)
def test_an_edit_to_a_third_draft_mid_canary_starts_its_canary_from_the_stable(phase: str) -> None:
    step = edited(mid_canary(phase), V5)
    canary = step.status.canary
    assert canary is not None
    assert (canary.phase, canary.source, canary.draft.version, canary.weight) == (
        "LosslessCheck",
        "Spec",
        "v5",
        0,
    )
    # v4 is taken out of traffic and removed, and the v5 canary is rendered held out of traffic
    assert step.actions == (SetWeight(0), DeleteCanary(), ApplyCanary(V5, receives_traffic=False))
    assert RolloutStable(V4) not in step.after_write and step.finished != "Promoted"
    # v5 is compared with the stable draft v3; v4 was neither promoted nor rejected
    assert step.status.draft.version == "v3"
    assert step.status.rejected_draft is None
    assert step.status.observed_spec_draft == V5_KEY
    assert [e.reason for e in step.events] == ["CanarySuperseded", "CanaryStarted"]
    assert "v4" in step.events[0].message and "v5" in step.events[0].message


def test_an_edit_back_to_a_rejected_draft_mid_canary_aborts_the_canary_and_the_draft_stays_rejected() -> None:
    v2 = V4.model_copy(update={"version": "v2", "uri": "pvc://engines/d/v2"})
    status = mid_canary("Progressing").model_copy(update={"rejected_draft": "v2@pvc://engines/d/v2"})
    step = edited(status, v2)
    assert step.status.canary is None and step.finished != "Promoted"
    assert step.actions == (SetWeight(0), DeleteCanary())
    assert step.status.draft.version == "v3"
    assert step.status.rejected_draft == "v2@pvc://engines/d/v2"
    # Not tried again while spec.draft names it
    after = rollout.step(inputs(step.status, spec=spec_naming(v2), now=T0 + timedelta(minutes=4)))
    assert after.status.canary is None and not after.changed


def test_a_spec_edit_supersedes_a_retraining_candidates_canary_which_is_not_rejected() -> None:
    trained = V4.model_copy(update={"version": "v4-rt1", "uri": "pvc://engines/d/v4-rt1"})
    candidate_canary = canary_status(
        source="Retraining",
        draft=DraftStatus(
            model=trained.model, version="v4-rt1", parameters="7B", uri=trained.uri, source="Retraining"
        ),
    )
    status = serving(canary=candidate_canary)  # spec.draft still named v3 when it started
    # Unchanged spec: the candidate's canary goes on
    kept = edited(status, V3_DRAFT, candidate=trained)
    assert kept.status.canary is not None and kept.status.canary.draft.version == "v4-rt1"
    # A person names v5: the candidate's canary ends unpromoted, v5's canary starts from the stable
    step = edited(status, V5, candidate=trained)
    assert step.status.canary is not None and step.status.canary.draft.version == "v5"
    assert step.status.canary.source == "Spec"
    assert step.status.rejected_draft is None and step.status.draft.version == "v3"
    # Retraining is not told the candidate failed: it waits for its canary after v5's
    assert step.finished is None
    assert step.events[0].reason == "CanarySuperseded" and "v4-rt1" in step.events[0].message


def test_a_spec_edit_overrides_a_promote_annotation_and_clears_it() -> None:
    step = edited(mid_canary("Progressing"), V3_DRAFT, action="promote")
    assert step.status.canary is None and step.status.draft.version == "v3"
    assert step.actions == (SetWeight(0), DeleteCanary(), ClearAction())


# ---------------------------------------------------------------- after a rollback: retry, and saying so

V4_KEY = "v4@pvc://engines/d/v4"


def rolled_back() -> SpeculativeDeploymentStatus:
    """spec.draft names v4, whose canary rolled back; v3 serves."""
    status = rollout.step(inputs(serving(canary=canary_status()), action="abort")).status
    assert status.rejected_draft == V4_KEY and status.canary is None
    return status


def test_after_a_rollback_a_condition_says_the_spec_draft_is_not_the_one_serving() -> None:
    status = rolled_back()
    update = rollout.spec_draft_condition(SPEC, status)
    assert (update.type, update.status, update.reason) == ("DraftRejected", "True", "SpecDraftRejected")
    assert (
        "spec.draft names draft v4, which a canary rolled back (CanaryAborted); draft v3 serves"
        in update.message
    )
    # a canary in progress, or the spec's draft serving, is not a rejection
    running = rollout.spec_draft_condition(SPEC, serving(canary=canary_status()))
    assert (running.status, running.reason) == ("False", "SpecDraftPending")
    assert "draft v3 serves until a canary promotes it" in running.message
    promoted = serving(draft=DraftStatus(model=V4.model, version="v4", parameters="7B", uri=V4.uri))
    assert rollout.spec_draft_condition(SPEC, promoted).reason == "SpecDraftServing"


def test_retry_runs_the_rejected_drafts_canary_again_and_clears_the_annotation() -> None:
    status = rolled_back()
    # without the annotation a rejected draft is not tried again
    assert rollout.step(inputs(status)).status.canary is None
    retried = rollout.step(inputs(status, action="retry"))
    canary = retried.status.canary
    assert canary is not None and (canary.phase, canary.draft.version, canary.source) == (
        "LosslessCheck",
        "v4",
        "Spec",
    )
    assert retried.status.rejected_draft is None
    assert retried.actions == (ApplyCanary(SPEC.draft, receives_traffic=False), ClearAction())
    assert "started again by specops.dev/canary-action: retry" in retried.events[0].message
    # with nothing rejected (a canary running) the tick goes on as usual and only the annotation goes
    running = serving(canary=canary_status())
    plain = rollout.step(
        inputs(running, now=T0 + timedelta(seconds=10), stable_sample=GOOD, canary_sample=GOOD)
    )
    again = rollout.step(
        inputs(
            running, now=T0 + timedelta(seconds=10), stable_sample=GOOD, canary_sample=GOOD, action="retry"
        )
    )
    assert again.status == plain.status and again.actions == (*plain.actions, ClearAction())


def test_a_promotion_records_the_draft_it_replaced_for_undo() -> None:
    replaced = serving().draft
    status = serving(canary=canary_status(phase="Promoting", weight=100, replaces=replaced))
    done = rollout.step(inputs(status, stable_rolled_out=True))
    assert done.status.previous_draft == replaced
