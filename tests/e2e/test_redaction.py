"""A password in spec.metrics.prometheus.url never reaches status, Events or the operator's logs."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from specops.adapters.kube import KubeClient
from specops_local.serving import ServingController
from tests.e2e.conftest import Operator, example
from tests.e2e.waiting import condition, events_for, eventually, resource, wait_condition

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only]

NAME = "redacted-metrics"
PASSWORD = "s3cr3t-Pa55w0rd"


async def test_a_password_in_the_prometheus_url_is_never_shown(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    body = example()
    body["metadata"]["name"] = NAME
    # Nothing listens on port 9: every poll fails, and the error names the Prometheus it tried.
    body["spec"]["metrics"] = {
        "prometheus": {"url": f"http://metrics:{PASSWORD}@127.0.0.1:9"},
        "interval": "1s",
    }
    await kube.create(body)

    live = await wait_condition(kube, NAME, "MetricsUnavailable", "True", timeout_s=30)
    message = condition(live, "MetricsUnavailable")["message"]
    assert "metrics:***@127.0.0.1:9" in message  # still says which Prometheus failed

    async def warned() -> list[dict[str, Any]]:
        return [e for e in await events_for(kube, NAME) if e["type"] == "Warning"]

    events = await eventually(warned, timeout_s=20, what="a Warning Event")
    live = await resource(kube, NAME)
    assert live is not None
    shown_status = json.dumps(live.get("status"))
    assert PASSWORD not in shown_status, shown_status
    assert PASSWORD not in json.dumps(events), events
    assert any("127.0.0.1:9" in r.getMessage() for r in caplog.records)  # the poll failure was logged
    leaked = [
        f"{r.name} {r.levelname}: {r.getMessage()[:200]}"
        for r in caplog.records
        if PASSWORD in r.getMessage()
    ]
    assert not leaked, leaked
