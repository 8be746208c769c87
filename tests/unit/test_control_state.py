"""The control loop's state survives a round trip through status (so a restart resumes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from specops.api.models import SpeculativeDeployment
from specops.domain.metrics import Measurement
from specops.domain.policy import Baseline, Decision, PolicyState
from specops.services.control import decision_status, observation_from, policy_config, state_from_status

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "dense-70b-7b.yaml"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def spec():
    return SpeculativeDeployment.model_validate(yaml.safe_load(EXAMPLE.read_text())).spec


def test_policy_config_clips_lengths_to_engine_and_reads_durations() -> None:
    config = policy_config(spec())
    assert (config.min_length, config.initial_length, config.max_length) == (1, 4, 8)
    assert config.baseline_duration_s == 600 and config.soak_duration_s == 1800
    assert config.setup.gpu.name == "H100" and config.setup.tensor_parallel == 4
    assert config.setup.target_params == 70e9 and config.setup.draft_params == 7e9


def test_fresh_status_starts_in_baseline() -> None:
    state = state_from_status({}, policy_config(spec()), T0)
    assert state.phase == "Baseline" and not state.enabled and state.phase_since == T0


def test_state_round_trips_through_status() -> None:
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
    status = decision_status(decision, observation_from(measurement), measurement, T0)
    status["phase"] = "Dynamic"
    restored = state_from_status(status, policy_config(spec()), T0 + timedelta(hours=1))
    assert restored == state
    assert status["speculation"]["state"] == "on" and status["speculation"]["draftLength"] == 3
    assert status["observed"]["perTokenLatencyP99"] == "20ms"
    assert status["speculation"]["measuredSpeedup"] == round(0.0213 / 0.01, 3)


def test_acceptance_condition_follows_the_smoothed_alpha() -> None:
    from dataclasses import replace

    from specops.services.control import acceptance_condition

    state = PolicyState("Dynamic", T0, True, 4, 0.42, None, None)
    low = Decision(state, 4, "BestModelledSpeedup", "m", 1.2, False)
    assert (acceptance_condition(low, 0.5).status, acceptance_condition(low, 0.5).reason) == (
        "True",
        "AcceptanceBelowSLO",
    )
    high = replace(low, state=replace(state, alpha=0.74))
    assert acceptance_condition(high, 0.5).status == "False"
    off = replace(low, num_draft_tokens=0)
    assert acceptance_condition(off, 0.5).status == "Unknown"


def test_only_measurements_moving_is_not_a_significant_status_change() -> None:
    from specops.services.control import _significant_change

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
    measurements_moved = {
        "phase": "Dynamic",
        "speculation": {
            "state": "on",
            "draftLength": 4,
            "reason": "BestModelledSpeedup",
            "smoothedAlpha": 0.72,
        },
        "observed": {"alpha": 0.74, "at": "2026-11-29T12:00:15Z"},
    }
    assert not _significant_change(measurements_moved, live)
    length_changed = {
        **measurements_moved,
        "speculation": {**measurements_moved["speculation"], "draftLength": 5},
    }
    assert _significant_change(length_changed, live)
    assert _significant_change({**measurements_moved, "phase": "Fixed"}, live)
