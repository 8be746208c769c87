"""Values that used to pass admission and then break the operator are refused at admission.

Each case is applied with the generated CRD (the API server's defaulting, schema and CEL
rules, replayed by CrdAdmission) and with the pydantic models the operator reads bodies with,
which must agree: a resource that got past an older CRD still gets InvalidSpec, not a crash.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from specops.api.models import TEMPLATE_KINDS, SpeculativeDeployment
from specops.domain import lifecycle
from specops.domain.retraining import SUPPORTED_KINDS
from specops_local.admission import AdmissionError, CrdAdmission

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "specops.dev_speculativedeployments.yaml").read_text())


def example() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docs" / "examples" / "dense-70b-7b.yaml").read_text())


def with_value(path: str, value: Any) -> dict[str, Any]:
    body = example()
    node = body
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return body


def admission_fields(body: dict[str, Any]) -> list[str]:
    try:
        CrdAdmission(CRD)("CREATE", copy.deepcopy(body), None)
    except AdmissionError as error:
        return [cause.field for cause in error.causes]
    return []


REFUSED = [
    ("spec.target.parameters", "0"),
    ("spec.target.parameters", "0.0B"),
    ("spec.draft.parameters", "1" * 400),  # float() of this is inf
    ("spec.target.parameters", "9e99"),
    ("spec.target.activeParameters", "0"),
    ("spec.metrics.interval", "0s"),
    ("spec.metrics.interval", "1ms"),
    ("spec.metrics.interval", "2h"),
    ("spec.metrics.interval", "9" * 400 + "s"),
    ("spec.speculation.rollout.baseline", "25h"),
    ("spec.speculation.rollout.soak", "48h"),
    ("spec.speculation.reconfigure.minInterval", "1000h"),
    ("spec.speculation.reconfigure.minGain", 2),
    ("spec.serving.backend", "tensorrt"),
    ("spec.draft.method", "eagle"),
    ("spec.target.uri", "file:///models/t"),
    ("spec.draft.parameters", "70B"),
    ("spec.slo.perTokenLatencyP99", "0ms"),
    ("spec.slo.perTokenLatencyP99", "5m"),
    ("spec.retraining.data", {"uri": "not a uri"}),
    ("spec.retraining.template", {"apiVersion": "v1", "kind": "Pod", "spec": {}}),
    ("spec.retraining.template", {"spec": {}}),
    ("spec.retraining.triggers.acceptanceBelowSLO", {"for": "1s"}),
    ("spec.retraining.triggers.acceptanceBelowSLO", {"cooldown": "1000h"}),
    ("spec.canary.steps", [{"weight": 50, "pause": "30h"}]),
    ("metadata.name", "Llama_3"),
    ("spec.serving.podLabels", {"team": "x" * 64}),
    ("spec.serving.nodeSelector", {"pool": "has space"}),
]


@pytest.mark.parametrize(("path", "value"), REFUSED, ids=[f"{p}={str(v)[:20]}" for p, v in REFUSED])
def test_values_that_break_the_operator_are_refused_at_admission(path: str, value: Any) -> None:
    body = with_value(path, value)

    fields = admission_fields(body)

    assert fields, f"{path}={value!r} was admitted"
    top = path.split(".")[1] if path.startswith("spec.") else "metadata"
    assert any(top in field for field in fields) or "<nil>" in fields, fields
    if path.startswith("spec.") and "template" not in path:
        # (a template of another kind that got past an older CRD is refused when the round renders,
        # naming spec.retraining.template.kind, so serving goes on)
        with pytest.raises(ValidationError):
            SpeculativeDeployment.model_validate(body)


ADMITTED = [
    ("spec.metrics.interval", "1s"),
    ("spec.metrics.interval", "1h"),
    ("spec.metrics.interval", "1m30s"),
    ("spec.draft.parameters", "0.5B"),
    ("spec.target.parameters", "70e9"),
    ("spec.speculation.rollout.baseline", "0s"),
    ("spec.slo.perTokenLatencyP99", "4.99ms"),
    ("spec.retraining.data", {"uri": "s3://prompts/chat/"}),
    ("spec.retraining.template", {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {}}),
    ("metadata.name", "llama-3.1-70b"),
    ("metadata.name", "70b-chat"),
]


@pytest.mark.parametrize(("path", "value"), ADMITTED, ids=[f"{p}={str(v)[:20]}" for p, v in ADMITTED])
def test_sensible_values_at_the_bounds_are_admitted(path: str, value: Any) -> None:
    body = with_value(path, value)

    assert admission_fields(body) == []
    SpeculativeDeployment.model_validate(body)


def test_the_crd_allows_exactly_the_template_kinds_the_operator_supports() -> None:
    assert set(TEMPLATE_KINDS) == {(kind.api_version, kind.kind) for kind in SUPPORTED_KINDS}


def test_draft_equal_to_target_is_a_warning_condition_not_a_refusal() -> None:
    body = example()
    body["spec"]["draft"]["model"] = body["spec"]["target"]["model"]
    assert admission_fields(body) == []

    spec = SpeculativeDeployment.model_validate(body).spec
    mismatch = next(update for update in lifecycle.advisories(spec) if update.type == "DraftMismatch")

    assert (mismatch.status, mismatch.reason) == ("True", "DraftIsTarget")
    assert spec.target.model in mismatch.message
