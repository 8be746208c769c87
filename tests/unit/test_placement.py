"""Placement and sizing of the serving pods (spec.serving): resources besides GPUs, nodeSelector,
tolerations, affinity, topology spread, pull secrets, priority, pod labels and annotations, on the
stable and the canary pods alike, admitted by the CRD and valid for the Kubernetes schema."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from specops.api.models import DraftSpec, SpeculativeDeployment
from specops.domain.engines.schedule import Revision, Schedule
from specops.domain.names import CANARY
from specops.domain.render import RenderError, RenderOptions, render_children
from specops_local.admission import AdmissionError, CrdAdmission

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "specops.dev_speculativedeployments.yaml").read_text())
REVISION = Revision(mode="spec", method="draftModel", draft="d", schedule=Schedule.constant(4))
OPTIONS = RenderOptions(triton_model_source="# model\n")
PLACEMENT: dict[str, Any] = {
    "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "128Gi", "cpu": 16}},
    "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
    "tolerations": [
        {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 120},
    ],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
                        ]
                    }
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"specops.dev/deployment": "llama-70b-chat"}},
        }
    ],
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "priorityClassName": "inference-high",
    "podLabels": {"team": "inference", "specops.dev/variant": "mine"},
    "podAnnotations": {"cost-center": "1234"},
}


def body(**serving: Any) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docs" / "examples" / "dense-70b-7b.yaml").read_text())
    data["metadata"]["uid"] = "7a3c1e52-9b0d-4f6e-8c21-5d4f3a2b1c00"
    data["spec"]["serving"].update(copy.deepcopy(serving))
    return data


def pod_template(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [obj for obj in objects if obj["kind"] == "Deployment"]
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def test_placement_reaches_the_serving_pods() -> None:
    template = pod_template(
        render_children(SpeculativeDeployment.model_validate(body(**PLACEMENT)), OPTIONS, REVISION)
    )
    pod = template["spec"]
    (container,) = pod["containers"]
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
        "limits": {"cpu": 16, "memory": "128Gi", "nvidia.com/gpu": "4"},
    }
    assert pod["nodeSelector"] == PLACEMENT["nodeSelector"]
    # the GPU taint stays tolerated, the user's tolerations follow
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        *PLACEMENT["tolerations"],
    ]
    assert pod["affinity"] == PLACEMENT["affinity"]
    assert pod["topologySpreadConstraints"] == PLACEMENT["topologySpreadConstraints"]
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["priorityClassName"] == "inference-high"
    labels, annotations = template["metadata"]["labels"], template["metadata"]["annotations"]
    assert labels["team"] == "inference"
    assert labels["specops.dev/variant"] == "stable"  # specops' own labels win: selectors keep working
    assert annotations["cost-center"] == "1234" and "specops.dev/config-hash" in annotations


def test_canary_pods_get_the_same_placement() -> None:
    resource = SpeculativeDeployment.model_validate(body(**PLACEMENT))
    draft = DraftSpec.model_validate({**body()["spec"]["draft"], "version": "v9"})
    stable = pod_template(render_children(resource, OPTIONS, REVISION))["spec"]
    canary = pod_template(
        render_children(resource, OPTIONS, REVISION, variant=CANARY, draft=draft, replicas=1)
    )["spec"]
    for field in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints", "imagePullSecrets"):
        assert canary[field] == stable[field], field
    assert canary["containers"][0]["resources"] == stable["containers"][0]["resources"]


def test_the_placed_deployment_passes_strict_kubernetes_validation() -> None:
    objects = render_children(SpeculativeDeployment.model_validate(body(**PLACEMENT)), OPTIONS, REVISION)
    (deployment,) = [obj for obj in objects if obj["kind"] == "Deployment"]
    kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_without_placement_the_pods_are_as_before() -> None:
    pod = pod_template(render_children(SpeculativeDeployment.model_validate(body()), OPTIONS, REVISION))[
        "spec"
    ]
    assert not {
        "nodeSelector",
        "affinity",
        "topologySpreadConstraints",
        "imagePullSecrets",
        "priorityClassName",
    } & set(pod)
    assert pod["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": "4"},
        "requests": {"nvidia.com/gpu": "4"},
    }


def test_the_crd_admits_the_placement_fields() -> None:
    admitted = CrdAdmission(CRD)("CREATE", body(**PLACEMENT), None)
    serving = admitted["spec"]["serving"]
    assert serving["resources"] == PLACEMENT["resources"]
    assert serving["affinity"] == PLACEMENT["affinity"]  # a full core type, kept as written


@pytest.mark.parametrize(
    ("serving", "field"),
    [
        ({"resources": {"requests": {"nvidia.com/gpu": "2"}}}, "spec.serving.resources.requests"),
        ({"resources": {"limits": {"memory": "lots"}}}, "spec.serving.resources.limits"),
        ({"tolerations": [{"key": "a", "operator": "Sometimes"}]}, "spec.serving.tolerations[0].operator"),
        ({"imagePullSecrets": [{"name": "Not_A_Name"}]}, "spec.serving.imagePullSecrets[0].name"),
    ],
)
def test_the_crd_and_the_models_refuse_bad_placement(serving: dict[str, Any], field: str) -> None:
    with pytest.raises(AdmissionError) as refused:
        CrdAdmission(CRD)("CREATE", body(**serving), None)
    assert field in str(refused.value)
    # and a resource that got past an older CRD is refused by the models as well
    with pytest.raises(ValidationError):
        SpeculativeDeployment.model_validate(body(**serving))


EXTRAS: dict[str, Any] = {
    "env": [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub-token", "key": "token"}}},
        {"name": "NCCL_DEBUG", "value": "WARN"},
        {"name": "HOME", "value": "/somewhere/else"},  # specops' own: ignored
    ],
    "volumes": [
        {
            "name": "cache",
            "ephemeral": {
                "volumeClaimTemplate": {
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "100Gi"}},
                    }
                }
            },
        }
    ],
    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
}


def test_extra_env_and_volumes_reach_the_engine_container() -> None:
    objects = render_children(SpeculativeDeployment.model_validate(body(**EXTRAS)), OPTIONS, REVISION)
    pod = pod_template(objects)["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item for item in container["env"]}
    # a Secret is referenced by name and key, never read: its value is not in the pod spec
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hub-token", "key": "token"}},
    }
    assert env["NCCL_DEBUG"]["value"] == "WARN"
    assert env["HOME"]["value"] == "/home/engine" and len(container["env"]) == len(env)
    assert pod["volumes"][-1] == EXTRAS["volumes"][0]
    assert container["volumeMounts"][-1] == {"name": "cache", "mountPath": "/cache"}
    (deployment,) = [obj for obj in objects if obj["kind"] == "Deployment"]
    kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize(
    ("serving", "field"),
    [
        ({"volumes": [{"name": "tmp", "emptyDir": {}}]}, "spec.serving.volumes[0].name"),
        (
            {"volumes": [{"name": "x", "emptyDir": {}}], "volumeMounts": [{"name": "y", "mountPath": "/y"}]},
            "spec.serving.volumeMounts[0].name",
        ),
        (
            {
                "volumes": [{"name": "x", "emptyDir": {}}],
                "volumeMounts": [{"name": "x", "mountPath": "/tmp/x"}],
            },
            "spec.serving.volumeMounts[0].mountPath",
        ),
    ],
)
def test_extra_volumes_cannot_shadow_what_specops_mounts(serving: dict[str, Any], field: str) -> None:
    with pytest.raises(RenderError) as refused:
        render_children(SpeculativeDeployment.model_validate(body(**serving)), OPTIONS, REVISION)
    assert refused.value.field == field


def test_an_env_var_with_both_a_value_and_a_source_is_refused() -> None:
    both = {"env": [{"name": "X", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}
    with pytest.raises(AdmissionError) as refused:
        CrdAdmission(CRD)("CREATE", body(**both), None)
    assert "set value or valueFrom, not both" in str(refused.value)
    with pytest.raises(ValidationError):
        SpeculativeDeployment.model_validate(body(**both))
    two_sources = {
        "env": [
            {
                "name": "X",
                "valueFrom": {
                    "fieldRef": {"fieldPath": "status.podIP"},
                    "configMapKeyRef": {"name": "c", "key": "k"},
                },
            }
        ]
    }
    with pytest.raises(AdmissionError) as refused:
        CrdAdmission(CRD)("CREATE", body(**two_sources), None)
    assert "exactly one of" in str(refused.value)
    with pytest.raises(ValidationError):
        SpeculativeDeployment.model_validate(body(**two_sources))
