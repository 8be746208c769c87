"""The chart's alerts: promtool accepts the rendered groups, and promtool's rule unit tests show each
alert firing on a breach (with the resource in its summary) and staying quiet otherwise."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.chart import ROOT, rule_groups
from tests.unit.chart import RUNBOOK as RUNBOOK_URL

PROMTOOL = shutil.which("promtool")
RUNBOOK = ROOT / "docs" / "runbook.md"
CHAT = {"namespace": "ml", "name": "chat"}
OTHER = {"namespace": "ml", "name": "other"}


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    rendered = ", ".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{metric}{{{rendered}}}", "values": values}


def _condition(resource: dict[str, str], type_: str, status: str, reason: str) -> dict[str, str]:
    return {**resource, "type": type_, "status": status, "reason": reason}


# Each case: the alert, its input series (interval 1m unless given), when it fires and with which
# labels and $value text, and when it does not fire. The second resource never breaches.
CASES: dict[str, dict[str, Any]] = {
    "SpecopsAcceptanceBelowSLO": {
        "series": [
            _series("specops_acceptance_alpha", CHAT, "0.3x40"),
            _series("specops_slo_min_acceptance", CHAT, "0.5x40"),
            _series("specops_acceptance_alpha", OTHER, "0.7x40"),
            _series("specops_slo_min_acceptance", OTHER, "0.5x40"),
        ],
        "fires": ("20m", CHAT, "0.30"),
        "quiet": "10m",  # below the SLO for less than 15m: pending only
    },
    "SpecopsPerTokenLatencyAboveSLO": {
        "series": [
            _series("specops_per_token_latency_p99_seconds", CHAT, "0.06x30"),
            _series("specops_slo_per_token_latency_p99_seconds", CHAT, "0.045x30"),
            _series("specops_per_token_latency_p99_seconds", OTHER, "0.03x30"),
            _series("specops_slo_per_token_latency_p99_seconds", OTHER, "0.045x30"),
        ],
        "fires": ("15m", CHAT, "60ms"),
        "quiet": "5m",
    },
    "SpecopsSpeculationSlowerThanPlain": {
        "series": [
            _series("specops_measured_speedup_ratio", CHAT, "0.9x40"),
            _series("specops_speculation_enabled", CHAT, "1x40"),
            # slower, but speculation is off: nothing to alert on
            _series("specops_measured_speedup_ratio", OTHER, "0.9x40"),
            _series("specops_speculation_enabled", OTHER, "0x40"),
        ],
        "fires": ("20m", CHAT, "0.90"),
        "quiet": "10m",
    },
    "SpecopsSpeculationFlapping": {
        "interval": "5m",
        "series": [
            _series("specops_revision_rollouts_total", CHAT, "0+1x30"),  # 12 rollouts an hour
            _series("specops_revision_rollouts_total", OTHER, "0+0.25x30"),  # 3 an hour
        ],
        "fires": ("120m", CHAT, "12"),
        "quiet": "20m",  # not yet more than 6 in the window
    },
    "SpecopsAcceptanceCollapsed": {
        "series": [
            # one pod collapsed (and was deleted) at minute 10; the counter starts at 0 as the operator does
            _series("specops_acceptance_collapses_total", CHAT, "0x10 1x80"),
            _series("specops_acceptance_collapses_total", OTHER, "0x90"),
        ],
        "fires": ("15m", CHAT, "1"),
        "quiet": "5m",
    },
    "SpecopsDraftStale": {
        "series": [
            _series(
                "specops_condition", _condition(CHAT, "DraftStale", "True", "TargetVersionChanged"), "1x90"
            ),
            _series("specops_retraining_running", CHAT, "0x90"),
            # stale, but a round is running
            _series(
                "specops_condition", _condition(OTHER, "DraftStale", "True", "TargetVersionChanged"), "1x90"
            ),
            _series("specops_retraining_running", OTHER, "1x90"),
        ],
        "fires": ("70m", _condition(CHAT, "DraftStale", "True", "TargetVersionChanged"), ""),
        "quiet": "30m",
    },
    "SpecopsRetrainingFailed": {
        "series": [
            _series(
                "specops_condition", _condition(CHAT, "Retraining", "False", "RetrainingGaveUp"), "_x5 1x10"
            ),
            _series("specops_condition", _condition(OTHER, "Retraining", "False", "RetrainingIdle"), "1x15"),
        ],
        "fires": ("8m", _condition(CHAT, "Retraining", "False", "RetrainingGaveUp"), ""),
        "quiet": "3m",
    },
    "SpecopsCanaryRolledBack": {
        "series": [
            _series("specops_canary_rollbacks_total", CHAT, "0x5 1x60"),
            _series("specops_canary_rollbacks_total", OTHER, "0x65"),
        ],
        "fires": ("10m", CHAT, ""),
        "quiet": "4m",
    },
    "SpecopsMetricsUnavailable": {
        "series": [
            _series(
                "specops_condition",
                _condition(CHAT, "MetricsUnavailable", "True", "PrometheusUnreachable"),
                "1x30",
            ),
            _series(
                "specops_condition", _condition(OTHER, "MetricsUnavailable", "False", "MetricsOK"), "1x30"
            ),
        ],
        "fires": ("15m", _condition(CHAT, "MetricsUnavailable", "True", "PrometheusUnreachable"), ""),
        "quiet": "5m",
    },
    "SpecopsReconcileErrors": {
        "series": [_series("specops_reconcile_errors_total", {"kind": "KubeApiError"}, "0x10 1+1x30")],
        "fires": ("25m", {"kind": "KubeApiError"}, "10"),
        "quiet": "10m",
    },
    "SpecopsKubernetesApiErrors": {
        "series": [
            _series("specops_errors_total", {"component": "kubernetes", "kind": "Forbidden"}, "0x10 1+1x30"),
            _series("specops_errors_total", {"component": "prometheus", "kind": "Timeout"}, "0+1x40"),
        ],
        "fires": ("30m", {"kind": "Forbidden"}, "10"),
        "quiet": "12m",
    },
    "SpecopsOperatorAbsent": {
        "series": [_series("up", {"job": "specops-metrics", "instance": "10.0.0.7:8081"}, "1x10 0x20")],
        "fires": ("20m", {}, ""),  # absent() of a filtered series carries no labels
        "quiet": "9m",
    },
}


def _alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for group in rule_groups() for rule in group["rules"] if "alert" in rule}


def _expand(template: str, labels: dict[str, str], value: str) -> str:
    """What Prometheus makes of an annotation, for the few template forms the chart uses."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda match: labels[match.group(1)], template)
    text = re.sub(r'\{\{ \$value \| (printf "%\.\df"|humanizeDuration) \}\}', value, text)
    assert "{{" not in text, f"unexpanded template in {template!r}"
    return text


def _unit_tests(alerts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    tests = []
    for name, case in CASES.items():
        rule = alerts[name]
        at, labels, value = case["fires"]
        expected = {
            "exp_labels": {**labels, **rule["labels"]},
            "exp_annotations": {
                key: _expand(text, labels, value) for key, text in rule["annotations"].items()
            },
        }
        tests.append(
            {
                "name": name,
                "interval": case.get("interval", "1m"),
                "input_series": case["series"],
                "alert_rule_test": [
                    {"eval_time": case["quiet"], "alertname": name, "exp_alerts": []},
                    {"eval_time": at, "alertname": name, "exp_alerts": [expected]},
                ],
            }
        )
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if PROMTOOL is None:
        pytest.fail("promtool not found: `make install` installs Debian's prometheus package, which has it")
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_promtool_accepts_the_rendered_rule_groups(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    checked = _promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in checked.stdout


def test_every_alert_fires_on_its_breach_and_not_before(tmp_path: Path) -> None:
    alerts = _alerts()
    # Every alert in the chart has a case here, and every case an alert
    assert set(CASES) == set(alerts)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule_groups()}))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(_unit_tests(alerts), sort_keys=False))
    tested = _promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_unit_tests_catch_an_alert_that_never_fires(tmp_path: Path) -> None:
    # Given the acceptance alert made impossible (alpha below 0)
    groups = rule_groups()
    for group in groups:
        for rule in group["rules"]:
            if rule.get("alert") == "SpecopsAcceptanceBelowSLO":
                rule["expr"] = "specops_acceptance_alpha < 0"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(_unit_tests(_alerts()), sort_keys=False))
    # Then promtool's unit test fails, naming it
    tested = _promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert tested.returncode != 0
    assert "SpecopsAcceptanceBelowSLO" in tested.stdout + tested.stderr


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_alert_links_to_its_runbook_section_and_names_what_broke(name: str) -> None:
    rule = _alerts()[name]
    path, _, anchor = rule["annotations"]["runbook_url"].partition("#")
    assert path == RUNBOOK_URL  # monitoring.prometheusRule.runbookBaseUrl
    assert anchor in _anchors(RUNBOOK.read_text()), f"docs/runbook.md has no section #{anchor}"
    if "name" in CASES[name]["fires"][1]:
        for key in ("summary", "description"):
            assert "{{ $labels.namespace }}/{{ $labels.name }}" in rule["annotations"][key]
