"""The generated CRD's schema and CEL rules, applied as the API server would (test-side admission)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from specops_local.admission import AdmissionError, CrdAdmission

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "specops.dev_speculativedeployments.yaml").read_text())
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.yaml"))


def admit(body: dict[str, Any], old: dict[str, Any] | None = None) -> dict[str, Any]:
    return CrdAdmission(CRD)("UPDATE" if old else "CREATE", copy.deepcopy(body), old)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_admitted_and_defaulted(path: Path) -> None:
    admitted = admit(yaml.safe_load(path.read_text()))
    spec = admitted["spec"]
    # the server fills every block the example leaves out, with the same defaults as the models
    assert [step["weight"] for step in spec["canary"]["steps"]] == [5, 10, 25, 50, 100]
    assert spec["canary"]["analysis"] == {
        "confidence": 0.95,
        "failureLimit": 2,
        "inconclusiveLimit": 3,
        "consecutiveErrorLimit": 4,
    }
    assert spec["serving"]["backend"] == "triton"
    assert (
        spec["retraining"]["enabled"] is False and "acceptanceBelowSLO" not in spec["retraining"]["triggers"]
    )


def _example() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docs" / "examples" / "dense-70b-7b.yaml").read_text())


@pytest.mark.parametrize(
    ("steps", "ok"),
    [
        ([5, 10, 25, 50, 100], True),
        ([100], True),
        ([10, 10], False),
        ([50, 25], False),
        ([5, 10, 25, 20], False),
    ],
)
def test_canary_weights_must_increase(steps: list[int], ok: bool) -> None:
    body = _example()
    body["spec"]["canary"] = {"steps": [{"weight": w} for w in steps]}
    if ok:
        admit(body)
    else:
        with pytest.raises(AdmissionError, match=r"spec\.canary\.steps"):
            admit(body)


@pytest.mark.parametrize(
    ("length", "ok"),
    [
        ({"initial": 4, "min": 1, "max": 8}, True),
        ({"initial": 1, "min": 1, "max": 1}, True),
        ({"initial": 0, "min": 1, "max": 8}, False),
        ({"initial": 6, "min": 1, "max": 5}, False),
    ],
)
def test_draft_length_bounds(length: dict[str, int], ok: bool) -> None:
    body = _example()
    body["spec"]["speculation"]["draftLength"] = length
    if ok:
        admit(body)
    else:
        with pytest.raises(AdmissionError, match=r"spec\.speculation\.draftLength"):
            admit(body)


def test_immutable_target_model_only_on_update() -> None:
    old = admit(_example())
    changed = copy.deepcopy(old)
    changed["spec"]["target"]["model"] = "another-model"
    admit(changed)  # a create with any model is fine
    with pytest.raises(AdmissionError, match=r"spec\.target\.model"):
        admit(changed, old)
    version_bump = copy.deepcopy(old)
    version_bump["spec"]["target"]["version"] = "2026-12-01"
    admit(version_bump, old)  # the version may change: that is what retraining follows
