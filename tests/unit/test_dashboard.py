"""The chart's Grafana dashboard: valid JSON, templated by namespace and resource, every panel's
PromQL parses (promtool) and names only metrics that the operator or specops's Triton model export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from specops.adapters.operator_metrics import OperatorMetrics
from tests.unit.chart import CHART, ROOT

DASHBOARD = CHART / "files" / "dashboard.json"
PROMTOOL = shutil.which("promtool")
KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
}


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _exprs() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"]) for panel in _dashboard()["panels"] for target in panel["targets"]
    ]


def _as_promql(expr: str) -> str:
    """Grafana's variables replaced by what they expand to with "All" selected."""
    return expr.replace("$__rate_interval", "5m").replace('"$namespace"', '".*"').replace('"$name"', '".*"')


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label matchers, ranges and grouping removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][\w:]*", text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group(0) in KEYWORDS:
            continue  # a function or an operator keyword
        names.add(match.group(0))
    return names


def _operator_series() -> set[str]:
    metrics = OperatorMetrics(CollectorRegistry())
    names = set()
    for family in metrics.registry.collect():
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
        if family.type == "histogram":
            names |= {f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    return names


def _triton_model_series() -> set[str]:
    """specops's Triton model metrics as docs/metrics.md lists them (the table of that section)."""
    section = (
        (ROOT / "docs" / "metrics.md")
        .read_text()
        .split("## specops's Triton model metrics", 1)[1]
        .split("\n## ", 1)[0]
    )
    names = set()
    for name, kind in re.findall(r"^\| `(specops_\w+)` \| (\w+) \|", section, flags=re.MULTILINE):
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    return names


def test_the_dashboard_is_templated_by_namespace_and_resource() -> None:
    variables = {variable["name"]: variable for variable in _dashboard()["templating"]["list"]}
    assert {"datasource", "namespace", "name"} <= set(variables)
    for title, expr in _exprs():
        if "specops_reconcile" in expr or "specops_errors" in expr or "control_tick" in expr:
            continue  # operator-wide panels
        assert "$namespace" in expr and "$name" in expr, title


def test_the_dashboard_shows_what_operators_ask_for() -> None:
    exprs = " ".join(expr for _, expr in _exprs())
    for metric in (
        "specops_speculation_enabled",
        "specops_draft_length",
        "specops_acceptance_alpha",
        "specops_slo_min_acceptance",
        "specops_running_requests_per_pod",
        "specops_time_per_output_token_seconds_bucket",
        "specops_slo_per_token_latency_p99_seconds",
        "specops_measured_speedup_ratio",
        "specops_predicted_speedup_ratio",
        "specops_canary_weight_ratio",
        "specops_decisions_total",
    ):
        assert metric in exprs, metric


def test_every_panel_query_parses(tmp_path: Path) -> None:
    if PROMTOOL is None:
        pytest.fail("promtool not found: `make install` installs Debian's prometheus package, which has it")
    rules = [{"record": f"panel:query{i}", "expr": _as_promql(expr)} for i, (_, expr) in enumerate(_exprs())]
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", "panels.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_panel_names_only_metrics_that_exist() -> None:
    known = _operator_series() | _triton_model_series()
    for title, expr in _exprs():
        unknown = metric_names(expr) - known
        assert not unknown, f"panel {title!r} queries {sorted(unknown)}, which nothing exports"


def test_the_metric_name_check_sees_through_functions_and_grouping() -> None:
    expr = 'histogram_quantile(0.99, sum by (le, pod) (rate(made_up_bucket{job="x", le!=""}[5m]))) > on (pod) other_metric'
    assert metric_names(expr) == {"made_up_bucket", "other_metric"}
