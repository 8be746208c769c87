"""The upstream CRDs (Gateway API, prometheus-operator, JobSet, Kubeflow Trainer) for the emulated API server.

Registered like any CRD, so every write of an HTTPRoute, ServiceMonitor, PodMonitor,
PrometheusRule, JobSet or TrainJob is defaulted and checked against the real schema and CEL
rules (specops_local/admission.py), as a cluster with those projects installed would. The files
are copies of the upstream releases in operator/specops_local/upstream-crds/ (versions in its README).
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import yaml

UPSTREAM_CRDS = Path(__file__).resolve().parent / "upstream-crds"


@cache
def _load() -> tuple[dict[str, Any], ...]:
    paths = sorted(UPSTREAM_CRDS.glob("*.yaml"))
    if not paths:
        raise FileNotFoundError(f"no upstream CRDs in {UPSTREAM_CRDS}")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader: these files are large
    return tuple(yaml.load(path.read_text(), Loader=loader) for path in paths)


def upstream_crds() -> list[dict[str, Any]]:
    """Every upstream CRD with only its storage version (fresh copies: the emulator keeps what it is given).

    The emulator stores each served version apart and converts nothing, so a CRD serving v1 and
    v1beta1 would hold two disjoint sets of objects; specops uses the storage version of each.
    """
    crds = []
    for crd in _load():
        crd = copy.deepcopy(crd)
        crd["spec"]["versions"] = [version for version in crd["spec"]["versions"] if version.get("storage")]
        crds.append(crd)
    return crds


def upstream_crd(group: str, kind: str) -> dict[str, Any]:
    for crd in upstream_crds():
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind:
            return crd
    raise KeyError(f"no upstream CRD for {kind}.{group} in {UPSTREAM_CRDS}")
