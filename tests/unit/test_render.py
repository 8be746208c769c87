"""Rendering a SpeculativeDeployment into the objects that serve it."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from specops.api.models import DraftSpec, SpeculativeDeployment
from specops.domain import drafts, render
from specops.domain.engines.schedule import PLAIN, Revision, Schedule
from specops.domain.render import RenderError, RenderOptions
from specops.domain.render import render_children as _render_children
from tests.unit.golden import assert_golden

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
UID = "7a3c1e52-9b0d-4f6e-8c21-5d4f3a2b1c00"
OPTIONS = RenderOptions(triton_model_source="# specops LLM API model (fixed text for golden files)\n")
SCHEDULE = Schedule.of([[8, 4], [32, 2], [None, 0]])
K8S_VERSION = latest_version()
BUILT_IN_KINDS = {"ConfigMap", "Deployment", "Service"}


def body(name: str = "dense-70b-7b.yaml") -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    data["metadata"]["uid"] = UID
    return data


def resource(data: dict[str, Any] | None = None) -> SpeculativeDeployment:
    return SpeculativeDeployment.model_validate(data if data is not None else body())


def speculating(draft: DraftSpec | None = None, schedule: Schedule = SCHEDULE) -> Revision:
    draft = draft or resource().spec.draft
    return Revision(mode="spec", method=draft.method, draft=drafts.draft_identity(draft), schedule=schedule)


def render_children(
    res: SpeculativeDeployment, options: RenderOptions, revision: Revision | None = None, **kwargs: Any
) -> list[dict[str, Any]]:
    draft = kwargs.get("draft") or res.spec.draft
    return _render_children(res, options, revision or speculating(draft), **kwargs)


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    [match] = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    return match


def walk_keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from walk_keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk_keys(item)


def serving_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    [container] = [c for c in pod["containers"] if c["name"] == "engine"]
    return container


def new_draft(version: str = "v4", uri: str = "pvc://models/llama-70b-draft/v4") -> DraftSpec:
    return DraftSpec.model_validate(
        {"model": "llama-3.1-8b-draft", "version": version, "parameters": "7B", "uri": uri}
    )


# ---------------------------------------------------------------- golden files and validity


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_examples_render_as_the_golden_files(path: Path) -> None:
    assert_golden(path.stem, render_children(resource(body(path.name)), OPTIONS))


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_built_in_object_passes_the_kubernetes_schema(path: Path) -> None:
    objects = render_children(resource(body(path.name)), OPTIONS)
    canary = render_children(
        resource(body(path.name)), OPTIONS, variant="canary", draft=new_draft(), replicas=1
    )
    validated = 0
    for obj in objects + canary:
        if obj["kind"] in BUILT_IN_KINDS:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            validated += 1
    assert validated == 4 + 3


def test_stable_render_has_the_expected_objects_and_names() -> None:
    objects = render_children(resource(), OPTIONS)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ConfigMap", "llama-70b-chat-engine-config"),
        ("Deployment", "llama-70b-chat"),
        ("Service", "llama-70b-chat-stable"),
        ("Service", "llama-70b-chat"),
        ("PodMonitor", "llama-70b-chat"),
    ]
    assert all(o["metadata"]["namespace"] == "inference" for o in objects)


def test_rendering_is_deterministic() -> None:
    assert render_children(resource(), OPTIONS) == render_children(resource(), OPTIONS)


def test_no_kopf_state_is_copied_to_children() -> None:
    data = body()
    data["metadata"]["annotations"] = {"kopf.zalando.org/last-handled-configuration": "{}", "team": "ml"}
    data["metadata"]["finalizers"] = ["kopf.zalando.org/KopfFinalizerMarker"]
    objects = render_children(resource(data), OPTIONS)
    assert not [key for key in walk_keys(objects) if key.startswith("kopf.")]
    assert "kopf" not in yaml.safe_dump(objects)


def test_every_object_is_owned_by_the_resource_and_labelled() -> None:
    for obj in render_children(resource(), OPTIONS):
        meta = obj["metadata"]
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "specops.dev/v1alpha1",
                "kind": "SpeculativeDeployment",
                "name": "llama-70b-chat",
                "uid": UID,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"]["app.kubernetes.io/name"] == "specops-serving"
        assert meta["labels"]["app.kubernetes.io/instance"] == "llama-70b-chat"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "specops"
        assert meta["labels"]["specops.dev/deployment"] == "llama-70b-chat"
        assert meta["labels"]["specops.dev/variant"] == "stable"


# ---------------------------------------------------------------- the pod


def test_pod_runs_restricted() -> None:
    pod = one(render_children(resource(), OPTIONS), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/tmp", "/home/engine", "/dev/shm"} <= mounts


@pytest.mark.parametrize("backend", ["triton", "trtllm-serve", "vllm", "sglang"])
def test_each_backend_starts_its_own_engine_with_the_revision(backend: str) -> None:
    data = body()
    data["spec"]["serving"]["backend"] = backend
    objects = render_children(resource(data), OPTIONS)
    container = serving_container(objects)
    command = " ".join(container["command"] + container["args"])
    expected = {
        "triton": "tritonserver",
        "trtllm-serve": "trtllm-serve",
        "vllm": "vllm serve",
        "sglang": "sglang.launch_server",
    }
    assert expected[backend] in command
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert labels["specops.dev/revision"] == speculating().digest
    assert labels["specops.dev/mode"] == "spec" and labels["specops.dev/backend"] == backend
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["specops.dev/schedule"] == "draftModel K=4 to batch 8, K=2 to batch 32, K=0 above 32"


def test_a_plain_revision_starts_the_engine_without_speculation_or_draft() -> None:
    objects = render_children(resource(), OPTIONS, PLAIN)
    pod = one(objects, "Deployment")["spec"]["template"]
    assert pod["metadata"]["labels"]["specops.dev/mode"] == "plain"
    assert pod["metadata"]["labels"]["specops.dev/draft"] == ""
    assert "speculative_config" not in one(objects, "ConfigMap")["data"]["tensorrt_llm.1.model.yaml"]
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert "/models/target" in mounts and "/models/draft" not in mounts


def test_pvc_checkpoints_are_mounted_read_only_from_their_sub_paths() -> None:
    container = serving_container(render_children(resource(), OPTIONS))
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/models/target"]["readOnly"] is True
    assert mounts["/models/target"]["subPath"] == "llama-3.1-70b-instruct"
    assert mounts["/models/draft"]["subPath"] == "llama-70b-draft/v3"


def test_object_store_checkpoints_are_fetched_by_an_init_container() -> None:
    data = body()
    data["spec"]["target"]["uri"] = "hf://meta-llama/Llama-3.1-70B-Instruct@0e9e39f"
    data["spec"]["serving"]["checkpointFetcherImage"] = "registry.example.com/fetch:1"
    pod = one(render_children(resource(data), OPTIONS), "Deployment")["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    assert fetch["args"] == [
        "fetch-checkpoint",
        "hf://meta-llama/Llama-3.1-70B-Instruct@0e9e39f",
        "/models/target",
    ]
    assert fetch["securityContext"]["runAsNonRoot"] is True


def test_engine_config_is_mounted_read_only_with_one_item_per_file() -> None:
    objects = render_children(resource(), OPTIONS)
    configmap = one(objects, "ConfigMap")
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "engine-config")
    items = {item["key"]: item["path"] for item in volume["configMap"]["items"]}
    assert items["tensorrt_llm.1.model.yaml"] == "tensorrt_llm/1/model.yaml"
    assert set(items) == set(configmap["data"])
    assert configmap["data"]["tensorrt_llm.1.model.py"] == OPTIONS.triton_model_source


def test_rollout_bounds_come_from_the_spec() -> None:
    data = body()
    data["spec"]["serving"].update(maxSurge=0, maxUnavailable=1)
    strategy = one(render_children(resource(data), OPTIONS), "Deployment")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def test_a_new_revision_or_draft_rolls_the_pods() -> None:
    def template(revision: Revision | None = None, draft: DraftSpec | None = None) -> dict[str, Any]:
        deployment = one(render_children(resource(), OPTIONS, revision, draft=draft), "Deployment")
        return dict(deployment["spec"]["template"])

    assert template() == template()
    assert template() != template(draft=new_draft())
    assert template() != template(speculating(schedule=Schedule.constant(2)))


# ---------------------------------------------------------------- services, canary, monitoring


def test_shared_service_selects_every_variant_and_variant_services_only_theirs() -> None:
    stable = render_children(resource(), OPTIONS)
    canary = render_children(resource(), OPTIONS, variant="canary", draft=new_draft(), replicas=1)

    def pod_labels(objects: list[dict[str, Any]]) -> dict[str, str]:
        return dict(one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"])

    def selects(service: dict[str, Any], labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in service["spec"]["selector"].items())

    shared = one(stable, "Service", "llama-70b-chat")
    stable_only = one(stable, "Service", "llama-70b-chat-stable")
    canary_only = one(canary, "Service", "llama-70b-chat-canary")
    assert selects(shared, pod_labels(stable)) and selects(shared, pod_labels(canary))
    assert selects(stable_only, pod_labels(stable)) and not selects(stable_only, pod_labels(canary))
    assert selects(canary_only, pod_labels(canary)) and not selects(canary_only, pod_labels(stable))
    assert {p["name"]: p["port"] for p in shared["spec"]["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
    }
    data = body()
    data["spec"]["serving"]["backend"] = "sglang"
    sglang = one(render_children(resource(data), OPTIONS), "Service", "llama-70b-chat")
    assert {p["name"]: p["port"] for p in sglang["spec"]["ports"]} == {"http": 30000}
    deployment = one(stable, "Deployment")
    assert deployment["spec"]["selector"]["matchLabels"] == render.selector_labels("llama-70b-chat", "stable")


def test_canary_render_differs_only_in_names_labels_and_draft() -> None:
    stable = render_children(resource(), OPTIONS)
    canary = render_children(
        resource(),
        OPTIONS,
        variant="canary",
        draft=new_draft("v4", "pvc://models/llama-70b-draft/v4"),
        replicas=2,
    )
    # the canary brings no second user-facing Service and no second PodMonitor
    assert [(o["kind"], o["metadata"]["name"]) for o in canary] == [
        ("ConfigMap", "llama-70b-chat-canary-engine-config"),
        ("Deployment", "llama-70b-chat-canary"),
        ("Service", "llama-70b-chat-canary"),
    ]
    renames = {
        "llama-70b-chat-engine-config": "llama-70b-chat-canary-engine-config",
        "llama-70b-chat-stable": "llama-70b-chat-canary",
        "stable": "canary",
        "v3": "v4",
        "llama-70b-draft/v3": "llama-70b-draft/v4",
        # the draft identity label: version and a hash of version and checkpoint
        drafts.draft_identity(resource().spec.draft): drafts.draft_identity(
            new_draft("v4", "pvc://models/llama-70b-draft/v4")
        ),
        speculating().digest: speculating(new_draft("v4", "pvc://models/llama-70b-draft/v4")).digest,
    }

    def renamed(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: renamed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [renamed(v) for v in value]
        if isinstance(value, str):
            return renames.get(value, value)
        return value

    expected = renamed(stable[:3])
    expected[1]["metadata"]["name"] = "llama-70b-chat-canary"
    expected[1]["spec"]["template"]["metadata"]["annotations"]["specops.dev/config-hash"] = canary[1]["spec"][
        "template"
    ]["metadata"]["annotations"]["specops.dev/config-hash"]
    # the engine config names nothing of the variant: the same files, the draft mounted from elsewhere
    assert canary[0]["data"] == stable[0]["data"]
    assert canary == expected


def test_pod_monitor_scrapes_metrics_with_the_labels_the_queries_group_by() -> None:
    objects = render_children(resource(), OPTIONS)
    monitor = one(objects, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics" and endpoint["interval"] == "15s"
    targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert targets == {
        "specops_deployment": ["__meta_kubernetes_pod_label_specops_dev_deployment"],
        "variant": ["__meta_kubernetes_pod_label_specops_dev_variant"],
        "specops_draft": ["__meta_kubernetes_pod_label_specops_dev_draft"],
        "specops_revision": ["__meta_kubernetes_pod_label_specops_dev_revision"],
        "namespace": ["__meta_kubernetes_namespace"],
        "pod": ["__meta_kubernetes_pod_name"],
    }
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/component": "serving",
        "specops.dev/deployment": "llama-70b-chat",
    }


def test_pod_monitor_interval_is_a_prometheus_duration_and_can_be_turned_off() -> None:
    data = body()
    data["spec"]["metrics"]["interval"] = "1.5m"
    monitor = one(render_children(resource(data), OPTIONS), "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["interval"] == "90s"
    options = RenderOptions(pod_monitor=False)
    assert by_kind(render_children(resource(), options), "PodMonitor") == []
    data["spec"]["serving"]["backend"] = "trtllm-serve"
    monitor = one(render_children(resource(data), OPTIONS), "PodMonitor")
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/prometheus/metrics")


# ---------------------------------------------------------------- images, names, errors


def test_the_image_is_the_spec_s_else_the_operator_s_else_the_backend_s_default() -> None:
    data = body()
    data["spec"]["serving"].pop("image", None)
    assert serving_container(render_children(resource(data), OPTIONS))["image"].startswith(
        "nvcr.io/nvidia/tritonserver:"
    )
    data["spec"]["serving"]["backend"] = "vllm"
    assert serving_container(render_children(resource(data), OPTIONS))["image"].startswith(
        "vllm/vllm-openai:"
    )
    options = RenderOptions(default_image="registry.example.com/engine:default")
    assert (
        serving_container(render_children(resource(data), options))["image"]
        == "registry.example.com/engine:default"
    )
    data["spec"]["serving"]["image"] = "registry.example.com/mine:1"
    assert (
        serving_container(render_children(resource(data), options))["image"] == "registry.example.com/mine:1"
    )


def test_missing_uid_is_a_render_error() -> None:
    data = body()
    del data["metadata"]["uid"]
    with pytest.raises(RenderError) as raised:
        render_children(resource(data), OPTIONS)
    assert raised.value.field == "metadata.uid"


def test_replicas_default_to_the_spec_and_can_be_overridden() -> None:
    assert one(render_children(resource(), OPTIONS), "Deployment")["spec"]["replicas"] == 2
    assert one(render_children(resource(), OPTIONS, replicas=0), "Deployment")["spec"]["replicas"] == 0


def test_child_names_stay_valid_dns_labels_for_long_resource_names() -> None:
    assert render.child_name("llama", "stable") == "llama"
    assert render.child_name("llama", "canary") == "llama-canary"
    long_name = "a" * 60 + "-chat-assistant-production"
    names = {render.child_name(long_name, "stable"), render.child_name(long_name, "canary")}
    assert len(names) == 2 and all(len(n) <= 63 and n[-1].isalnum() for n in names)
    data = copy.deepcopy(body())
    data["metadata"]["name"] = long_name
    for obj in render_children(resource(data), OPTIONS, variant="canary", draft=new_draft(), replicas=1):
        assert len(obj["metadata"]["name"]) <= 63
        assert all(len(v) <= 63 for v in obj["metadata"]["labels"].values())
        if obj["kind"] in BUILT_IN_KINDS:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
