"""The CRD is generated from the models, structural, documented, and checked in unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from specops.api.crd import build_crd, render_yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "specops.dev_speculativedeployments.yaml"


def _walk(node: Any, path: str = ""):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.get("properties", {}).items():
            yield from _walk(value, f"{path}.{key}")
        if "items" in node:
            yield from _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _walk(node["additionalProperties"], f"{path}{{}}")


def _schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_checked_in_crd_matches_the_models() -> None:
    # Given the models, when the CRD is generated, then it equals the file in crds/ (run `make crds`).
    assert CRD_PATH.read_text() == render_yaml(), "crds/ is stale: run `make crds`"


INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def test_schema_is_structural_with_no_refs_or_nullable_unions() -> None:
    text = yaml.safe_dump(_schema())
    assert "$ref" not in text and "$defs" not in text and "null" not in text
    for path, node in _walk(_schema()):
        if "anyOf" in node:  # the one union a structural schema allows: int-or-string (quantities)
            assert node["anyOf"] == INT_OR_STRING and node.get("x-kubernetes-int-or-string"), path
            continue
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{path} has no type"


def test_every_spec_and_status_field_has_a_description_for_kubectl_explain() -> None:
    schema = _schema()
    for root in ("spec", "status"):
        for path, node in _walk(schema["properties"][root], root):
            if not path.endswith(("[]", "{}")):  # list items and map values are explained by their field
                assert node.get("description"), f"{path} has no description"


def test_optional_blocks_default_so_the_server_fills_the_tree() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["speculation"]["default"] == {}
    assert spec["speculation"]["properties"]["draftLength"]["properties"]["initial"]["default"] == 4
    # an optional trigger must stay absent unless set: defaulting it would switch it on
    triggers = spec["retraining"]["properties"]["triggers"]["properties"]
    assert "default" not in triggers["acceptanceBelowSLO"]


def test_names_status_subresource_and_printer_columns() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == "speculativedeployments.specops.dev"
    assert crd["spec"]["names"]["shortNames"] == ["sdep"]
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    for wanted in ("Phase", "Speculation", "Schedule", "Draft", "Accept", "P99", "Age"):
        assert wanted in columns


def test_cel_rules_cover_cross_field_constraints() -> None:
    rules = [
        rule["rule"] for _, node in _walk(_schema()) for rule in node.get("x-kubernetes-validations", [])
    ]
    assert any("self.draft.parameters" in r and "self.target.parameters" in r for r in rules)
    assert any("checkpointFetcherImage" in r for r in rules)
    assert any("self.method == 'mtp'" in r for r in rules)
    assert any("self.min <= self.initial" in r for r in rules)
    assert any("self.steps[0].weight < self.steps[1].weight" in r for r in rules)
    assert sum(r == "self == oldSelf" for r in rules) >= 3
