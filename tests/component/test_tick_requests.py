"""API requests of one resource's periodic tick, counted on the wire against the emulated API server.

A steady resource (serving, metrics unchanged, nothing to decide) must cost at most one GET of
the resource per tick, and write status only when something changed. The operator's scale
depends on it: every extra request is multiplied by the number of resources.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from specops.adapters.kube import KubeClient, load_connection_settings
from specops.domain.metrics import Measurement
from specops.ports import GenerateOutput
from specops.services import tick as tick_module
from specops.services.config import OperatorConfig
from specops.services.container import build_services
from specops_local.cluster import EmulatedCluster
from tests.conftest import EXAMPLES

NAMESPACE = "default"
NAME = "llama-70b-chat"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class SteadyMetrics:
    """A metrics source whose every lookup is the same healthy measurement."""

    def __init__(self) -> None:
        self.now = T0

    def register(self, key: Hashable, url: str, backend: str, interval_s: float) -> None:
        return None

    def unregister(self, key: Hashable) -> None:
        return None

    def lookup(
        self,
        url: str,
        backend: str,
        namespace: str,
        name: str,
        variant: str,
        now: datetime,
        draft_length: int | None = None,
    ) -> Measurement:
        return Measurement(
            phase="Ok",
            at=now,
            alpha=0.8,
            acceptance_rate=0.6,
            mean_draft_length=4.0,
            batch=4.0,
            request_rate=2.0,
            tokens_per_s=400.0,
            tpot_p50_s=0.01,
            tpot_p95_s=0.012,
            tpot_p99_s=0.013,
            pods_reporting=2,
        )

    async def close(self) -> None:
        return None


def _resource() -> dict[str, Any]:
    body = yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())
    body["metadata"] = {"name": NAME, "namespace": NAMESPACE}
    body["spec"]["metrics"] = {"prometheus": {"url": "http://127.0.0.1:9"}, "interval": "1s"}
    # The fake metrics below do not move with the setting: calibration would learn from them and
    # move the length (a decision, written at once). This test is about the cost of a steady tick.
    # Nor does a revision roll out on a predicted gain of a few percent: this example's first
    # schedule is within 3 % of the best one, and noisy acceptance would tip it (a decision too).
    body["spec"]["speculation"] = {
        "rollout": {"baseline": "2s", "soak": "2s"},
        "calibration": {"enabled": False},
        "reconfigure": {"minGain": 0.2},
    }
    return body


async def serve(cluster: EmulatedCluster, services: Any) -> None:
    """A new resource reconciled and its pods ready: serving, as its first tick finds it."""
    body = cluster.create("speculativedeployments", _resource())
    await services.reconciler.reconcile(body, T0)
    _ready_pods(cluster)
    await services.reconciler.refresh(NAMESPACE, NAME, T0)


async def serve_into_dynamic(cluster: EmulatedCluster, services: Any) -> datetime:
    """Serve, then warm up: Baseline (2 s), Fixed (2 s soak), then Dynamic; the time reached."""
    await serve(cluster, services)
    now = T0
    for _ in range(12):
        now += timedelta(seconds=1)
        await services.tick(NAMESPACE, NAME, lambda at=now: at)
        _ready_pods(cluster)
    live = cluster.get("speculativedeployments", NAME)
    assert live is not None and live["status"]["phase"] == "Dynamic", live["status"]
    return now


async def ten_ticks(services: Any, now: datetime) -> tuple[datetime, Any]:
    """Ten ticks one interval apart: the time reached and the last tick's outcome."""
    outcome = None
    for _ in range(10):
        now += timedelta(seconds=1)
        outcome = await services.tick(NAMESPACE, NAME, lambda at=now: at)
    return now, outcome


def _ready_pods(cluster: EmulatedCluster) -> None:
    """Play the Deployment controller and kubelet: each Deployment's pods exist, ready, with its
    template's labels (a new revision relabels them: its rollout done at once); pods of a
    Deployment gone or scaled down go."""
    wanted: dict[str, dict[str, str]] = {}
    for deployment in cluster.objects("deployments", NAMESPACE):
        replicas = int(deployment["spec"].get("replicas") or 0)
        cluster.patch_status(
            "deployments",
            deployment["metadata"]["name"],
            {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
            },
        )
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        for index in range(replicas):
            wanted[f"{deployment['metadata']['name']}-{index}"] = labels
    for pod in cluster.objects("pods", NAMESPACE):
        name = pod["metadata"]["name"]
        if name not in wanted or pod["metadata"].get("labels") != wanted[name]:
            cluster.emulator.delete_object(cluster.resource("pods"), NAMESPACE, name)
    existing = {pod["metadata"]["name"] for pod in cluster.objects("pods", NAMESPACE)}
    for pod_name, labels in wanted.items():
        if pod_name in existing:
            continue
        cluster.create(
            "pods",
            {
                "metadata": {"name": pod_name, "namespace": NAMESPACE, "labels": labels},
                "spec": {"containers": [{"name": "engine", "ports": [{"containerPort": 8000}]}]},
            },
        )
        cluster.patch_status(
            "pods",
            pod_name,
            {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
        )


def _classify(method: str, path: str) -> str:
    if re.search(r"/speculativedeployments/[^/]+/status$", path):
        return f"{method} status"
    if re.search(r"/speculativedeployments/[^/]+$", path):
        return f"{method} resource"
    kind = path.rstrip("/").split("/")[-1] if method == "GET" else path
    return f"{method} {kind}"


async def test_a_steady_resource_costs_one_get_per_tick_and_writes_status_only_on_change(
    cluster: EmulatedCluster, operator_env: None, tmp_path: Path
) -> None:
    # Given a serving resource whose metrics do not move and whose pods run the decided setting
    services, counts = await counted_services(cluster)
    try:
        now = await serve_into_dynamic(cluster, services)

        # When it ticks 10 more times, one interval apart
        counts.clear()
        now, outcome = await ten_ticks(services, now)
    finally:
        await services.close()

    # And the status the last tick computed, which the operator's metrics show, carries its own
    # measurement although status was not written for it
    assert outcome.status is not None
    assert outcome.status["observed"]["at"] == now.isoformat().replace("+00:00", "Z"), outcome.status[
        "observed"
    ]
    written = cluster.get("speculativedeployments", NAME)
    assert written is not None and written["status"]["observed"]["at"] != outcome.status["observed"]["at"]

    # Then it reads the resource at most once per tick and writes status only when something changed
    print("requests over 10 steady ticks:", dict(counts))
    assert counts["GET resource"] <= 10, dict(counts)
    # The measurements are refreshed in status once per refresh period (10 s here), nothing else moves.
    assert counts["PATCH status"] <= 1, dict(counts)


class NoisyAcceptance(SteadyMetrics):
    """The steady measurement, with acceptance read a little differently every scrape (as real
    acceptance is: +-0.03 around 0.80)."""

    readings = (0.80, 0.83, 0.77, 0.81, 0.79, 0.82, 0.78)

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def lookup(self, *args: Any, **kwargs: Any) -> Measurement:
        self.count += 1
        alpha = self.readings[self.count % len(self.readings)]
        return replace(super().lookup(*args, **kwargs), alpha=alpha)


async def test_a_reading_quoted_in_a_condition_message_does_not_write_status_every_tick(
    cluster: EmulatedCluster, operator_env: None
) -> None:
    # Given a serving resource in Dynamic whose acceptance reads differently every scrape (the
    # AcceptanceBelowSLO condition quotes it: "per-token acceptance 0.81 >= slo.minAcceptance")
    services, counts = await counted_services(cluster)
    try:
        now = await serve_into_dynamic(cluster, services)
        noisy = NoisyAcceptance()
        for service in _walk(services):
            if hasattr(service, "metrics"):
                service.metrics = noisy

        # When it ticks 10 more times, one interval apart
        counts.clear()
        now, outcome = await ten_ticks(services, now)
    finally:
        await services.close()

    # Then the tick's own status quotes each new reading (the operator's metrics show it) ...
    assert outcome.status is not None
    acceptance = next(c for c in outcome.status["conditions"] if c["type"] == "AcceptanceBelowSLO")
    assert acceptance["status"] == "False" and "acceptance 0." in acceptance["message"], acceptance
    # ... but status is written once per refresh period (10 s here), not at every moved message
    assert noisy.count >= 10
    assert counts["PATCH status"] <= 1, dict(counts)


async def test_a_resource_whose_only_writer_is_its_tick_is_validated_once(
    cluster: EmulatedCluster, operator_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a serving resource ticked from the body its last write returned, as Kopf's watch
    # hands the daemon the version that write made
    services, counts = await counted_services(cluster)
    validations: list[str] = []
    validate = tick_module.SpeculativeDeployment.model_validate

    def counting(body: Any) -> Any:
        validations.append(body["metadata"]["resourceVersion"])
        return validate(body)

    try:
        await serve(cluster, services)
        monkeypatch.setattr(tick_module.SpeculativeDeployment, "model_validate", counting)
        watched, now = cluster.get("speculativedeployments", NAME), T0
        counts.clear()
        # When it ticks through Baseline and Fixed into Dynamic, writing status on the way
        for _ in range(12):
            now += timedelta(seconds=1)
            outcome = await services.tick(NAMESPACE, NAME, lambda at=now: at, watched)
            watched = outcome.body or watched
            _ready_pods(cluster)  # the first draft's check pod, and each revision's pods
    finally:
        await services.close()

    # Then the typed resource came from validation once, then from what each write stored
    stored = cluster.get("speculativedeployments", NAME)
    assert stored is not None and stored["status"]["phase"] == "Dynamic"
    assert counts["PATCH status"] >= 3, dict(counts)
    assert len(validations) == 1, validations
    # and the copy the tick holds is what validating the stored resource gives
    held = services.ticker._resources[(NAMESPACE, NAME)]
    assert held.version == stored["metadata"]["resourceVersion"]
    assert held.status_wire == validate(stored).status.to_wire()
    assert held.resource.spec == validate(stored).spec


@pytest.mark.parametrize("conflict", [False, True], ids=["alone", "after-a-conflict"])
async def test_a_tick_whose_watch_lags_behind_its_own_write_acts_on_the_write(
    cluster: EmulatedCluster, operator_env: None, conflict: bool
) -> None:
    # Given a serving resource whose first draft is still unchecked, its check pod ready, as the
    # watch shows it (and, after-a-conflict, an annotation written meanwhile by another client, as
    # Kopf records its handlers' progress: the tick's write loses a conflict and re-reads)
    services, counts = await counted_services(cluster)
    try:
        await serve(cluster, services)
        await services.tick(NAMESPACE, NAME, lambda: T0, cluster.get("speculativedeployments", NAME))
        _ready_pods(cluster)
        assert any(
            pod["metadata"]["labels"].get("specops.dev/variant") == "canary"
            for pod in cluster.objects("pods", NAMESPACE)
        ), "the first draft's check pod"
        stale = cluster.get("speculativedeployments", NAME)
        assert stale is not None and stale["status"]["draft"]["losslessCheck"] == "Pending"
        watched = [stale]
        if conflict:
            resource = cluster.resource("speculativedeployments")
            touch = {"metadata": {"annotations": {"kopf.zalando.org/touch": "1"}}}
            watched.append(cluster.emulator.patch_object(resource, NAMESPACE, NAME, touch))

        # When one tick runs the check and writes Passed, and the next ones start from a version
        # the watch still shows (under load the watch lags an interval or more behind the server)
        counts.clear()
        first = await services.tick(NAMESPACE, NAME, lambda: T0 + timedelta(seconds=1), stale)
        assert counts["GET resource"] == (1 if conflict else 0), dict(counts)  # a conflict re-reads
        counts.clear()
        later = [
            await services.tick(NAMESPACE, NAME, lambda at=second: T0 + timedelta(seconds=at), body)
            for second, body in enumerate([stale, *watched], start=2)
        ]
    finally:
        await services.close()

    # Then the check ran and was announced once, and the later ticks wrote without a conflict
    assert [e.reason for e in first.events].count("LosslessCheckPassed") == 1, first.events
    for outcome in later:
        assert "LosslessCheckPassed" not in [e.reason for e in outcome.events], outcome.events
    assert counts["GET resource"] == 0, dict(counts)  # a 409 would have cost a fresh read
    stored = cluster.get("speculativedeployments", NAME)
    assert stored is not None and stored["status"]["draft"]["losslessCheck"] == "Passed"
    # and the check pod went once the verdict was written
    names = [d["metadata"]["name"] for d in cluster.objects("deployments", NAMESPACE)]
    assert [n for n in names if n != f"{NAME}-holdback"] == [NAME], names  # (the baseline holds one pod back)


async def test_a_large_fleet_refreshes_measurements_within_a_fleet_wide_write_budget(
    cluster: EmulatedCluster, operator_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 12 steady resources at 1 s intervals, and a budget of 0.5 refresh writes a second for the
    # whole operator (the default, 5 a second, binds only from 50 resources at 1 s, 300 at 15 s)
    monkeypatch.setattr(tick_module, "REFRESH_WRITES_PER_S", 0.5)
    names = [f"{NAME}-{index}" for index in range(12)]
    for name in names:
        body = _resource()
        body["metadata"]["name"] = name
        cluster.create("speculativedeployments", body)
    services, counts = await counted_services(cluster)
    try:
        for name in names:
            body = cluster.get("speculativedeployments", name)
            assert body is not None
            await services.reconciler.reconcile(body, T0)
        _ready_pods(cluster)
        for name in names:
            await services.reconciler.refresh(NAMESPACE, name, T0)
        now = T0
        for _ in range(12):  # warm up to the Dynamic phase
            now += timedelta(seconds=1)
            for name in names:
                await services.tick(NAMESPACE, name, lambda at=now: at)

        # When every resource ticks once a second for 48 s
        counts.clear()
        for _ in range(48):
            now += timedelta(seconds=1)
            for name in names:
                await services.tick(NAMESPACE, name, lambda at=now: at)
    finally:
        await services.close()

    # Then measurements are refreshed every 12 / 0.5 = 24 s per resource (two or three times in
    # 48 s), not every max(10 s, 4 intervals) = 10 s (five times): 0.5 a second for the fleet
    print("status writes over 48 s of 12 steady resources:", counts["PATCH status"])
    assert 12 <= counts["PATCH status"] <= 36, dict(counts)


class CountingKubeClient(KubeClient):
    """The production client, counting every request it puts on the wire (by ``classify``)."""

    def __init__(self, cluster: EmulatedCluster, classify: Callable[[str, str], str]) -> None:
        super().__init__(load_connection_settings(str(cluster.kubeconfig_path)))
        self.classify = classify
        self.counts: Counter[str] = Counter()

    async def _send(
        self, method: str, path: str, data: bytes | None, params: Mapping[str, str] | None, content_type: str
    ) -> tuple[int, str, bytes, str | None]:
        self.counts[self.classify(method, path)] += 1
        return await super()._send(method, path, data, params, content_type)


async def counted_services(
    cluster: EmulatedCluster, classify: Callable[[str, str], str] = _classify
) -> tuple[Any, Counter[str]]:
    """The operator's services on the emulated cluster, with the test's metrics and model control,
    and a count of every API request they send (by `classify`)."""
    services = await build_services(OperatorConfig.from_env())
    await services.kube.close()
    kube = CountingKubeClient(cluster, classify)
    services.kube = kube
    _rewire(services)
    return services, kube.counts


class SameEngines:
    """Every engine answers every golden prompt with the same greedy text (a lossless draft)."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate(
        self, url: str, backend: str, model: str, prompt: str, max_tokens: int, timeout_s: float
    ) -> GenerateOutput:
        self.calls += 1
        return GenerateOutput(ok=True, text=f"the answer to {prompt}")

    async def healthy(self, url: str, backend: str, timeout_s: float = 2.0) -> bool:
        return True

    async def close(self) -> None:
        return None


def _rewire(services: Any) -> None:
    """Point every service at the test's client, metrics and engines."""
    metrics, engines = SteadyMetrics(), SameEngines()
    services.metrics = metrics
    for service in _walk(services):
        for attribute, value in (("kube", services.kube), ("metrics", metrics), ("engines", engines)):
            if hasattr(service, attribute):
                setattr(service, attribute, value)


def _walk(root: Any) -> list[Any]:
    seen: list[Any] = []
    stack = [root]
    while stack:
        item = stack.pop()
        if any(item is other for other in seen):
            continue
        seen.append(item)
        for value in vars(item).values() if hasattr(item, "__dict__") else ():
            if type(value).__module__.startswith("specops.services") or type(value).__module__.startswith(
                "specops.adapters.routing"
            ):
                stack.append(value)
    return seen
