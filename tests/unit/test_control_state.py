"""The control loop's state survives a round trip through typed status (so a restart resumes)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from specops.api.models import SpeculativeDeployment, SpeculativeDeploymentSpec
from specops.api.status import BaselineStatus, PodsApplied, SpeculationStatus, SpeculativeDeploymentStatus
from specops.domain import control_status as cs
from specops.domain import perf
from specops.domain.engines.schedule import PLAIN, Revision, Schedule
from specops.domain.revision_step import (
    Baseline,
    Decision,
    StepInputs,
    StepState,
    config_from_spec,
    initial_state,
    restart_cost,
    routes_holdback,
    step,
)
from specops.domain.status_patch import merge_patch, only_volatile

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "dense-70b-7b.yaml"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SPEC_REVISION = Revision(
    mode="spec", method="draftModel", draft="v3-5c99b768", schedule=Schedule.of([[16, 4], [64, 1], [None, 0]])
)
"""Drafting with the example's draft (its identity: version and a hash of its checkpoint)."""


def spec() -> SpeculativeDeploymentSpec:
    return SpeculativeDeployment.model_validate(yaml.safe_load(EXAMPLE.read_text())).spec


class Flat:
    """A curve that pays 1.5x at every batch and length (the step's decisions are not its subject here)."""

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        return 1.5 if draft_length else 1.0


def test_the_step_config_reads_the_spec() -> None:
    config = config_from_spec(spec(), spec().draft)
    assert (config.min_k, config.initial_k, config.max_k) == (1, 4, 8)
    assert config.baseline_s == 300 and config.soak_s == 600 and config.min_interval_s == 1800
    assert config.min_gain == 0.03 and config.method == "draftModel"
    assert config.setup.gpu.name == "H100" and config.setup.tensor_parallel == 4
    assert config.setup.target_params == 70e9 and config.setup.draft_params == 7e9
    assert config.off_reason is None


def test_fresh_status_starts_its_baseline_with_one_pod_held_back_plain() -> None:
    config = config_from_spec(spec(), spec().draft)
    assert config.replicas >= 2
    state = cs.state_from_status(SpeculationStatus(), BaselineStatus(), config, Flat(), T0)
    assert state.phase == "Baseline" and state.holdback and state.phase_since == T0
    assert state.revision.mode == "spec"  # the others speculate on the prior from the start
    one = config_from_spec(
        spec().model_copy(update={"serving": spec().serving.model_copy(update={"replicas": 1})}), spec().draft
    )
    state = cs.state_from_status(SpeculationStatus(), BaselineStatus(), one, Flat(), T0)
    assert state.phase == "Baseline" and state.revision == PLAIN and not state.holdback


def test_state_round_trips_through_the_wire_form_of_status() -> None:
    config = config_from_spec(spec(), spec().draft)
    state = StepState(
        phase="Dynamic",
        phase_since=T0,
        revision=SPEC_REVISION,
        last_change=T0 + timedelta(minutes=3),
        alpha=0.7412,
        batch_seconds=(0.0, 12.5, 30.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),
        decided_at=T0 + timedelta(minutes=4),
        baseline=Baseline(p50_s=0.0213, p95_s=0.0251, p99_s=0.0302, tokens_per_s=5400.0, samples=12),
    )
    decision = Decision(state, SPEC_REVISION, "AlreadyServing", "m", gain=0.0, predicted_speedup=2.1)
    inputs = StepInputs(batch=37.5, alpha=0.74, tpot_p50_s=0.01, tpot_p99_s=0.02)
    status = SpeculativeDeploymentStatus(
        phase="Dynamic",
        speculation=cs.speculation_status(
            decision, inputs, T0 + timedelta(minutes=4), PodsApplied(desired=2, applied=2), None
        ),
        baseline=cs.baseline_status(state, BaselineStatus()),
    )
    wire = status.to_wire()
    assert wire["speculation"]["state"] == "on" and wire["speculation"]["draftLength"] == 4
    assert wire["speculation"]["schedule"] == "draftModel K=4 to batch 16, K=1 to batch 64, K=0 above 64"
    assert wire["speculation"]["revision"]["digest"] == SPEC_REVISION.digest
    assert wire["speculation"]["revision"]["schedule"][0] == {"maxBatch": 16, "k": 4}
    assert wire["baseline"]["perTokenLatencyP50"] == "21.3ms"
    assert wire["speculation"]["measuredSpeedup"] == round(0.0213 / 0.01, 3)

    loaded = SpeculativeDeploymentStatus.from_wire(yaml.safe_load(yaml.safe_dump(wire)))
    restored = cs.state_from_status(
        loaded.speculation, loaded.baseline, config, Flat(), T0 + timedelta(hours=1)
    )
    assert restored == state


def test_a_promoted_draft_keeps_the_schedule_and_takes_the_revision_its_pods_run() -> None:
    config = config_from_spec(spec(), spec().draft)
    before = cs.revision_to_status(
        Revision(mode="spec", method="draftModel", draft="v2-old", schedule=SPEC_REVISION.schedule)
    )
    speculation = SpeculationStatus(revision=before, control_phase="Dynamic", phase_since=T0)
    restored = cs.state_from_status(speculation, BaselineStatus(), config, Flat(), T0)
    assert restored.revision == SPEC_REVISION  # the new draft's identity, the same schedule


def test_acceptance_condition_follows_the_smoothed_alpha_while_speculating() -> None:
    state = StepState("Dynamic", T0, SPEC_REVISION, alpha=0.42)
    assert (cs.acceptance_condition(state, 0.5).status, cs.acceptance_condition(state, 0.5).reason) == (
        "True",
        "AcceptanceBelowSLO",
    )
    assert cs.acceptance_condition(replace(state, alpha=0.74), 0.5).status == "False"
    assert cs.acceptance_condition(replace(state, revision=PLAIN), 0.5).status == "Unknown"


def test_a_stale_or_unchecked_draft_runs_plain_whatever_the_mode() -> None:
    for mode in ("auto", "on"):
        resource = spec().model_copy(
            update={"speculation": spec().speculation.model_copy(update={"mode": mode})}
        )
        config = config_from_spec(
            resource, resource.draft, off_reason="the draft has not passed its lossless check"
        )
        state = StepState("Dynamic", T0, SPEC_REVISION)
        decision = step(config, state, StepInputs(batch=2.0, alpha=0.8), Flat(), T0)
        assert (
            decision.changed and decision.state.revision == PLAIN and decision.reason == "SpeculationHeld"
        ), mode
        assert "lossless" in decision.message


def one_replica() -> SpeculativeDeploymentSpec:
    return spec().model_copy(update={"serving": spec().serving.model_copy(update={"replicas": 1})})


def test_one_plain_pod_with_a_paying_curve_waits_for_its_baseline_then_speculates() -> None:
    config = config_from_spec(one_replica(), spec().draft)
    state = StepState("Baseline", T0, PLAIN)
    for minute in range(0, 12):
        decision = step(
            config,
            state,
            StepInputs(batch=4, alpha=None, tpot_p50_s=0.02),
            Flat(),
            T0 + timedelta(minutes=minute),
        )
        state = decision.state
        if decision.changed:
            break
    assert minute == 5 and decision.changed  # after rollout.baseline (5m), not before
    assert state.phase == "Fixed" and state.revision.mode == "spec"
    assert decision.reason == "BaselineRecorded" and "plain p50 20.00 ms/token" in decision.message


def test_traffic_through_an_httproute_holds_one_pod_back_too() -> None:
    # the route names the stable Service: the control loop weights the holdback's Service beside it
    body = spec().model_dump(by_alias=True, exclude_none=True)
    body["canary"]["trafficRouting"] = {"gatewayAPI": {"httpRoute": "chat-route"}}
    routed = type(spec()).model_validate(body)
    config = config_from_spec(routed, routed.draft)
    assert config.replicas >= 2 and config.holdback
    assert routes_holdback(routed) and not routes_holdback(spec())


def test_plain_pods_whose_draft_passed_its_check_start_the_baseline_with_a_holdback_at_once() -> None:
    config = config_from_spec(spec(), spec().draft)
    decision = step(config, StepState("Baseline", T0, PLAIN), StepInputs(batch=4, alpha=None), Flat(), T0)
    assert decision.changed and decision.state.holdback and decision.state.revision.mode == "spec"
    assert "beside a plain holdback pod" in decision.message
    # not while a rollout runs: the pods are still moving
    waiting = step(
        config,
        StepState("Baseline", T0, PLAIN),
        StepInputs(batch=4, alpha=None, rollout_running=True),
        Flat(),
        T0,
    )
    assert not waiting.changed and not waiting.state.holdback


def test_the_holdback_ends_after_the_baseline_and_only_the_holdback_pod_restarts() -> None:
    config = config_from_spec(spec(), spec().draft)
    state = initial_state(config, Flat(), T0)
    assert state.holdback
    first = state.revision
    for minute in range(0, 12):
        inputs = StepInputs(batch=4, alpha=0.7, tpot_p50_s=0.012, plain_tpot_p50_s=0.02)
        decision = step(config, state, inputs, Flat(), T0 + timedelta(minutes=minute))
        state = decision.state
        if decision.changed:
            break
    assert minute == 5 and decision.reason == "BaselineRecorded"  # after rollout.baseline (5m)
    assert not state.holdback and state.phase == "Dynamic"
    assert state.revision == first  # a flat curve: nothing better, so only the holdback pod moves
    assert state.baseline.p50_s == 0.02  # the holdback pod's plain latency, not the fleet's
    assert "plain p50 20.00 ms/token on the holdback pod" in decision.message


class Better:
    """A curve on which K=6 pays 10 % more than the revision in force (K=4 to batch 16, K=1 to 64)."""

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        return {0: 1.0, 6: 1.65}.get(draft_length, 1.5)


@pytest.mark.parametrize(
    ("restart_s", "rolls"),
    [(60.0, True), (None, True), (600.0, False)],
    ids=["quick restarts pay back", "the assumed restart pays back", "slow restarts do not"],
)
def test_a_gain_rolls_out_only_when_it_pays_its_restarts_back(restart_s: float | None, rolls: bool) -> None:
    # minInterval 30 m; rollouts take pods down (no GPUs to surge on)
    config = replace(config_from_spec(spec(), spec().draft), restarts_down=True)
    state = StepState("Dynamic", T0, SPEC_REVISION, T0, 0.7, (), T0)
    later = T0 + timedelta(hours=1)
    inputs = StepInputs(batch=8, alpha=0.7, tpot_p50_s=0.01, restart_s=restart_s)
    decision = step(config, state, inputs, Better(), later)
    assert decision.changed == rolls
    if not rolls:  # every pod down 600 s of the next 30 minutes: a third of the time
        assert decision.reason == "GainBelowThreshold" and "+33.3%" in decision.message
    assert restart_cost(config, 2, 600.0) == pytest.approx(1 / 3)
    surging = replace(config, restarts_down=False)  # the old pods serve until the new are Ready
    assert restart_cost(surging, 2, 600.0) == 0.0
    assert step(surging, state, inputs, Better(), later).changed


def test_only_measurements_moving_is_not_a_significant_status_change() -> None:
    live = {
        "phase": "Dynamic",
        "speculation": {"state": "on", "draftLength": 4, "reason": "AlreadyServing", "smoothedAlpha": 0.70},
        "observed": {"alpha": 0.70, "at": "2026-11-29T12:00:00Z"},
    }
    moved = {
        "phase": "Dynamic",
        "speculation": {"state": "on", "draftLength": 4, "reason": "AlreadyServing", "smoothedAlpha": 0.72},
        "observed": {"alpha": 0.74, "at": "2026-11-29T12:00:15Z"},
    }
    assert merge_patch(live, moved) == {
        "speculation": {"smoothedAlpha": 0.72},
        "observed": {"alpha": 0.74, "at": "2026-11-29T12:00:15Z"},
    }
    assert only_volatile(merge_patch(live, moved))
    revision_changed = {**moved, "speculation": {**moved["speculation"], "draftLength": 2}}
    assert not only_volatile(merge_patch(live, revision_changed))
    assert not only_volatile(merge_patch(live, {**moved, "phase": "Fixed"}))


def test_a_condition_whose_message_alone_moved_waits_for_the_refresh_while_a_new_status_does_not() -> None:
    def acceptance(status: str, reason: str, message: str) -> dict[str, object]:
        return {
            "type": "AcceptanceBelowSLO",
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": "2026-11-29T12:00:00Z",
        }

    live = {"conditions": [acceptance("False", "AcceptanceOK", "per-token acceptance 0.81 >= 0.50")]}
    reread = {"conditions": [acceptance("False", "AcceptanceOK", "per-token acceptance 0.79 >= 0.50")]}
    fell = {"conditions": [acceptance("True", "AcceptanceLow", "per-token acceptance 0.41 < 0.50")]}
    assert only_volatile(merge_patch(live, reread), live)
    assert not only_volatile(merge_patch(live, fell), live)
    assert not only_volatile(merge_patch(live, {"conditions": []}), live)
    assert not only_volatile(merge_patch(live, reread))


def test_merge_patch_removes_what_the_new_status_no_longer_has() -> None:
    old = {"canary": {"phase": "Progressing", "step": 1}, "phase": "Canary"}
    new = {"phase": "Dynamic"}
    assert merge_patch(old, new) == {"canary": None, "phase": "Dynamic"}
    assert merge_patch(new, new) == {}


def test_perf_setup_is_the_roofline_of_the_spec() -> None:
    assert config_from_spec(spec(), spec().draft).setup.gpu == perf.GPUS["H100"]


def test_an_engine_that_runs_one_k_for_the_method_gets_constant_schedules() -> None:
    resource = spec().model_copy(update={"serving": spec().serving.model_copy(update={"backend": "sglang"})})
    config = config_from_spec(resource, resource.draft)  # draftModel: SGLang's STANDALONE does not adapt
    assert config.fixed_k
    state = StepState("Baseline", T0, PLAIN)
    for minute in range(0, 40):
        decision = step(
            config,
            state,
            StepInputs(batch=4, alpha=0.8, tpot_p50_s=0.02),
            Flat(),
            T0 + timedelta(minutes=minute),
        )
        state = decision.state
        if state.revision.schedule is not None:
            assert len(state.revision.schedule.bands) == 1, state.revision.describe()
    assert state.revision.mode == "spec"
    eagle = resource.model_copy(update={"draft": resource.draft.model_copy(update={"method": "eagle3"})})
    assert not config_from_spec(eagle, eagle.draft).fixed_k
