"""Generate the SpeculativeDeployment CRD from the pydantic models.

pydantic's JSON Schema is close to, but not, a Kubernetes structural schema:
it uses $ref/$defs, anyOf with null for optional fields, titles, and no
defaults for nested blocks built by default_factory. `structural()` rewrites it:
every $ref inlined, optional fields plain (absent rather than null), titles
dropped, `default: {}` on blocks whose fields all have defaults (so the API
server fills the whole tree), and the CEL rules kept where the models put them.

Run `python -m specops.api.crd OUT.yaml` (or `make crds`); a test fails when the
checked-in file differs from what this produces.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from specops.api import models

_DROP_KEYS = {"title"}
_OPTIONAL_MARK = "x-specops-optional"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Ready condition: serving pods up with the intended setting",
    },
    {
        "name": "Speculation",
        "type": "string",
        "jsonPath": ".status.speculation.state",
        "description": "Whether the stable pods run a speculating revision",
    },
    {
        "name": "Schedule",
        "type": "string",
        "jsonPath": ".status.speculation.schedule",
        "description": "The revision in force: plain, or the draft-length schedule the engine applies",
    },
    {
        "name": "Draft",
        "type": "string",
        "jsonPath": ".status.draft.version",
        "description": "Draft in service",
    },
    {
        "name": "SpecDraft",
        "type": "string",
        "jsonPath": ".status.specDraft",
        "description": "spec.draft's version: alone when it serves, else with canary, rejected (a canary "
        "rolled it back) or pending",
    },
    {
        "name": "Accept",
        "type": "number",
        "jsonPath": ".status.observed.alpha",
        "description": "Per-token acceptance alpha",
    },
    {
        "name": "P99",
        "type": "string",
        "jsonPath": ".status.observed.perTokenLatencyP99",
        "description": "Per-token latency p99",
    },
    {
        "name": "Weight",
        "type": "integer",
        "jsonPath": ".status.canary.weight",
        "description": "Percent of traffic on the canary draft (empty when no canary runs)",
    },
    {
        "name": "Speedup",
        "type": "number",
        "jsonPath": ".status.speculation.measuredSpeedup",
        "description": "Measured speedup over the baseline",
        "priority": 1,
    },
    {
        "name": "BreakEven",
        "type": "integer",
        "jsonPath": ".status.speculation.calibration.breakEvenBatch",
        "description": "Learned batch per pod from which speculation no longer pays (empty: none up to 1024)",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        target.update(siblings)  # the field's own description/default win over the model's
        return _resolve(target, defs)
    if "anyOf" in node:
        options = [opt for opt in node["anyOf"] if opt != {"type": "null"}]
        if len(options) == 1:
            merged = {k: v for k, v in node.items() if k != "anyOf"}
            merged.update(options[0])
            merged[_OPTIONAL_MARK] = True  # absent means "not set": never default it to {}
            if merged.get("default", "absent") is None:
                merged.pop("default")
            return _resolve(merged, defs)
    return {key: _resolve(value, defs) for key, value in node.items() if key not in _DROP_KEYS}


def _all_defaulted(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "object" and "properties" in schema and not schema.get("required")


def _finish(node: Any) -> Any:
    """Post-order pass: object blocks with only optional fields default to {}; enums get a type."""
    if isinstance(node, list):
        return [_finish(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _finish(value) for key, value in node.items()}
    if "properties" in node:
        node.setdefault("type", "object")
        for prop in node["properties"].values():
            optional = prop.pop(_OPTIONAL_MARK, False)
            if _all_defaulted(prop) and "default" not in prop and not optional:
                prop["default"] = {}
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    if "const" in node:
        node["enum"] = [node.pop("const")]
        node.setdefault("type", "string")
    if node.get("additionalProperties") is True:
        node.pop("additionalProperties")
        node["x-kubernetes-preserve-unknown-fields"] = True
    if node.get("type") == "object" and "properties" not in node and "additionalProperties" not in node:
        node["x-kubernetes-preserve-unknown-fields"] = True
    return {key: node[key] for key in sorted(node, key=_key_rank)}


_KEY_ORDER = ["description", "type", "default", "enum", "required"]


def _key_rank(key: str) -> tuple[int, str]:
    """Readable YAML: description and type first, properties and rules last."""
    if key in _KEY_ORDER:
        return (_KEY_ORDER.index(key), key)
    if key in ("properties", "items", "x-kubernetes-validations"):
        return (99, key)
    return (50, key)


def structural(model: type[models.ApiModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return dict(_finish(_resolve(raw, defs)))


def build_crd() -> dict[str, Any]:
    spec_schema = structural(models.SpeculativeDeploymentSpec)
    status_schema = structural(models.SpeculativeDeploymentStatus)
    status_schema.pop("default", None)
    spec_schema["description"] = "Desired state: target and draft models, serving, speculation, SLOs."
    status_schema["description"] = "Observed state written by the operator; never edit by hand."
    schema = {
        "type": "object",
        "description": "A target model served with a draft model for speculative decoding, tuned at run time.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "specops.dev/v1alpha1"},
            "kind": {"type": "string", "description": "SpeculativeDeployment"},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": {
                        "type": "string",
                        "description": "A DNS-1123 subdomain; specops derives every child name from it.",
                        "maxLength": models.RESOURCE_NAME_MAX,
                        "pattern": models.RESOURCE_NAME_PATTERN,
                    }
                },
            },
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{models.PLURAL}.{models.GROUP}",
            "labels": {"app.kubernetes.io/name": "specops", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": models.GROUP,
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": list(models.SHORT_NAMES),
                "categories": ["specops", "all"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def render_yaml() -> str:
    header = "# Generated by `make crds` from operator/specops/api/models.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(arg.startswith("-") for arg in args):
        print("usage: python -m specops.api.crd [FILE ...]  (print the CRD, or write it to each FILE)")
        return 0 if set(args) <= {"-h", "--help"} else 2
    text = render_yaml()
    if not args:
        sys.stdout.write(text)
        return 0
    for out in args:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
