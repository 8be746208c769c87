"""Pure reconcile judgements: drift detection, readiness, advisories."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specops.api.models import SpeculativeDeployment
from specops.domain.lifecycle import advisories, is_subset, readiness

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def spec_of(name: str, **changes: dict) -> SpeculativeDeployment:
    body = yaml.safe_load((EXAMPLES / name).read_text())
    for block, values in changes.items():
        body["spec"][block].update(values)
    return SpeculativeDeployment.model_validate(body)


@pytest.mark.parametrize(
    ("desired", "live", "expected"),
    [
        ({"a": 1}, {"a": 1, "server": "default"}, True),
        ({"a": {"b": [1, 2]}}, {"a": {"b": [1, 2], "c": 0}}, True),
        ({"a": [{"x": 1}]}, {"a": [{"x": 1, "y": 2}]}, True),
        ({"a": [1, 2]}, {"a": [1]}, False),
        ({"a": 1}, {"a": 2}, False),
        ({"a": 1}, {}, False),
        ({"replicas": 2}, {"replicas": 2.0}, True),
        ({"flag": True}, {"flag": 1}, False),
    ],
)
def test_subset_means_nothing_to_write(desired: dict, live: dict, expected: bool) -> None:
    assert is_subset(desired, live) is expected


def _deployment(ready: int, updated: int | None = None, generation: int = 1, observed: int = 1) -> dict:
    return {
        "metadata": {"generation": generation},
        "status": {
            "readyReplicas": ready,
            "updatedReplicas": ready if updated is None else updated,
            "observedGeneration": observed,
        },
    }


def test_ready_when_all_replicas_ready_and_updated() -> None:
    state = readiness(2, [_deployment(2)])
    assert state.phase == "Serving"
    assert {c.type: (c.status, c.reason) for c in state.conditions}["Ready"] == ("True", "Serving")


def test_rollout_in_progress_stays_ready_and_progressing() -> None:
    state = readiness(2, [_deployment(2, generation=2, observed=1)])
    conditions = {c.type: (c.status, c.reason) for c in state.conditions}
    assert state.phase == "Serving"
    assert conditions["Ready"] == ("True", "Serving")
    assert conditions["Progressing"] == ("True", "RollingUpdate")


def test_no_ready_pod_is_pending() -> None:
    state = readiness(2, [_deployment(0)])
    conditions = {c.type: (c.status, c.reason) for c in state.conditions}
    assert state.phase == "Pending"
    assert conditions["Ready"] == ("False", "WaitingForPods")


def test_some_ready_pods_keep_serving_but_degraded() -> None:
    state = readiness(3, [_deployment(2, updated=3)])
    conditions = {c.type: (c.status, c.reason) for c in state.conditions}
    assert state.phase == "Serving"
    assert conditions["Ready"] == ("True", "Serving")
    assert conditions["Degraded"] == ("True", "ReplicasUnavailable")


def test_missing_deployment_is_pending() -> None:
    assert readiness(1, [None]).phase == "Pending"


def test_moe_target_with_dense_draft_is_flagged_not_refused() -> None:
    resource = spec_of("moe-expert-distilled.yaml", draft={"kind": "standalone"})
    mismatch = {c.type: c for c in advisories(resource.spec)}["DraftMismatch"]
    assert (mismatch.status, mismatch.reason) == ("True", "DenseDraftForMoE")
    assert "routing" in mismatch.message


def test_expert_distilled_draft_matches_moe() -> None:
    conditions = {c.type: c for c in advisories(spec_of("moe-expert-distilled.yaml").spec)}
    assert conditions["DraftMismatch"].status == "False"


@pytest.mark.parametrize(
    ("draft_parameters", "reason"),
    [("35B", "DraftTooLarge"), ("100M", "DraftTooSmall"), ("7B", "DraftSizeOK")],
)
def test_draft_size_advisory(draft_parameters: str, reason: str) -> None:
    resource = spec_of("dense-70b-7b.yaml", draft={"parameters": draft_parameters})
    size = {c.type: c for c in advisories(resource.spec)}["DraftSizeAdvisory"]
    assert size.reason == reason
    assert size.status == ("False" if reason == "DraftSizeOK" else "True")
