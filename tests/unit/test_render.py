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
from specops.domain.render import RenderError, RenderOptions, render_children
from tests.unit.golden import assert_golden

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
UID = "7a3c1e52-9b0d-4f6e-8c21-5d4f3a2b1c00"
OPTIONS = RenderOptions(bls_source="# specops BLS model (fixed text for golden files)\n")
K8S_VERSION = latest_version()
BUILT_IN_KINDS = {"ConfigMap", "Deployment", "Service"}


def body(name: str = "dense-70b-7b.yaml") -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    data["metadata"]["uid"] = UID
    return data


def resource(data: dict[str, Any] | None = None) -> SpeculativeDeployment:
    return SpeculativeDeployment.model_validate(data if data is not None else body())


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
    [container] = [c for c in pod["containers"] if c["name"] == "triton"]
    return container


def new_draft(version: str = "v4", uri: str = "pvc://engines/llama-70b-draft/v4") -> DraftSpec:
    return DraftSpec.model_validate(
        {"model": "llama-3.1-8b-draft", "version": version, "parameters": "7B", "engine": {"uri": uri}}
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
        ("ConfigMap", "llama-70b-chat-model-repository"),
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
    objects = render_children(resource(body("dense-70b-7b.yaml")), OPTIONS)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = serving_container(objects)["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in serving_container(objects)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # Triton writes only to emptyDirs; the python backend's shared memory is RAM-backed
    for path in ("/tmp", "/home/triton-server", "/dev/shm"):
        assert "emptyDir" in volumes[mounts[path]]
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}


def test_container_runs_tritonserver_in_explicit_mode_with_every_model() -> None:
    container = serving_container(render_children(resource(), OPTIONS))
    assert container["args"] == [
        "tritonserver",
        "--model-repository=/models",
        "--model-control-mode=explicit",
        "--load-model=tensorrt_llm",
        "--load-model=tensorrt_llm_draft",
        "--load-model=tensorrt_llm_bls",
        "--load-model=ensemble",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
        "--allow-metrics=true",
        "--metrics-config=histogram_latencies=true",
    ]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
    }
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"


def test_pvc_engines_are_mounted_read_only_from_their_sub_paths() -> None:
    objects = render_children(resource(), OPTIONS)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in serving_container(objects)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["/engines/target"]["subPath"] == "llama-70b/h100-tp4"
    assert mounts["/engines/draft"]["subPath"] == "llama-70b-draft/v3"
    for path in ("/engines/target", "/engines/draft"):
        assert mounts[path]["readOnly"] is True
        claim = volumes[mounts[path]["name"]]["persistentVolumeClaim"]
        assert claim == {"claimName": "engines", "readOnly": True}
    assert "initContainers" not in pod


def test_object_store_engine_is_fetched_by_an_init_container() -> None:
    data = body()
    data["spec"]["target"]["engine"]["uri"] = "s3://models/llama-70b/h100-tp4"
    data["spec"]["serving"]["engineFetcherImage"] = "registry.example.com/specops/fetch-engine:1"
    objects = render_children(resource(data), OPTIONS)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    [fetcher] = pod["initContainers"]
    assert fetcher["image"] == "registry.example.com/specops/fetch-engine:1"
    assert fetcher["args"] == ["fetch-engine", "s3://models/llama-70b/h100-tp4", "/engines/target"]
    assert fetcher["securityContext"]["readOnlyRootFilesystem"] is True
    target_mount = next(
        m for m in serving_container(objects)["volumeMounts"] if m["mountPath"] == "/engines/target"
    )
    assert "subPath" not in target_mount and target_mount["readOnly"] is True
    [fetched] = [m for m in fetcher["volumeMounts"] if m["mountPath"] == "/engines/target"]
    assert fetched["name"] == target_mount["name"]
    assert next(v for v in pod["volumes"] if v["name"] == target_mount["name"])["emptyDir"] == {}
    kubernetes_validate.validate(one(objects, "Deployment"), K8S_VERSION, strict=True)


def test_model_repository_is_mounted_read_only_with_one_item_per_file() -> None:
    objects = render_children(resource(), OPTIONS)
    configmap = one(objects, "ConfigMap")
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if "configMap" in v]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    items = {item["key"]: item["path"] for item in volume["configMap"]["items"]}
    assert items["tensorrt_llm_bls.1.model.py"] == "tensorrt_llm_bls/1/model.py"
    assert items["tensorrt_llm.config.pbtxt"] == "tensorrt_llm/config.pbtxt"
    assert set(items) == set(configmap["data"])
    assert configmap["data"]["tensorrt_llm_bls.1.model.py"] == OPTIONS.bls_source
    [mount] = [m for m in serving_container(objects)["volumeMounts"] if m["name"] == volume["name"]]
    assert mount == {"name": volume["name"], "mountPath": "/models", "readOnly": True}


def test_bls_parameters_name_the_deployment_variant_and_draft() -> None:
    configmap = one(render_children(resource(), OPTIONS), "ConfigMap")
    bls = configmap["data"]["tensorrt_llm_bls.config.pbtxt"]
    for key, value in {
        # pods start plain: speculation goes on at run time, once the draft passed its check
        "specops_default_num_draft_tokens": "0",
        "specops_max_draft_len": "8",
        "specops_deployment": "llama-70b-chat",
        "specops_variant": "stable",
        "specops_draft_version": "v3",
    }.items():
        assert f'key: "{key}"\n  value {{\n    string_value: "{value}"' in bls


def test_speculation_mode_off_starts_the_bls_with_no_drafting() -> None:
    data = body()
    data["spec"]["speculation"]["mode"] = "off"
    bls = one(render_children(resource(data), OPTIONS), "ConfigMap")["data"]["tensorrt_llm_bls.config.pbtxt"]
    assert 'key: "specops_default_num_draft_tokens"\n  value {\n    string_value: "0"' in bls


def test_repository_change_rolls_the_pods() -> None:
    def config_hash(draft: DraftSpec | None) -> str:
        deployment = one(render_children(resource(), OPTIONS, draft=draft), "Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["specops.dev/config-hash"])

    assert config_hash(None) == config_hash(None)
    assert config_hash(None) != config_hash(new_draft())


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
    deployment = one(stable, "Deployment")
    assert deployment["spec"]["selector"]["matchLabels"] == render.selector_labels("llama-70b-chat", "stable")


def test_canary_render_differs_only_in_names_labels_and_draft() -> None:
    stable = render_children(resource(), OPTIONS)
    canary = render_children(
        resource(),
        OPTIONS,
        variant="canary",
        draft=new_draft("v4", "pvc://engines/llama-70b-draft/v4"),
        replicas=2,
    )
    # the canary brings no second user-facing Service and no second PodMonitor
    assert [(o["kind"], o["metadata"]["name"]) for o in canary] == [
        ("ConfigMap", "llama-70b-chat-canary-model-repository"),
        ("Deployment", "llama-70b-chat-canary"),
        ("Service", "llama-70b-chat-canary"),
    ]
    renames = {
        "llama-70b-chat-model-repository": "llama-70b-chat-canary-model-repository",
        "llama-70b-chat-stable": "llama-70b-chat-canary",
        "stable": "canary",
        "v3": "v4",
        "llama-70b-draft/v3": "llama-70b-draft/v4",
        # the draft identity label: version and a hash of version and engine
        drafts.draft_identity(resource().spec.draft): drafts.draft_identity(
            new_draft("v4", "pvc://engines/llama-70b-draft/v4")
        ),
    }

    def renamed(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: renamed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [renamed(v) for v in value]
        if isinstance(value, str) and "\n" in value:  # config.pbtxt: BLS parameters name variant and draft
            return value.replace('"stable"', '"canary"').replace('"v3"', '"v4"')
        if isinstance(value, str):
            return renames.get(value, value)
        return value

    expected = renamed(stable[:3])
    expected[1]["metadata"]["name"] = "llama-70b-chat-canary"
    expected[1]["spec"]["template"]["metadata"]["annotations"]["specops.dev/config-hash"] = canary[1]["spec"][
        "template"
    ]["metadata"]["annotations"]["specops.dev/config-hash"]
    assert canary == expected


def test_pod_monitor_scrapes_metrics_with_the_labels_the_queries_group_by() -> None:
    objects = render_children(resource(), OPTIONS)
    monitor = one(objects, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["interval"] == "15s"
    targets = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert targets == {
        "specops_deployment": ["__meta_kubernetes_pod_label_specops_dev_deployment"],
        "variant": ["__meta_kubernetes_pod_label_specops_dev_variant"],
        "specops_draft": ["__meta_kubernetes_pod_label_specops_dev_draft"],
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
    options = RenderOptions(bls_source="", pod_monitor=False)
    assert by_kind(render_children(resource(), options), "PodMonitor") == []


# ---------------------------------------------------------------- images, names, errors


def test_missing_image_everywhere_is_a_render_error_on_the_image_field() -> None:
    data = body()
    del data["spec"]["serving"]["image"]
    with pytest.raises(RenderError) as raised:
        render_children(resource(data), OPTIONS)
    assert raised.value.field == "spec.serving.image"
    # the operator's default image fills the gap
    options = RenderOptions(bls_source="", default_image="registry.example.com/triton:default")
    assert (
        serving_container(render_children(resource(data), options))["image"]
        == "registry.example.com/triton:default"
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
