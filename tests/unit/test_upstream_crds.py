"""What specops writes of other projects' kinds passes those projects' real CRDs (schemas and CEL
rules, operator/specops_local/upstream-crds/): the PodMonitor it renders, the HTTPRoute weights of a canary,
and the JobSet and TrainJob of a retraining round. The emulated API server registers the same CRDs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from specops.adapters.routing import split_backend_refs
from specops.domain import retraining as rt
from specops.domain.engines.schedule import Revision, Schedule
from specops.domain.render import RenderOptions, render_children
from specops_local.admission import AdmissionError, CrdAdmission
from specops_local.upstream_crds import upstream_crd, upstream_crds
from tests.unit.test_render import resource as serving_resource
from tests.unit.test_retraining import example, trigger

REVISION = Revision(mode="spec", method="draftModel", draft="d", schedule=Schedule.constant(4))


def admit(obj: dict[str, Any]) -> dict[str, Any]:
    group = obj["apiVersion"].split("/")[0]
    return CrdAdmission(upstream_crd(group, obj["kind"]))("CREATE", obj, None)


def test_every_upstream_crd_is_registered_with_only_its_storage_version() -> None:
    kinds = {(crd["spec"]["group"], crd["spec"]["names"]["kind"]) for crd in upstream_crds()}
    assert kinds == {
        ("gateway.networking.k8s.io", "HTTPRoute"),
        ("monitoring.coreos.com", "PodMonitor"),
        ("monitoring.coreos.com", "ServiceMonitor"),
        ("monitoring.coreos.com", "PrometheusRule"),
        ("jobset.x-k8s.io", "JobSet"),
        ("trainer.kubeflow.org", "TrainJob"),
    }
    for crd in upstream_crds():
        assert [version["storage"] for version in crd["spec"]["versions"]] == [True]


def test_the_rendered_pod_monitor_passes_the_prometheus_operator_crd() -> None:
    objects = render_children(
        serving_resource(), RenderOptions(triton_model_source="# model\n", pod_monitor=True), REVISION
    )
    (pod_monitor,) = [obj for obj in objects if obj["kind"] == "PodMonitor"]
    admit(pod_monitor)


ROUTE: dict[str, Any] = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "chat", "namespace": "inference"},
    "spec": {
        "parentRefs": [{"name": "inference-gateway"}],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}],
                "backendRefs": [{"name": "chat-stable", "port": 8000}],
            }
        ],
    },
}


@pytest.mark.parametrize("weight", [0, 5, 25, 100])
def test_canary_weights_on_the_users_route_pass_the_gateway_api_crd(weight: int) -> None:
    route = admit(copy.deepcopy(ROUTE))  # as stored: defaults filled in
    route["spec"]["rules"] = split_backend_refs(route["spec"]["rules"], "chat-stable", "chat-canary", weight)
    admitted = admit(route)
    weights = {ref["name"]: ref["weight"] for ref in admitted["spec"]["rules"][0]["backendRefs"]}
    assert weights.get("chat-canary", 0) == weight


def test_the_gateway_api_crd_refuses_what_a_real_server_refuses() -> None:
    route = copy.deepcopy(ROUTE)
    route["spec"]["rules"][0]["backendRefs"][0]["weight"] = 2_000_000  # above the CRD's maximum
    with pytest.raises(AdmissionError) as refused:
        admit(route)
    assert "spec.rules[0].backendRefs[0].weight" in str(refused.value)


@pytest.mark.parametrize("example_file", ["jobset-multinode.yaml", "trainjob.yaml"])
def test_retraining_objects_pass_their_projects_crds(example_file: str) -> None:
    manifest = rt.render_training_job(example(example_file), trigger())
    admit(manifest)
