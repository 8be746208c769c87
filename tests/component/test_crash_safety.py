"""An exception in the operator's own code parks the resource with a condition; it never crash-loops.

Against the emulated API server: the reconcile path and the periodic tick meet values that got
past admission (an older CRD) or a failure in pure code, and the resource ends with a condition
saying so, one Warning Event, and a retry that backs off.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specops.adapters.kube import KubeClient, load_connection_settings
from specops.adapters.prometheus import MIN_POLL_INTERVAL_S, MetricsHub
from specops.handlers.lifecycle import parked_retry_delay
from specops.services import reconciler as reconciler_module
from specops.services.config import OperatorConfig
from specops.services.container import Services, build_services
from specops.services.reconciler import ReconcileParked
from specops.services.tick import interval_of
from specops_local.admission import AdmissionError, FieldCause
from specops_local.cluster import EmulatedCluster
from tests.component.test_tick_requests import NAME, NAMESPACE, _resource, _rewire, serve

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def services(cluster: EmulatedCluster, operator_env: None) -> AsyncIterator[Services]:
    built = await build_services(OperatorConfig.from_env())
    await built.kube.close()
    built.kube = KubeClient(load_connection_settings(str(cluster.kubeconfig_path)))
    _rewire(built)
    try:
        yield built
    finally:
        await built.close()


def condition(cluster: EmulatedCluster, kind: str) -> dict[str, Any]:
    live = cluster.get("speculativedeployments", NAME)
    assert live is not None
    found = [c for c in live.get("status", {}).get("conditions", []) if c["type"] == kind]
    assert found, live.get("status")
    return dict(found[0])


def store_past_admission(cluster: EmulatedCluster, body: dict[str, Any]) -> dict[str, Any]:
    """Store a body as an older CRD would have let it in (no admission for this write)."""
    resource = "speculativedeployments"
    hooks = cluster.emulator.admission
    key = next(k for k in hooks if str(getattr(k, "plural", "")) == resource)
    hook = hooks[key]
    del hooks[key]
    try:
        return dict(cluster.create(resource, body))
    finally:
        hooks[key] = hook


async def test_a_zero_parameter_count_that_got_past_admission_is_invalid_spec_not_a_crash(
    cluster: EmulatedCluster, services: Services
) -> None:
    body = _resource()
    body["spec"]["target"]["parameters"] = "0"  # ZeroDivisionError in perf.latency_ratio
    stored = store_past_admission(cluster, body)

    events = await services.reconciler.reconcile(stored, T0)

    ready = condition(cluster, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "target.parameters" in ready["message"]
    assert [e.reason for e in events] == ["InvalidSpec"]


async def test_an_exception_in_pure_reconcile_code_parks_the_resource_once(
    cluster: EmulatedCluster, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = dict(cluster.create("speculativedeployments", _resource()))

    def overflow(*_: Any) -> Any:
        raise OverflowError("math range error")

    monkeypatch.setattr(reconciler_module.lifecycle, "advisories", overflow)

    with pytest.raises(ReconcileParked) as first:
        await services.reconciler.reconcile(stored, T0)
    with pytest.raises(ReconcileParked) as second:
        await services.reconciler.reconcile(stored, T0 + timedelta(seconds=15))

    ready = condition(cluster, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "OverflowError: math range error" in ready["message"]
    assert [e.type for e in first.value.events] == ["Warning"]  # announced once
    assert second.value.events == []
    assert [parked_retry_delay(r) for r in range(8)] == [15, 30, 60, 120, 240, 480, 600, 600]


async def test_a_child_the_api_server_refuses_parks_the_resource_with_apply_failed(
    cluster: EmulatedCluster, services: Services
) -> None:
    def refuse(operation: str, new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        raise AdmissionError(
            [FieldCause("spec.ports", "FieldValueInvalid", "Invalid value: refused by policy")]
        )

    cluster.emulator.admission["v1/services"] = refuse
    stored = dict(cluster.create("speculativedeployments", _resource()))

    with pytest.raises(ReconcileParked) as parked:
        await services.reconciler.reconcile(stored, T0)

    ready = condition(cluster, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ApplyFailed")
    assert "422" in ready["message"] and "refused by policy" in ready["message"]
    assert [e.reason for e in parked.value.events] == ["ApplyFailed"]


async def test_an_exception_in_the_tick_is_a_degraded_condition_with_backoff_then_clears(
    cluster: EmulatedCluster, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    await serve(cluster, services)
    control = services.ticker.control
    real_tick = control.tick

    async def broken(*_: Any, **__: Any) -> Any:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(control, "tick", broken)
    first = await services.tick(NAMESPACE, NAME, lambda: T0)
    second = await services.tick(NAMESPACE, NAME, lambda: T0 + timedelta(seconds=2))

    degraded = condition(cluster, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "TickFailed")
    assert "ZeroDivisionError: float division by zero" in degraded["message"]
    assert [e.reason for e in first.events] == ["TickFailed"] and second.events == []
    assert first.interval_s == 2.0 and second.interval_s == 4.0  # 1 s interval, doubling

    # Another writer replaces the condition: the next failing tick says it again, without a new Event
    await services.reconciler.refresh(NAMESPACE, NAME, T0 + timedelta(seconds=3))
    assert condition(cluster, "Degraded")["reason"] == "AsExpected"
    third = await services.tick(NAMESPACE, NAME, lambda: T0 + timedelta(seconds=4))
    assert condition(cluster, "Degraded")["reason"] == "TickFailed" and third.events == []

    monkeypatch.setattr(control, "tick", real_tick)
    recovered = await services.tick(NAMESPACE, NAME, lambda: T0 + timedelta(seconds=12))

    assert recovered.interval_s == 1.0
    degraded = condition(cluster, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("False", "AsExpected")


@pytest.mark.parametrize(
    ("text", "seconds"), [("0s", 1.0), ("1ms", 1.0), ("9" * 400 + "s", 15.0), ("2h", 3600.0)]
)
def test_a_tick_interval_that_got_past_admission_is_clamped(text: str, seconds: float) -> None:
    interval = interval_of({"spec": {"metrics": {"interval": text}}}, 15.0)

    assert math.isfinite(interval) and interval == seconds


@pytest.mark.parametrize("asked", [0.0, 0.001, -5.0, math.nan])
async def test_the_shared_prometheus_poller_never_polls_faster_than_its_floor(asked: float) -> None:
    hub = MetricsHub()
    hub.register("fast", "http://127.0.0.1:9", "vllm", asked)
    try:
        poller = hub.poller("http://127.0.0.1:9", "vllm")
        assert poller is not None and poller.interval_s == MIN_POLL_INTERVAL_S
    finally:
        await hub.close()
