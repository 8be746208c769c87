"""Render and lint charts/specops with helm-python-sdk (Helm's Go SDK, no helm binary), for the chart tests."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from specops_local.admission import CrdAdmission
from specops_local.upstream_crds import upstream_crd

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "specops"
RELEASE, NAMESPACE = "specops", "specops-system"

RUNBOOK = "https://git.example.com/platform/specops/-/blob/main/docs/runbook.md"
MONITORING_ON: dict[str, Any] = {
    "monitoring": {
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True, "runbookBaseUrl": RUNBOOK},
        "dashboard": {"enabled": True},
    }
}


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object ``helm install`` would create (CRDs aside), in template order."""
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: list[dict[str, Any]] = []
    for template, text in sorted(manifests.items()):
        if template.endswith("NOTES.txt"):
            continue
        objects += [document for document in yaml.safe_load_all(text) if document]
    return objects


def notes(values: dict[str, Any] | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for template, text in manifests.items() if template.endswith("NOTES.txt"))


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [obj for obj in objects if obj["kind"] == kind and name in (None, obj["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def rule_groups(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The alert groups of the rendered PrometheusRule (monitoring on unless ``values`` say otherwise)."""
    rule = one(render(values or MONITORING_ON), "PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


@cache
def upstream_admission(group: str, kind: str) -> CrdAdmission:
    """Admission through the upstream CRD of (group, kind), from operator/specops_local/upstream-crds/."""
    return CrdAdmission(upstream_crd(group, kind))
