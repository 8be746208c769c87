"""A revision rendered as a pod: valid Kubernetes, restricted, probing the engine's own endpoints,
with the config files mounted exactly where the engine's arguments point."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import latest_version

from specops.domain.engine_pod import CONFIG_VOLUME, PodInputs, config_key, engine_pod, revision_labels
from specops.domain.engines import engine_for
from specops.domain.engines.schedule import METHODS, PLAIN, Method, Revision, Schedule
from specops.domain.names import RenderError

K8S_VERSION = latest_version()
BACKENDS = ("triton", "trtllm-serve", "vllm", "sglang")
SCHEDULE = Schedule.of([[8, 4], [32, 1], [None, 0]])
INPUTS = PodInputs(
    image="engine:1",
    target_uri="pvc://models/llama-70b",
    draft_uri="pvc://models/llama-1b-v3",
    gpus=4,
    tensor_parallel=4,
    served_model_name="llama-3.1-70b-instruct",
)


def revision(method: Method) -> Revision:
    return Revision(mode="spec", method=method, draft="v3", schedule=SCHEDULE)


def deployment(pod: dict[str, Any], labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "chat", "namespace": "inference"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "chat"}},
            "template": {
                "metadata": {"labels": {"app": "chat", **labels}, "annotations": annotations},
                "spec": pod,
            },
        },
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", [*METHODS, None])
def test_every_backend_and_method_renders_a_valid_restricted_pod(backend: str, method: Method | None) -> None:
    engine = engine_for(backend, triton_model_source="# model\n")
    rev = PLAIN if method is None else revision(method)
    data, pod, annotations = engine_pod(engine, rev, INPUTS, "chat-engine-config")
    kubernetes_validate.validate(
        deployment(pod, revision_labels(engine, rev), annotations), K8S_VERSION, strict=True
    )
    (container,) = pod["containers"]
    assert (
        container["securityContext"]["runAsNonRoot"]
        and container["securityContext"]["readOnlyRootFilesystem"]
    )
    assert container["readinessProbe"]["httpGet"]["path"] == engine.ready_path
    assert {p["name"] for p in container["ports"]} >= {engine.http_port, engine.metrics_port}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    needs_draft = method in ("draftModel", "eagle3")
    assert ("draft-checkpoint" in mounts) == needs_draft
    if data:  # every file the engine's arguments name is mounted from the ConfigMap
        volume = next(v for v in pod["volumes"] if v["name"] == CONFIG_VOLUME)
        for item in volume["configMap"]["items"]:
            assert item["key"] in data and config_key(item["path"]) == item["key"]
            path = f"{mounts[CONFIG_VOLUME]}/{item['path']}"
            assert backend == "triton" or path in container["args"]
    assert annotations["specops.dev/schedule"] == rev.describe()


def test_object_store_checkpoints_need_the_fetcher() -> None:
    engine = engine_for("vllm")
    remote = PodInputs(**{**INPUTS.__dict__, "target_uri": "hf://meta-llama/Llama-3.1-70B@abc123"})
    with pytest.raises(RenderError, match="checkpointFetcherImage"):
        engine_pod(engine, PLAIN, remote, "x")
    fetched = PodInputs(**{**remote.__dict__, "fetcher_image": "fetcher:1"})
    _, pod, _ = engine_pod(engine, PLAIN, fetched, "x")
    (init,) = pod["initContainers"]
    assert init["args"] == ["fetch-checkpoint", "hf://meta-llama/Llama-3.1-70B@abc123", "/models/target"]


def test_a_new_schedule_is_a_new_revision_label_and_config_hash() -> None:
    engine = engine_for("trtllm-serve")
    a, b = (
        revision("eagle3"),
        Revision(mode="spec", method="eagle3", draft="v3", schedule=Schedule.constant(2)),
    )
    assert (
        revision_labels(engine, a)["specops.dev/revision"]
        != revision_labels(engine, b)["specops.dev/revision"]
    )
    assert (
        engine_pod(engine, a, INPUTS, "x")[2]["specops.dev/config-hash"]
        != engine_pod(engine, b, INPUTS, "x")[2]["specops.dev/config-hash"]
    )
