"""Resources named like models get children a real API server accepts, and find them again.

The emulated API server refuses names and labels the way a cluster does (object_names.py),
so a Service named ``70b-chat-stable`` or a 70-character label value fails here as it
would in production.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from specops.adapters.kube import KubeClient, load_connection_settings
from specops.adapters.prometheus import MetricsHub
from specops.api.models import API_VERSION, KIND
from specops.domain.metrics import build_snapshot
from specops.domain.names import label_value
from specops.services.config import OperatorConfig
from specops.services.container import build_services
from specops_local.cluster import EmulatedCluster
from tests.component.test_tick_requests import NAMESPACE, _ready_pods, _resource, _rewire

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LONG_NAME = "llama-3.1-70b-instruct-with-a-very-long-descriptive-suffix-for-prod"
LONG_PLAIN_NAME = "mixtral-8x22b-instruct-with-a-very-long-descriptive-suffix-for-prod"
MANAGED = ("deployments", "services", "configmaps")


@pytest.mark.parametrize("name", ["llama-3.1-70b", "70b-chat", LONG_NAME, LONG_PLAIN_NAME])
async def test_a_resource_named_like_a_model_serves_is_ticked_and_cleans_up(
    cluster: EmulatedCluster, operator_env: None, tmp_path: Path, name: str
) -> None:
    body = _resource()
    body["metadata"]["name"] = name
    cluster.create("speculativedeployments", body)
    services = await build_services(OperatorConfig.from_env())
    await services.kube.close()
    services.kube = KubeClient(load_connection_settings(str(cluster.kubeconfig_path)))
    _rewire(services)
    try:
        # Reconcile creates every child (the API server accepts their names and labels)
        live = cluster.get("speculativedeployments", name)
        assert live is not None
        await services.reconciler.reconcile(live, T0)
        kinds = {kind: cluster.objects(kind, NAMESPACE) for kind in MANAGED}
        assert len(kinds["deployments"]) == 1 and len(kinds["services"]) == 2, kinds
        _ready_pods(cluster)
        await services.reconciler.refresh(NAMESPACE, name, T0)
        live = cluster.get("speculativedeployments", name)
        assert live is not None
        ready = [c for c in live["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", live["status"]

        # The tick finds the pods through the same derived label value
        now = T0
        for _ in range(4):
            now += timedelta(seconds=1)
            await services.tick(NAMESPACE, name, lambda at=now: at)
        live = cluster.get("speculativedeployments", name)
        assert live is not None
        # speculation.pods.desired counts the ready pods the tick found by label
        replicas = kinds["deployments"][0]["spec"]["replicas"]
        assert replicas >= 1 and live["status"]["speculation"]["pods"]["desired"] == replicas, live["status"]

        # Deleting the resource removes every child it labelled
        await services.reconciler.cleanup(live)
        left = {kind: [o["metadata"]["name"] for o in cluster.objects(kind, NAMESPACE)] for kind in MANAGED}
        assert left == {kind: [] for kind in MANAGED}
    finally:
        await services.close()


async def test_metrics_are_looked_up_by_the_derived_label_value() -> None:
    url, backend = "http://127.0.0.1:9", "vllm"
    hub = MetricsHub()
    hub.register((NAMESPACE, LONG_NAME), url, backend, 15.0)
    try:
        poller = hub.poller(url, backend)
        assert poller is not None
        # The PodMonitor relabels the pod label specops.dev/deployment, which holds label_value(name).
        labels = {"namespace": NAMESPACE, "specops_deployment": label_value(LONG_NAME), "variant": "stable"}
        poller.latest = build_snapshot(
            poller.profile, {"batch_per_pod": [{"metric": labels, "value": [0, "3"]}]}, T0
        )

        found = hub.lookup(url, backend, NAMESPACE, LONG_NAME, "stable", T0)
    finally:
        await hub.close()

    assert found.ok, found
    assert found.batch == 3.0


def test_the_deployment_event_handler_finds_the_owner_of_a_long_name() -> None:
    from specops.handlers.lifecycle import owner_name

    meta = {
        "labels": {"specops.dev/deployment": label_value(LONG_NAME)},
        "ownerReferences": [{"apiVersion": API_VERSION, "kind": KIND, "name": LONG_NAME, "uid": "u"}],
    }

    assert owner_name(meta) == LONG_NAME


@pytest.mark.parametrize("key", ["bad key!", "-x.example/team", "example.com/" + "k" * 64])
async def test_a_pod_label_key_the_server_refuses_is_invalid_spec_not_a_retry_loop(
    cluster: EmulatedCluster, operator_env: None, key: str
) -> None:
    body = _resource()
    body["spec"]["serving"]["podLabels"] = {key: "v"}
    cluster.create("speculativedeployments", body)  # keys are not checked at admission
    services = await build_services(OperatorConfig.from_env())
    await services.kube.close()
    services.kube = KubeClient(load_connection_settings(str(cluster.kubeconfig_path)))
    _rewire(services)
    try:
        live = cluster.get("speculativedeployments", body["metadata"]["name"])
        assert live is not None
        events = await services.reconciler.reconcile(live, T0)
        # a readiness refresh (a Deployment event) does not overwrite what reconcile found
        await services.reconciler.refresh(NAMESPACE, body["metadata"]["name"], T0)
    finally:
        await services.close()

    live = cluster.get("speculativedeployments", body["metadata"]["name"])
    assert live is not None
    ready = next(c for c in live["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.serving.podLabels" in ready["message"] and key in ready["message"]
    assert [e.reason for e in events] == ["InvalidSpec"]
    assert cluster.objects("deployments", NAMESPACE) == []
