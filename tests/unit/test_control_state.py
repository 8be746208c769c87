"""The control loop's state survives a round trip through typed status (so a restart resumes)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from specops.api.models import SpeculativeDeployment
from specops.api.status import BaselineStatus, PodsApplied, SpeculationStatus, SpeculativeDeploymentStatus
from specops.domain import control_status as cs
from specops.domain.metrics import Measurement
from specops.domain.policy import Baseline, Decision, PolicyState, decide
from specops.domain.status_patch import merge_patch, only_volatile

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "dense-70b-7b.yaml"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def spec():
    return SpeculativeDeployment.model_validate(yaml.safe_load(EXAMPLE.read_text())).spec


def test_policy_config_clips_lengths_to_engine_and_reads_durations() -> None:
    config = cs.policy_config(spec())
    assert (config.min_length, config.initial_length, config.max_length) == (1, 4, 8)
    assert config.baseline_duration_s == 600 and config.soak_duration_s == 1800
    assert config.setup.gpu.name == "H100" and config.setup.tensor_parallel == 4
    assert config.setup.target_params == 70e9 and config.setup.draft_params == 7e9
    assert not config.draft_stale_off


def test_fresh_status_starts_in_baseline() -> None:
    state = cs.state_from_status(SpeculationStatus(), BaselineStatus(), cs.policy_config(spec()), T0)
    assert state.phase == "Baseline" and not state.enabled and state.phase_since == T0


def test_state_round_trips_through_the_wire_form_of_status() -> None:
    state = PolicyState(
        phase="Dynamic",
        phase_since=T0,
        enabled=True,
        draft_length=3,
        alpha=0.7412,
        last_toggle=T0 + timedelta(minutes=3),
        baseline=Baseline(p50_s=0.0213, p95_s=0.0251, p99_s=0.0302, tokens_per_s=5400.0, samples=12),
        enable_evidence=1.25,
        evidence_at=T0 + timedelta(minutes=4),
    )
    decision = Decision(state, 3, "BestModelledSpeedup", "m", 2.1, False)
    measurement = Measurement(phase="Ok", at=T0, alpha=0.74, batch=37.5, tpot_p50_s=0.01, tpot_p99_s=0.02)
    observation = cs.observation_from(measurement)
    status = SpeculativeDeploymentStatus(
        phase="Dynamic",
        speculation=cs.speculation_status(decision, observation, T0, PodsApplied(desired=2, applied=2)),
        baseline=cs.baseline_status(state, BaselineStatus()),
        observed=cs.observed_status(measurement),
    )
    wire = status.to_wire()
    assert wire["speculation"]["state"] == "on" and wire["speculation"]["draftLength"] == 3
    assert wire["speculation"]["phaseSince"] == "2026-11-29T12:00:00Z"
    assert wire["observed"]["perTokenLatencyP99"] == "20ms"
    assert wire["baseline"]["perTokenLatencyP50"] == "21.3ms"
    assert wire["speculation"]["measuredSpeedup"] == round(0.0213 / 0.01, 3)

    loaded = SpeculativeDeploymentStatus.from_wire(yaml.safe_load(yaml.safe_dump(wire)))
    restored = cs.state_from_status(
        loaded.speculation, loaded.baseline, cs.policy_config(spec()), T0 + timedelta(hours=1)
    )
    assert restored == state


def test_acceptance_condition_follows_the_smoothed_alpha() -> None:
    state = PolicyState("Dynamic", T0, True, 4, 0.42, None, None)
    low = Decision(state, 4, "BestModelledSpeedup", "m", 1.2, False)
    assert (cs.acceptance_condition(low, 0.5).status, cs.acceptance_condition(low, 0.5).reason) == (
        "True",
        "AcceptanceBelowSLO",
    )
    high = replace(low, state=replace(state, alpha=0.74))
    assert cs.acceptance_condition(high, 0.5).status == "False"
    off = replace(low, num_draft_tokens=0)
    assert cs.acceptance_condition(off, 0.5).status == "Unknown"


def test_a_stale_draft_with_while_stale_off_is_an_input_of_the_policy() -> None:
    resource = spec().model_copy(
        update={"retraining": spec().retraining.model_copy(update={"while_stale": "off"})}
    )
    config = cs.policy_config(resource, draft_stale=True)
    state = PolicyState("Dynamic", T0, True, 4, 0.8, None, None)
    decision = decide(
        config, state, cs.observation_from(Measurement(phase="Ok", at=T0, batch=2.0, alpha=0.8)), T0
    )
    assert decision.num_draft_tokens == 0 and decision.reason == "SpeculationOffDraftStale"
    # keepIfAcceptanceHolds (the default) keeps speculating on a stale draft
    assert not cs.policy_config(spec(), draft_stale=True).draft_stale_off


def test_a_draft_that_has_not_passed_its_lossless_check_keeps_speculation_off_whatever_the_mode() -> None:
    for mode in ("auto", "on"):
        resource = spec().model_copy(
            update={"speculation": spec().speculation.model_copy(update={"mode": mode})}
        )
        config = cs.policy_config(resource, draft_unchecked=True)
        state = PolicyState("Dynamic", T0, True, 4, 0.8, None, None)
        observation = cs.observation_from(Measurement(phase="Ok", at=T0, batch=2.0, alpha=0.8))
        decision = decide(config, state, observation, T0)
        assert decision.num_draft_tokens == 0 and decision.reason == "SpeculationOffDraftUnchecked", mode
    assert not cs.policy_config(spec()).draft_unchecked_off


def test_only_measurements_moving_is_not_a_significant_status_change() -> None:
    live = {
        "phase": "Dynamic",
        "speculation": {
            "state": "on",
            "draftLength": 4,
            "reason": "BestModelledSpeedup",
            "smoothedAlpha": 0.70,
        },
        "observed": {"alpha": 0.70, "at": "2026-11-29T12:00:00Z"},
    }
    moved = {
        "phase": "Dynamic",
        "speculation": {
            "state": "on",
            "draftLength": 4,
            "reason": "BestModelledSpeedup",
            "smoothedAlpha": 0.72,
        },
        "observed": {"alpha": 0.74, "at": "2026-11-29T12:00:15Z"},
    }
    assert merge_patch(live, moved) == {
        "speculation": {"smoothedAlpha": 0.72},
        "observed": {"alpha": 0.74, "at": "2026-11-29T12:00:15Z"},
    }
    assert only_volatile(merge_patch(live, moved))
    length_changed = {**moved, "speculation": {**moved["speculation"], "draftLength": 5}}
    assert not only_volatile(merge_patch(live, length_changed))
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
    assert not only_volatile(merge_patch(live, {"conditions": []}), live)  # a condition gone
    assert not only_volatile(merge_patch(live, reread))  # without what it applies to: written


def test_a_probe_starting_or_ending_is_written_at_once_while_the_fit_alone_waits() -> None:
    live = {"speculation": {"draftLength": 0, "calibration": {"samples": 3, "probing": False}}}
    fitted = {"speculation": {"draftLength": 0, "calibration": {"samples": 4, "probing": False}}}
    assert only_volatile(merge_patch(live, fitted))
    probing = {
        "speculation": {
            "draftLength": 0,
            "calibration": {"samples": 4, "probing": True, "probeLength": 1, "probePods": ["p-1"]},
        }
    }
    assert not only_volatile(merge_patch(live, probing))  # pods now run 1 while draftLength says 0
    assert not only_volatile(merge_patch(probing, fitted))  # and back


def test_merge_patch_removes_what_the_new_status_no_longer_has() -> None:
    old = {"canary": {"phase": "Progressing", "step": 1}, "phase": "Canary"}
    new = {"phase": "Dynamic"}
    assert merge_patch(old, new) == {"canary": None, "phase": "Dynamic"}
    assert merge_patch(new, new) == {}
