"""Backend metric profiles, snapshot building and pod discovery: pure, no Prometheus, no pods."""

from __future__ import annotations

import gc
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specops.domain.acceptance import acceptance_rate_from_alpha
from specops.domain.discovery import PodEndpoint, ready_endpoint, ready_endpoints
from specops.domain.metrics import (
    DRAFT_LABEL,
    GROUP_LABELS,
    PROFILES,
    Q_ACCEPTANCE_GAUGE,
    Q_ACCEPTED,
    Q_BATCH,
    Q_DRAFT_STEPS,
    Q_DRAFTED,
    Q_POD_ACCEPTANCE_GAUGE,
    Q_POD_ACCEPTED,
    Q_POD_BATCH,
    Q_POD_DRAFTED,
    Q_PODS,
    Q_REQUESTS,
    Q_TOKENS,
    Q_TPOT_MEAN,
    Q_TPOT_P50,
    Q_TPOT_P95,
    Q_TPOT_P99,
    REASON_INVALID,
    REASON_METRICS_UNAVAILABLE,
    REASON_NO_METRICS,
    REASON_STALE,
    Measurement,
    PodMeasurement,
    Snapshot,
    build_snapshot,
    rate_window_s,
)

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)
KEY = ("team-a", "chat", "stable")


def sample(
    value: str | float,
    namespace: str = "team-a",
    deployment: str = "chat",
    variant: str = "stable",
    draft: str | None = None,
) -> Any:
    labels = {"namespace": namespace, "specops_deployment": deployment, "variant": variant}
    if draft is not None:
        labels[DRAFT_LABEL] = draft
    return {"metric": labels, "value": [1735732800.0, str(value)]}


def raw_for(backend: str, alpha: float, draft_length: int, draft_steps_per_s: float = 50.0) -> dict[str, Any]:
    """What Prometheus answers for a deployment drafting at alpha with draft length g."""
    drafted = draft_steps_per_s * draft_length
    rate = acceptance_rate_from_alpha(alpha, draft_length)
    results: dict[str, Any] = {
        Q_BATCH: [sample(12.5)],
        Q_PODS: [sample(2)],
        Q_REQUESTS: [sample(3.0)],
        Q_TPOT_P50: [sample(0.02)],
        Q_TPOT_P95: [sample(0.03)],
        Q_TPOT_P99: [sample(0.04)],
    }
    profile = PROFILES[backend]
    if profile.acceptance_rate_gauge:
        results[Q_ACCEPTANCE_GAUGE] = [sample(rate)]
    else:
        results[Q_DRAFTED] = [sample(drafted)]
        results[Q_ACCEPTED] = [sample(drafted * rate)]
    if profile.draft_steps:
        results[Q_DRAFT_STEPS] = [sample(draft_steps_per_s)]
    if profile.output_tokens_counter:
        results[Q_TOKENS] = [sample(600.0)]
    return results


# ---------------------------------------------------------------- queries


@pytest.mark.parametrize("backend", sorted(PROFILES))
def test_every_query_is_grouped_by_resource_variant_and_draft(backend: str) -> None:
    queries = PROFILES[backend].queries(rate_window_s(15))
    group = "by (" + ", ".join(GROUP_LABELS)
    assert GROUP_LABELS == ("namespace", "specops_deployment", "variant", "specops_draft")
    for quantity, promql in queries.items():
        assert group in promql, (quantity, promql)
        assert "[60s]" in promql or "rate(" not in promql, (quantity, promql)
    for quantile in (Q_TPOT_P50, Q_TPOT_P95, Q_TPOT_P99):
        assert re.match(
            r"histogram_quantile\(0\.\d+, sum by \(.*, le\) \(rate\(\S+_bucket\[60s\]\) >= 0 < \+Inf\)\)",
            queries[quantile],
        )


@pytest.mark.parametrize("backend", sorted(PROFILES))
def test_every_profile_measures_acceptance_batch_load_and_latency(backend: str) -> None:
    quantities = set(PROFILES[backend].queries(10))
    assert {Q_BATCH, Q_PODS, Q_REQUESTS, Q_TPOT_P50, Q_TPOT_P95, Q_TPOT_P99} <= quantities
    assert Q_ACCEPTANCE_GAUGE in quantities or {Q_DRAFTED, Q_ACCEPTED} <= quantities


def test_triton_profile_reads_the_counters_of_specops_llm_api_model() -> None:
    queries = PROFILES["triton"].queries(10)
    assert "specops_spec_decode_draft_tokens_total[10s]" in queries[Q_DRAFTED]
    assert "specops_spec_decode_accepted_tokens_total[10s]" in queries[Q_ACCEPTED]
    assert "specops_request_success_total[10s]" in queries[Q_REQUESTS]
    assert "specops_num_requests_running" in queries[Q_BATCH]
    assert Q_DRAFT_STEPS not in queries  # steps are not counted: K is the schedule's at the batch


def test_rate_window_covers_several_scrapes_with_a_floor() -> None:
    assert rate_window_s(1) == 10
    assert rate_window_s(15) == 60


# ---------------------------------------------------------------- conversion to alpha


@pytest.mark.parametrize(
    ("backend", "alpha", "draft_length"),
    [
        ("triton", 0.74, 4),
        ("triton", 0.55, 7),
        ("vllm", 0.8, 3),
        ("vllm", 0.3, 5),
        ("trtllm-serve", 0.74, 4),
        ("sglang", 0.65, 6),
    ],
)
def test_measured_acceptance_converts_back_to_alpha(backend: str, alpha: float, draft_length: int) -> None:
    snapshot = build_snapshot(PROFILES[backend], raw_for(backend, alpha, draft_length), T0)

    measured = snapshot.lookup(*KEY, now=T0, max_age_s=30, draft_length=draft_length)

    assert measured.ok
    assert measured.alpha == pytest.approx(alpha, abs=1e-6)
    assert measured.mean_draft_length == pytest.approx(draft_length)
    assert measured.acceptance_rate == pytest.approx(acceptance_rate_from_alpha(alpha, draft_length))


def test_acceptance_rate_is_not_alpha() -> None:
    # vLLM's "draft acceptance rate" reads ~0.50 at alpha 0.74 and g 4 (SPECDEC.md)
    snapshot = build_snapshot(PROFILES["vllm"], raw_for("vllm", 0.74, 4), T0)
    measured = snapshot.lookup(*KEY, now=T0, max_age_s=30)
    assert measured.acceptance_rate == pytest.approx(0.50, abs=0.01)
    assert measured.alpha == pytest.approx(0.74, abs=1e-6)


@pytest.mark.parametrize("backend", ["trtllm-serve", "sglang"])
def test_engines_without_a_step_count_need_the_configured_draft_length(backend: str) -> None:
    snapshot = build_snapshot(PROFILES[backend], raw_for(backend, 0.7, 4), T0)

    unconfigured = snapshot.lookup(*KEY, now=T0, max_age_s=30)

    assert unconfigured.ok and unconfigured.alpha is None and unconfigured.mean_draft_length is None
    assert unconfigured.acceptance_rate == pytest.approx(acceptance_rate_from_alpha(0.7, 4))


def test_measured_draft_length_wins_over_the_configured_one() -> None:
    snapshot = build_snapshot(PROFILES["vllm"], raw_for("vllm", 0.7, 4), T0)
    measured = snapshot.lookup(*KEY, now=T0, max_age_s=30, draft_length=8)
    assert measured.mean_draft_length == pytest.approx(4)
    assert measured.alpha == pytest.approx(0.7, abs=1e-6)


@pytest.mark.parametrize("backend", sorted(PROFILES))
def test_nothing_drafted_means_speculation_off_not_an_error(backend: str) -> None:
    raw = raw_for(backend, 0.7, 4)
    for quantity in (Q_DRAFTED, Q_ACCEPTED, Q_DRAFT_STEPS, Q_ACCEPTANCE_GAUGE):
        if quantity in raw:
            raw[quantity] = [sample(0)]

    measured = build_snapshot(PROFILES[backend], raw, T0).lookup(*KEY, now=T0, max_age_s=30, draft_length=4)

    assert measured.ok
    assert measured.alpha is None and measured.acceptance_rate is None
    assert measured.batch == pytest.approx(12.5)


def test_load_and_latency_figures_are_carried_through() -> None:
    measured = build_snapshot(PROFILES["vllm"], raw_for("vllm", 0.7, 4), T0).lookup(
        *KEY, now=T0, max_age_s=30
    )
    assert (measured.batch, measured.pods_reporting, measured.request_rate, measured.tokens_per_s) == (
        12.5,
        2,
        3.0,
        600.0,
    )
    assert (measured.tpot_p50_s, measured.tpot_p95_s, measured.tpot_p99_s) == (0.02, 0.03, 0.04)


# ---------------------------------------------------------------- per pod


def pod_sample(pod: str, value: str | float) -> Any:
    return {"metric": {**sample(0)["metric"], DRAFT_LABEL: "d1", "pod": pod}, "value": [0, str(value)]}


@pytest.mark.parametrize("backend", sorted(PROFILES))
def test_each_pods_own_acceptance_is_one_query_for_every_resource(backend: str) -> None:
    profile = PROFILES[backend]
    queries = profile.queries(60)
    pod_group = "by (" + ", ".join(GROUP_LABELS) + ", pod)"
    if profile.acceptance_rate_gauge is not None:
        assert queries[Q_POD_ACCEPTANCE_GAUGE] == f"avg {pod_group} ({profile.acceptance_rate_gauge})"
        assert Q_POD_DRAFTED not in queries
    else:
        assert queries[Q_POD_DRAFTED] == f"sum {pod_group} (rate({profile.drafted_tokens}[60s]))"
        assert queries[Q_POD_ACCEPTED] == f"sum {pod_group} (rate({profile.accepted_tokens}[60s]))"
        assert Q_POD_ACCEPTANCE_GAUGE not in queries


def test_each_pods_acceptance_is_its_own_accepted_over_drafted() -> None:
    # Given two pods of one resource: one accepting normally, one accepting nothing
    raw = raw_for("vllm", 0.7, 4)
    raw[Q_POD_BATCH] = [pod_sample("p-0", 12), pod_sample("p-1", 13)]
    raw[Q_POD_DRAFTED] = [pod_sample("p-0", 200.0), pod_sample("p-1", 180.0)]
    raw[Q_POD_ACCEPTED] = [pod_sample("p-0", 110.0), pod_sample("p-1", 0.0)]

    measured = build_snapshot(PROFILES["vllm"], raw, T0).lookup(*KEY, now=T0, max_age_s=30)

    # Then each pod carries its own rate; the variant's figures are untouched
    assert measured.per_pod["p-0"] == PodMeasurement(batch=12, drafted_per_s=200.0, acceptance_rate=0.55)
    assert measured.per_pod["p-1"] == PodMeasurement(batch=13, drafted_per_s=180.0, acceptance_rate=0.0)
    assert measured.alpha == pytest.approx(0.7, abs=1e-6)


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-3", "not-a-number"])
def test_a_pods_unreadable_acceptance_is_no_acceptance_not_zero(bad: str) -> None:
    raw = raw_for("vllm", 0.7, 4)
    raw[Q_POD_BATCH] = [pod_sample("p-0", 12), pod_sample("p-1", 12)]
    raw[Q_POD_DRAFTED] = [pod_sample("p-0", 200.0), pod_sample("p-1", bad)]
    raw[Q_POD_ACCEPTED] = [pod_sample("p-0", bad), pod_sample("p-1", 100.0)]

    per_pod = build_snapshot(PROFILES["vllm"], raw, T0).lookup(*KEY, now=T0, max_age_s=30).per_pod

    assert per_pod["p-0"].acceptance_rate is None and per_pod["p-0"].drafted_per_s == 200.0
    assert per_pod["p-1"].acceptance_rate is None and per_pod["p-1"].drafted_per_s is None


def test_nothing_drafted_by_a_pod_is_no_acceptance() -> None:
    raw = raw_for("vllm", 0.7, 4)
    raw[Q_POD_BATCH] = [pod_sample("p-0", 12)]
    raw[Q_POD_DRAFTED] = [pod_sample("p-0", 0)]
    raw[Q_POD_ACCEPTED] = [pod_sample("p-0", 0)]
    per_pod = build_snapshot(PROFILES["vllm"], raw, T0).lookup(*KEY, now=T0, max_age_s=30).per_pod
    assert per_pod["p-0"] == PodMeasurement(batch=12, drafted_per_s=0.0)


def test_sglang_pods_read_their_acceptance_gauge_zero_included() -> None:
    raw = raw_for("sglang", 0.7, 4)
    raw[Q_POD_BATCH] = [pod_sample("p-0", 6), pod_sample("p-1", 7), pod_sample("p-2", 7)]
    raw[Q_POD_ACCEPTANCE_GAUGE] = [pod_sample("p-0", 0.48), pod_sample("p-1", 0), pod_sample("p-2", "NaN")]
    per_pod = build_snapshot(PROFILES["sglang"], raw, T0).lookup(*KEY, now=T0, max_age_s=30).per_pod
    assert [per_pod[p].acceptance_rate for p in ("p-0", "p-1", "p-2")] == [0.48, 0.0, None]
    assert per_pod["p-0"].drafted_per_s is None  # SGLang counts no drafted tokens


# ---------------------------------------------------------------- bad values, missing and stale data


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "not-a-number"])
def test_non_finite_values_read_as_unknown(bad: str) -> None:
    raw = raw_for("vllm", 0.7, 4)
    raw[Q_TPOT_P99] = [sample(bad)]
    raw[Q_DRAFTED] = [sample(bad)]

    measured = build_snapshot(PROFILES["vllm"], raw, T0).lookup(*KEY, now=T0, max_age_s=30)

    assert measured.ok
    assert measured.tpot_p99_s is None
    assert measured.alpha is None
    assert measured.tpot_p50_s == 0.02


def test_a_resource_is_measured_from_whatever_series_it_has() -> None:
    raw: dict[str, Any] = {q: [] for q in PROFILES["vllm"].queries(10)}
    raw[Q_BATCH] = [sample(3, deployment="young")]

    measured = build_snapshot(PROFILES["vllm"], raw, T0).lookup(
        "team-a", "young", "stable", now=T0, max_age_s=30
    )

    assert measured.ok and measured.batch == 3
    assert measured.pods_reporting == 0 and measured.request_rate is None and measured.alpha is None


def test_each_variant_and_resource_is_its_own_measurement() -> None:
    raw = raw_for("vllm", 0.7, 4)
    raw[Q_BATCH] = [sample(10), sample(2, variant="canary"), sample(40, namespace="team-b")]
    snapshot = build_snapshot(PROFILES["vllm"], raw, T0)

    assert snapshot.lookup("team-a", "chat", "canary", now=T0, max_age_s=30).batch == 2
    assert snapshot.lookup("team-b", "chat", "stable", now=T0, max_age_s=30).batch == 40
    assert snapshot.lookup(*KEY, now=T0, max_age_s=30).batch == 10


def two_drafts_in_the_canary_variant() -> dict[str, Any]:
    """What Prometheus answers right after a promotion: the old canary pod's series (draft v4,
    alpha 0.88) are still in the rate window next to the new canary's (draft v5, alpha 0.55)."""
    raw: dict[str, Any] = {}
    for draft, alpha, pods, batch, p99 in (("v4-aaaa", 0.88, 1, 10.0, 0.03), ("v5-bbbb", 0.55, 2, 4.0, 0.05)):
        for quantity, series in raw_for("vllm", alpha, 4).items():
            value = float(series[0]["value"][1])
            value = {Q_PODS: pods, Q_BATCH: batch, Q_TPOT_P99: p99}.get(quantity, value)
            raw.setdefault(quantity, []).append(sample(value, variant="canary", draft=draft))
    return raw


def test_each_draft_of_a_variant_is_measured_on_its_own_series() -> None:
    snapshot = build_snapshot(PROFILES["vllm"], two_drafts_in_the_canary_variant(), T0)

    old = snapshot.lookup("team-a", "chat", "canary", now=T0, max_age_s=30, draft="v4-aaaa")
    new = snapshot.lookup("team-a", "chat", "canary", now=T0, max_age_s=30, draft="v5-bbbb")

    assert old.alpha == pytest.approx(0.88, abs=1e-6)
    assert new.alpha == pytest.approx(0.55, abs=1e-6)
    assert (new.pods_reporting, new.batch, new.tpot_p99_s) == (2, 4.0, 0.05)


def test_a_draft_without_series_reads_as_no_metrics_not_as_another_drafts_numbers() -> None:
    snapshot = build_snapshot(PROFILES["vllm"], two_drafts_in_the_canary_variant(), T0)
    assert_error_without_numbers(
        snapshot.lookup("team-a", "chat", "canary", now=T0, max_age_s=30, draft="v6-cccc"), REASON_NO_METRICS
    )


def test_the_variant_as_a_whole_adds_up_the_drafts_pods() -> None:
    # The control loop reads the variant as a whole, as during a rolling update of the stable pods
    snapshot = build_snapshot(PROFILES["vllm"], two_drafts_in_the_canary_variant(), T0)

    whole = snapshot.lookup("team-a", "chat", "canary", now=T0, max_age_s=30)

    assert whole.ok and whole.pods_reporting == 3
    assert whole.request_rate == pytest.approx(6.0) and whole.tokens_per_s == pytest.approx(1200.0)
    assert whole.batch == pytest.approx((10.0 * 1 + 4.0 * 2) / 3)  # per pod
    assert whole.tpot_p99_s == pytest.approx(0.04)  # requests-weighted, equal rates here
    # acceptance from the summed counters: between the two drafts'
    assert 0.55 < (whole.alpha or 0) < 0.88


def test_a_scrape_without_the_draft_label_still_answers_a_draft_lookup() -> None:
    # A hand-written scrape config that adds no specops_draft: every series has ""
    snapshot = build_snapshot(PROFILES["vllm"], raw_for("vllm", 0.7, 4), T0)
    measured = snapshot.lookup(*KEY, now=T0, max_age_s=30, draft="v3-abcd")
    assert measured.ok and measured.alpha == pytest.approx(0.7, abs=1e-6)


def test_series_without_the_deployment_label_are_ignored() -> None:
    raw = raw_for("vllm", 0.7, 4)
    raw[Q_BATCH].append({"metric": {"namespace": "x"}, "value": [0, "5"]})
    assert set(build_snapshot(PROFILES["vllm"], raw, T0).measurements) == {KEY}


def test_a_cycles_snapshot_leaves_nothing_per_resource_for_the_garbage_collector() -> None:
    # A fleet's snapshot lives a whole cycle: per-resource objects in it were scanned by every young
    # and middle pass and promoted to the oldest generation, bringing full passes closer
    fleet = 300
    raw: dict[str, list[dict[str, Any]]] = {}
    for index in range(fleet):
        for quantity, samples in raw_for("vllm", 0.7, 4).items():
            labels = {**samples[0]["metric"], "specops_deployment": f"chat-{index}"}
            raw.setdefault(quantity, []).append({**samples[0], "metric": labels})
        pod_labels = {**raw[Q_BATCH][-1]["metric"], "pod": f"chat-{index}-0"}
        raw.setdefault(Q_POD_BATCH, []).append({"metric": pod_labels, "value": [0, "12"]})
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        snapshot = build_snapshot(PROFILES["vllm"], raw, T0)
        gc.collect(0)  # the young pass that follows a poll (it untracks tuples of strings)
        held = len(gc.get_objects()) - before
    finally:
        gc.enable()
    assert held < 20, held
    # and every resource is still measured, with its pod, when looked up
    measured = snapshot.lookup(KEY[0], f"chat-{fleet - 1}", KEY[2], now=T0, max_age_s=30)
    assert measured.ok and measured.alpha == pytest.approx(0.7, abs=1e-6)
    assert measured.per_pod == {f"chat-{fleet - 1}-0": PodMeasurement(batch=12.0)}
    assert len(snapshot.measurements) == len(snapshot.by_draft) == fleet


def assert_error_without_numbers(measured: Measurement, reason: str) -> None:
    assert measured.phase == "Error" and measured.reason == reason and measured.error
    assert None is measured.alpha is measured.batch is measured.request_rate is measured.tpot_p95_s
    assert measured.pods_reporting == 0


def test_a_missing_resource_reads_as_an_error() -> None:
    snapshot = build_snapshot(PROFILES["vllm"], raw_for("vllm", 0.7, 4), T0)
    assert_error_without_numbers(
        snapshot.lookup("team-a", "chat", "canary", now=T0, max_age_s=30), REASON_NO_METRICS
    )


def test_a_stale_snapshot_reads_as_an_error() -> None:
    snapshot = build_snapshot(PROFILES["vllm"], raw_for("vllm", 0.7, 4), T0)
    assert snapshot.lookup(*KEY, now=T0 + timedelta(seconds=30), max_age_s=30).ok
    assert_error_without_numbers(
        snapshot.lookup(*KEY, now=T0 + timedelta(seconds=31), max_age_s=30), REASON_STALE
    )


def test_a_failed_cycle_reads_as_metrics_unavailable_with_its_message() -> None:
    snapshot = Snapshot.failed(T0, "cannot reach Prometheus at http://prom:9090")
    measured = snapshot.lookup(*KEY, now=T0, max_age_s=30, draft_length=4)
    assert_error_without_numbers(measured, REASON_METRICS_UNAVAILABLE)
    assert measured.error == "cannot reach Prometheus at http://prom:9090"


# ---------------------------------------------------------------- pod discovery


def pod(
    name: str,
    *,
    ready: bool = True,
    ip: str | None = "10.0.0.1",
    deleting: bool = False,
    containers: list[dict[str, Any]] | None = None,
    variant: str | None = "canary",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "ns", "labels": {}}
    if variant:
        metadata["labels"]["specops.dev/variant"] = variant
    if deleting:
        metadata["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    if containers is None:
        containers = [
            {"name": "metrics-sidecar", "ports": [{"name": "http", "containerPort": 9000}]},
            {
                "name": "engine",
                "ports": [
                    {"name": "metrics", "containerPort": 8002},
                    {"name": "http", "containerPort": 8123},
                ],
            },
        ]
    return {"metadata": metadata, "spec": {"containers": containers}, "status": status}


def test_ready_endpoints_reads_the_engine_http_port_and_variant() -> None:
    assert ready_endpoints([pod("a")]) == [PodEndpoint("a", "ns", "10.0.0.1", 8123, "canary")]


def test_a_pods_start_time_is_creation_to_ready() -> None:
    body = pod("a")
    body["metadata"]["creationTimestamp"] = "2026-12-01T12:00:00Z"
    body["status"]["conditions"][0]["lastTransitionTime"] = "2026-12-01T12:03:05Z"
    found = ready_endpoint(body)
    assert found is not None and found.start_s == 185.0
    body["status"]["conditions"][0]["lastTransitionTime"] = "soon"
    unreadable = ready_endpoint(body)
    assert unreadable is not None and unreadable.start_s is None
    assert (ready_endpoint(pod("b")) or PodEndpoint("", "", "", 0, "")).start_s is None  # not given


def test_a_restarted_serving_container_is_a_new_incarnation_of_the_pod() -> None:
    body = pod("a")
    body["metadata"]["uid"] = "u1"
    body["status"]["containerStatuses"] = [
        {"name": "metrics-sidecar", "restartCount": 7},
        {"name": "engine", "restartCount": 0},
    ]
    before = ready_endpoint(body)
    body["status"]["containerStatuses"][1]["restartCount"] = 1
    after = ready_endpoint(body)
    assert before is not None and after is not None
    assert (before.incarnation, after.incarnation) == ("u1/0", "u1/1")
    assert before.address == after.address


def test_ready_endpoints_skips_pods_that_cannot_serve() -> None:
    pods = [
        pod("not-ready", ready=False),
        pod("no-ip", ip=None),
        pod("terminating", deleting=True),
        pod("ok"),
    ]
    assert [e.name for e in ready_endpoints(pods)] == ["ok"]


def test_ready_endpoints_falls_back_to_the_first_container_and_port_8000() -> None:
    first = pod("first", containers=[{"name": "server", "ports": [{"name": "http", "containerPort": 9999}]}])
    unnamed = pod(
        "unnamed", containers=[{"name": "server", "ports": [{"containerPort": 1234}]}], variant=None
    )
    endpoints = ready_endpoints([unnamed, first])
    assert [(e.name, e.http_port, e.variant) for e in endpoints] == [
        ("first", 9999, "canary"),
        ("unnamed", 8000, "stable"),
    ]
    assert endpoints[0].address == "10.0.0.1:9999"


# ---------------------------------------------------------------- values no instrument can read


def every_value(raw: dict[str, Any], value: str) -> dict[str, Any]:
    return {quantity: [sample(value) for _ in vector] for quantity, vector in raw.items()}


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-17"])
def test_a_cycle_with_no_finite_possible_value_is_an_outage_of_its_own(value: str) -> None:
    # Given Prometheus answers every series of a resource with NaN, an infinity or a negative number
    raw = every_value(raw_for("vllm", 0.74, 4), value)

    measured = build_snapshot(PROFILES["vllm"], raw, T0).lookup(*KEY, now=T0, max_age_s=30)

    # Then the resource is measured as blind, with its own reason: no decision, MetricsUnavailable
    assert not measured.ok
    assert measured.reason == REASON_INVALID
    assert "no finite" in (measured.error or "")
    by_draft = build_snapshot(PROFILES["vllm"], raw, T0).by_draft[KEY]
    assert all(not m.ok and m.reason == REASON_INVALID for m in by_draft.values())


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-17"])
def test_a_pod_count_alone_does_not_make_spoiled_values_readable(value: str) -> None:
    # Given what Prometheus answers over an exporter spoiling every sample: count() still counts
    # the pod, the quantiles and the mean (their rates filtered) answer nothing
    raw = every_value(raw_for("vllm", 0.74, 4), value)
    raw[Q_PODS] = [sample(1)]
    for quantity in (Q_TPOT_P50, Q_TPOT_P95, Q_TPOT_P99, Q_TPOT_MEAN):
        raw[quantity] = []

    measured = build_snapshot(PROFILES["vllm"], raw, T0).lookup(*KEY, now=T0, max_age_s=30)

    # Then the resource is blind, not measured with one pod and no values
    assert not measured.ok and measured.reason == REASON_INVALID


@pytest.mark.parametrize("backend", sorted(PROFILES))
def test_quotients_and_quantiles_read_finite_non_negative_rates_only(backend: str) -> None:
    # Two negative rates divide into a positive mean, and histogram_quantile over NaN buckets
    # answers the top bucket's bound: their rates are filtered before they are combined
    queries = PROFILES[backend].queries(10)
    for quantity in (Q_TPOT_MEAN, Q_TPOT_P50, Q_TPOT_P99):
        promql = queries[quantity]
        assert promql.count("rate(") == promql.count("]) >= 0 < +Inf)") > 0, promql


def test_negative_gauges_and_rates_are_refused_and_the_rest_stands() -> None:
    # Given a batch gauge and a request rate read negative (a counter reset gone wrong, a bad recording rule)
    raw = raw_for("vllm", 0.74, 4)
    raw[Q_BATCH] = [sample(-17)]
    raw[Q_REQUESTS] = [sample(-9.3)]
    raw[Q_TPOT_P99] = [sample("+Inf")]

    measured = build_snapshot(PROFILES["vllm"], raw, T0).lookup(*KEY, now=T0, max_age_s=30)

    # Then they are not values; the rest of the cycle still measures the resource
    assert measured.ok
    assert measured.batch is None and measured.request_rate is None and measured.tpot_p99_s is None
    assert measured.alpha == pytest.approx(0.74, abs=1e-6) and measured.tpot_p50_s == pytest.approx(0.02)


def test_an_idle_resource_with_zero_load_is_measured_not_invalid() -> None:
    # Given no traffic: rates and batch at 0, quantiles NaN (no observations), nothing drafted
    raw = {
        Q_BATCH: [sample(0)],
        Q_PODS: [sample(2)],
        Q_REQUESTS: [sample(0)],
        Q_TPOT_P50: [sample("NaN")],
        Q_DRAFTED: [sample(0)],
        Q_ACCEPTED: [sample(0)],
    }
    measured = build_snapshot(PROFILES["vllm"], raw, T0).lookup(*KEY, now=T0, max_age_s=30)
    assert measured.ok and measured.batch == 0 and measured.tpot_p50_s is None
