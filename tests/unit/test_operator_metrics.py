"""The operator's /metrics: gauges set from a status as stored, counters of what changed between two
statuses, series removed with the resource, durations and errors, and the HTTP endpoint itself."""

from __future__ import annotations

import copy
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specops.adapters import operator_metrics
from specops.adapters.kube import ConnectionSettings, KubeApiError, KubeClient
from specops.adapters.operator_metrics import OperatorMetrics, decision_action

STATUS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "status" / "canary-in-progress.json").read_text()
)
SPEC = {"slo": {"minAcceptance": 0.6, "perTokenLatencyP99": "45ms"}}
CHAT = {"namespace": "ml", "name": "chat"}


@pytest.fixture
def metrics() -> OperatorMetrics:
    return OperatorMetrics(CollectorRegistry())


def value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(
        name, {**CHAT, **labels} if "namespace" not in labels else labels
    )


def test_a_recorded_status_sets_every_per_resource_gauge(metrics: OperatorMetrics) -> None:
    metrics.observe_status("ml", "chat", STATUS, SPEC)
    expected = {
        "specops_speculation_enabled": 1.0,
        "specops_draft_length": 5.0,
        "specops_acceptance_alpha": 0.7801,
        "specops_smoothed_acceptance_alpha": 0.7712,
        "specops_acceptance_rate_ratio": 0.5412,
        "specops_running_requests_per_pod": 6.25,
        "specops_request_rate_per_second": 12.4,
        "specops_per_token_latency_p99_seconds": 0.036,
        "specops_baseline_per_token_latency_p50_seconds": 0.031,
        "specops_baseline_per_token_latency_p99_seconds": 0.044,
        "specops_predicted_speedup_ratio": 1.62,
        "specops_measured_speedup_ratio": 1.48,
        "specops_pods_desired": 4.0,
        "specops_pods_applied": 4.0,
        "specops_canary_active": 1.0,
        "specops_canary_weight_ratio": 0.25,
        "specops_canary_step": 2.0,
        "specops_retraining_round": 3.0,
        "specops_retraining_running": 1.0,
        "specops_retraining_consecutive_failures": 0.0,
        "specops_slo_min_acceptance": 0.6,
        "specops_slo_per_token_latency_p99_seconds": 0.045,
    }
    got = {name: value(metrics, name) for name in expected}
    assert got == pytest.approx(expected)
    assert value(metrics, "specops_phase", phase="Canary") == 1.0
    assert value(metrics, "specops_phase", phase="Dynamic") == 0.0
    assert (
        value(metrics, "specops_condition", type="DraftStale", status="True", reason="TargetVersionChanged")
        == 1.0
    )
    assert value(metrics, "specops_condition", type="Ready", status="True", reason="Serving") == 1.0


def test_fields_that_leave_the_status_leave_the_metrics(metrics: OperatorMetrics) -> None:
    metrics.observe_status("ml", "chat", STATUS, SPEC)
    # When the canary ends and speculation is switched off (no alpha measured while off)
    later = copy.deepcopy(STATUS)
    later["canary"] = None
    later["phase"] = "Dynamic"
    later["observed"]["alpha"] = None
    later["conditions"][4] = {**later["conditions"][4], "status": "False", "reason": "CanaryPromoted"}
    metrics.observe_status("ml", "chat", later, SPEC)
    assert value(metrics, "specops_canary_active") == 0.0
    assert value(metrics, "specops_canary_weight_ratio") is None
    assert value(metrics, "specops_acceptance_alpha") is None
    assert value(metrics, "specops_phase", phase="Canary") == 0.0
    # the condition's old status and reason are gone, the new ones are there
    assert (
        value(metrics, "specops_condition", type="CanaryRollout", status="True", reason="CanaryProgressing")
        is None
    )
    assert (
        value(metrics, "specops_condition", type="CanaryRollout", status="False", reason="CanaryPromoted")
        == 1.0
    )


def test_new_decisions_rollouts_and_rollbacks_are_counted_from_one_status_to_the_next(
    metrics: OperatorMetrics,
) -> None:
    # The first status seen (also after an operator restart) is a starting point: nothing counted
    metrics.observe_status("ml", "chat", STATUS)
    assert value(metrics, "specops_decisions_total", action="hold", reason="LengthRaised") is None
    assert value(metrics, "specops_revision_rollouts_total") == 0.0
    assert value(metrics, "specops_canary_rollbacks_total") == 0.0
    # A tick that switches speculation off and ends the canary with a rollback
    off = copy.deepcopy(STATUS)
    off["speculation"].update(
        state="off",
        draftLength=0,
        reason="SpeculationDisabledBatch",
        lastChangeTime="2026-11-30T11:00:30Z",
        lastDecisionTime="2026-11-30T11:00:30Z",
    )
    off["canary"] = None
    off["lastCanary"] = {"draft": "v3", "result": "RolledBack", "reason": "Failed", "evidence": "slower"}
    metrics.observe_status("ml", "chat", off)
    # The same status again (a second post of one tick) counts nothing more
    metrics.observe_status("ml", "chat", off)
    assert (
        value(metrics, "specops_decisions_total", action="disable", reason="SpeculationDisabledBatch") == 1.0
    )
    assert value(metrics, "specops_revision_rollouts_total") == 1.0
    assert value(metrics, "specops_canary_rollbacks_total") == 1.0


def test_acceptance_collapses_are_counted_from_the_status_count(metrics: OperatorMetrics) -> None:
    # The first status seen is a starting point, whatever its count (an operator restart)
    first = copy.deepcopy(STATUS)
    first["speculation"]["acceptanceCollapses"] = 3
    metrics.observe_status("ml", "chat", first)
    assert value(metrics, "specops_acceptance_collapses_total") == 0.0
    # A tick that found two pods collapsed, then the same status again
    later = copy.deepcopy(first)
    later["speculation"]["acceptanceCollapses"] = 5
    metrics.observe_status("ml", "chat", later)
    metrics.observe_status("ml", "chat", later)
    assert value(metrics, "specops_acceptance_collapses_total") == 2.0
    # A status without the count (an older operator wrote it) reads as 0; the next collapse counts one
    none = copy.deepcopy(STATUS)
    none["speculation"].pop("acceptanceCollapses", None)
    metrics.observe_status("ml", "chat", none)
    none["speculation"]["acceptanceCollapses"] = 1
    metrics.observe_status("ml", "chat", none)
    assert value(metrics, "specops_acceptance_collapses_total") == 3.0
    metrics.forget("ml", "chat")
    assert value(metrics, "specops_acceptance_collapses_total") is None


@pytest.mark.parametrize(
    ("before", "after", "action"),
    [
        ({"state": "off", "draftLength": 0}, {"state": "on", "draftLength": 4}, "enable"),
        ({"state": "on", "draftLength": 4}, {"state": "off", "draftLength": 0}, "disable"),
        ({"state": "on", "draftLength": 4}, {"state": "on", "draftLength": 6}, "lengthen"),
        ({"state": "on", "draftLength": 6}, {"state": "on", "draftLength": 3}, "shorten"),
        ({"state": "on", "draftLength": 4}, {"state": "on", "draftLength": 4}, "hold"),
        ({"state": "off", "draftLength": 0}, {"state": "off", "draftLength": 0}, "hold"),
    ],
)
def test_a_decision_is_named_by_what_it_changed(
    before: dict[str, Any], after: dict[str, Any], action: str
) -> None:
    assert decision_action(before, after) == action


def test_a_value_that_leaves_and_comes_back_is_shown_again_and_a_forgotten_resource_starts_afresh(
    metrics: OperatorMetrics,
) -> None:
    # Unchanged values are not set again every tick; what changes, leaves or comes back still shows
    metrics.observe_status("ml", "chat", STATUS, SPEC)
    off = copy.deepcopy(STATUS)
    off["observed"]["alpha"] = None
    metrics.observe_status("ml", "chat", off, SPEC)
    assert value(metrics, "specops_acceptance_alpha") is None
    metrics.observe_status("ml", "chat", off, SPEC)  # absent twice: no error
    metrics.observe_status("ml", "chat", STATUS, SPEC)
    assert value(metrics, "specops_acceptance_alpha") == pytest.approx(0.7801)
    moved = copy.deepcopy(STATUS)
    moved["observed"]["alpha"] = 0.5
    metrics.observe_status("ml", "chat", moved, SPEC)
    assert value(metrics, "specops_acceptance_alpha") == pytest.approx(0.5)
    # after forget, the same status shows every series again
    metrics.forget("ml", "chat")
    assert value(metrics, "specops_acceptance_alpha") is None
    metrics.observe_status("ml", "chat", moved, SPEC)
    assert value(metrics, "specops_acceptance_alpha") == pytest.approx(0.5)
    assert value(metrics, "specops_phase", phase="Canary") == 1.0
    assert value(metrics, "specops_condition", type="Ready", status="True", reason="Serving") == 1.0
    assert value(metrics, "specops_canary_active") == 1.0


def test_forget_removes_every_series_of_the_resource_and_only_those(metrics: OperatorMetrics) -> None:
    metrics.observe_status("ml", "chat", STATUS, SPEC)
    metrics.observe_status("ml", "other", STATUS, SPEC)
    metrics.observe_decision("ml", "chat", "enable", "SpeculationEnabled")
    metrics.forget("ml", "chat")
    exposed = [
        sample.labels
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.labels.get("name") in ("chat", "other")
    ]
    assert exposed and all(labels["name"] == "other" for labels in exposed)


def test_reconcile_durations_and_failures_are_recorded(metrics: OperatorMetrics) -> None:
    with metrics.time_reconcile():
        pass
    with pytest.raises(KubeApiError), metrics.time_reconcile():
        raise KubeApiError(403, "Forbidden", "no")
    with metrics.time_tick():
        pass
    assert metrics.registry.get_sample_value("specops_reconcile_duration_seconds_count") == 2.0
    assert (
        metrics.registry.get_sample_value("specops_reconcile_errors_total", {"kind": "KubeApiError"}) == 1.0
    )
    assert metrics.registry.get_sample_value("specops_control_tick_duration_seconds_count") == 1.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_metrics_are_served_on_slash_metrics(metrics: OperatorMetrics) -> None:
    port = _free_port()
    server, thread = metrics.serve(port, "127.0.0.1")
    try:
        metrics.observe_status("ml", "chat", STATUS, SPEC)
        metrics.count_error("prometheus", "Timeout")
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)  # gzip accepted, as Prometheus
        plain = httpx.get(
            f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "identity"}, timeout=5
        )
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert response.status_code == 200 and plain.status_code == 200
    assert response.headers["content-encoding"] == "gzip" and "content-encoding" not in plain.headers
    # what the client library would have served, byte for byte, compressed or not
    assert response.content == plain.content == generate_latest(metrics.registry)
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    assert samples[("specops_draft_length", (("name", "chat"), ("namespace", "ml")))] == 5.0
    assert samples[("specops_canary_weight_ratio", (("name", "chat"), ("namespace", "ml")))] == 0.25
    assert samples[("specops_errors_total", (("component", "prometheus"), ("kind", "Timeout")))] == 1.0


async def test_an_unreachable_api_server_is_counted_as_a_kubernetes_error() -> None:
    counted = {"component": "kubernetes", "kind": "Unreachable"}
    before = operator_metrics.METRICS.registry.get_sample_value("specops_errors_total", counted) or 0.0
    kube = KubeClient(ConnectionSettings(server=f"http://127.0.0.1:{_free_port()}"), timeout_s=2)
    try:
        with pytest.raises(KubeApiError):
            await kube.get("v1", "ConfigMap", "default", "anything")
    finally:
        await kube.close()
    assert operator_metrics.METRICS.registry.get_sample_value("specops_errors_total", counted) == before + 1


def test_the_learned_break_even_is_exported_infinite_when_none_and_absent_before_it_is_computed(
    metrics: OperatorMetrics,
) -> None:
    status = copy.deepcopy(STATUS)
    status["speculation"]["calibration"] = {"breakEvenKnown": True, "breakEvenBatch": 24}
    metrics.observe_status("ml", "chat", status)
    assert value(metrics, "specops_learned_break_even_batch") == 24.0
    status["speculation"]["calibration"] = {"breakEvenKnown": True, "breakEvenBatch": None}
    metrics.observe_status("ml", "chat", status)
    assert value(metrics, "specops_learned_break_even_batch") == float("inf")
    status["speculation"]["calibration"] = {"breakEvenKnown": False}
    metrics.observe_status("ml", "chat", status)
    assert value(metrics, "specops_learned_break_even_batch") is None


def test_a_scrape_renders_one_family_at_a_time(metrics: OperatorMetrics) -> None:
    """At 2,000 resources a scrape is about 76,000 series: rendered whole it held 20-30 MiB at the
    peak of every scrape. Streamed, no chunk holds more than one family."""
    for index in range(50):
        metrics.observe_status("ml", f"chat-{index}", STATUS, SPEC)
    chunks = list(operator_metrics.exposition(metrics.registry))
    assert b"".join(chunks) == generate_latest(metrics.registry)
    assert len(chunks) == len(list(metrics.registry.collect())) > 30
    assert all(chunk.count(b"# TYPE ") <= 2 for chunk in chunks)  # a counter's _created is its own family


def test_ticks_are_counted_by_whether_they_decided_or_found_their_inputs_unchanged(
    metrics: OperatorMetrics,
) -> None:
    metrics.count_tick(unchanged=False)
    metrics.count_tick(unchanged=True)
    metrics.count_tick(unchanged=True)
    sample = metrics.registry.get_sample_value
    assert sample("specops_control_ticks_total", {"outcome": "decided"}) == 1.0
    assert sample("specops_control_ticks_total", {"outcome": "unchanged"}) == 2.0
