"""Operating the real operator: its /metrics follow the status it writes, its Events come from
specops, and no Secret's value reaches logs, status or Events."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from specops.adapters.kube import KubeClient
from specops.adapters.operator_metrics import METRICS
from tests.e2e.conftest import NAMESPACE, Operator, example
from tests.e2e.test_foundation import make_serving_ready
from tests.e2e.waiting import events_for, eventually, resource, wait_condition

NAME = "llama-70b-chat"
SECRET_VALUE = "c3BlY29wcy10ZXN0LXNlY3JldC12YWx1ZQ-never-print-me"


def sample(name: str, **labels: str) -> float | None:
    return METRICS.registry.get_sample_value(name, {"namespace": NAMESPACE, "name": NAME, **labels})


@pytest.mark.emulated_only
async def test_metrics_events_and_no_secret_in_sight(
    cluster: Any, kube: KubeClient, operator: Operator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    reconciles_before = METRICS.registry.get_sample_value("specops_reconcile_duration_seconds_count") or 0.0
    # Given a pull secret holding a credential, and a resource that references it
    cluster.create(
        "secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "registry-credentials", "namespace": NAMESPACE},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": json.dumps({"auths": {"r": {"auth": SECRET_VALUE}}})},
            "data": {"token": SECRET_VALUE},
        },
    )
    body = example()
    body["spec"]["serving"]["imagePullSecrets"] = [{"name": "registry-credentials"}]
    body["spec"]["serving"]["env"] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "registry-credentials", "key": "token"}}}
    ]
    await kube.create(body)
    await eventually(lambda: kube.get("apps/v1", "Deployment", NAMESPACE, NAME), what="serving Deployment")
    await make_serving_ready(cluster, NAME, 2)
    await wait_condition(kube, NAME, "Ready", "True", "Serving")

    # Then the operator's metrics show the resource as its status does, after its ticks
    async def metrics_follow() -> bool:
        return sample("specops_phase", phase="Baseline") == 1.0 and (
            sample("specops_condition", type="Ready", status="True", reason="Serving") == 1.0
        )

    await eventually(metrics_follow, timeout_s=15, what="specops_phase and specops_condition")
    assert METRICS.registry.get_sample_value("specops_reconcile_duration_seconds_count") > reconciles_before
    assert (METRICS.registry.get_sample_value("specops_control_tick_duration_seconds_count") or 0) > 0

    # (the example's Prometheus URL is unreachable: measured as such, and counted once a poll has
    # failed: refused at once, or, where the name's lookup stalls on a busy machine, timed out)
    async def prometheus_failures_counted() -> bool:
        counted = (
            METRICS.registry.get_sample_value(
                "specops_errors_total", {"component": "prometheus", "kind": kind}
            )
            for kind in ("Unreachable", "Timeout")
        )
        return sum(value or 0.0 for value in counted) > 0

    await eventually(prometheus_failures_counted, timeout_s=20, what="the failed Prometheus polls counted")

    # And its Events come from component specops
    events = await eventually(lambda: events_for(kube, NAME), what="events")
    assert {event["source"]["component"] for event in events} == {"specops"}
    assert {event.get("reportingComponent") for event in events} == {"specops"}

    # And the Secret's value is nowhere: not in the pods, the status, the Events or the logs
    deployment = await kube.get("apps/v1", "Deployment", NAMESPACE, NAME)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "registry-credentials", "key": "token"}},
    } in (pod["containers"][0]["env"])
    status = (await resource(kube, NAME) or {}).get("status")
    for where, text in {
        "Deployment": json.dumps(deployment),
        "status": json.dumps(status),
        "Events": json.dumps(events),
        "logs": caplog.text,
    }.items():
        assert SECRET_VALUE not in text, f"the Secret's value appears in the {where}"
    assert caplog.text  # the logs were captured at all

    # When the resource is deleted, its series go with it
    await kube.delete(body["apiVersion"], body["kind"], NAMESPACE, NAME)
    await eventually(lambda: _gone(kube), timeout_s=15, what="resource deleted")
    await eventually(_no_series, timeout_s=10, what="series removed")


async def _gone(kube: KubeClient) -> bool:
    return await resource(kube, NAME) is None


async def _no_series() -> bool:
    return sample("specops_phase", phase="Baseline") is None
