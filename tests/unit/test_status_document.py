"""Status is a typed document: what the previous version wrote still loads, and nothing is untyped.

The files under tests/data/status/ were recorded from the previous operator version's end-to-end
runs (mid-canary during a metrics outage, after a NotLossless rollback, mid-retraining round).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from specops.api.crd import build_crd
from specops.api.status import SpeculativeDeploymentStatus
from specops.domain import phases
from specops.domain.retraining import RetrainingState

RECORDED = Path(__file__).resolve().parents[1] / "data" / "status"


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / f"v0.1-{name}.json").read_text())
    return data


@pytest.mark.parametrize("name", ["canary", "rollback", "retraining"])
def test_status_written_by_the_previous_version_loads_and_survives_a_round_trip(name: str) -> None:
    status = SpeculativeDeploymentStatus.from_wire(recorded(name))
    again = SpeculativeDeploymentStatus.from_wire(json.loads(json.dumps(status.to_wire())))
    assert again == status
    assert phases.derive_phase("Serving", status) == recorded(name)["phase"]


def test_a_recorded_canary_reads_as_typed_values() -> None:
    raw = recorded("canary")
    status = SpeculativeDeploymentStatus.from_wire(raw)
    canary = status.canary
    assert canary is not None and canary.phase == "Progressing"
    assert canary.step == raw["canary"]["step"] and canary.traffic_routing == raw["canary"]["trafficRouting"]
    assert canary.step_started_at is not None and canary.step_started_at.tzinfo is not None
    assert canary.last_analysis is not None and canary.last_analysis.verdict == "Error"
    # raw samples are no longer kept: a canary recorded with them resumes its step from an empty window
    assert raw["canary"]["samples"]["canary"] and canary.window.canary.samples == 0
    assert "samples" not in status.to_wire()["canary"]
    assert status.baseline.per_token_latency_p50 == pytest.approx(0.045)
    assert status.draft.version == raw["draft"]["version"]


def test_a_recorded_rollback_and_retraining_round_read_as_typed_values() -> None:
    rollback = SpeculativeDeploymentStatus.from_wire(recorded("rollback"))
    assert rollback.canary is None and rollback.last_canary is not None
    assert (rollback.last_canary.result, rollback.last_canary.reason) == ("RolledBack", "NotLossless")
    assert rollback.rejected_draft == recorded("rollback")["rejectedDraft"]

    raw = recorded("retraining")
    status = SpeculativeDeploymentStatus.from_wire(raw)
    state = RetrainingState.from_status(status.retraining, default_target_version="unused")
    assert state.active is not None and state.active.job_name == raw["retraining"]["active"]["jobName"]
    assert state.active.started_at == datetime.fromisoformat(raw["retraining"]["active"]["startedAt"])
    assert state.active.started_at.astimezone(UTC).tzinfo is UTC


def test_no_block_of_status_is_untyped_and_every_field_is_documented() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    undocumented: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        assert "x-kubernetes-preserve-unknown-fields" not in node or "properties" in node, path
        if not node.get("description"):
            undocumented.append(path)
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}")
        items = node.get("items")
        if isinstance(items, dict) and items.get("properties"):
            walk(items, f"{path}[]")

    walk(schema, "status")
    assert not undocumented, undocumented
    for block in ("canary", "retraining", "lastCanary"):
        assert "properties" in schema["properties"][block], block
    canary = schema["properties"]["canary"]["properties"]
    assert {"window", "judgeAt", "nextWeight", "counters", "lastAnalysis", "stepStartedAt"} <= canary.keys()
