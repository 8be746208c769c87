"""Foundation, end to end: the real operator against the (emulated) API server.

Given/when/then: a user applies, changes and deletes SpeculativeDeployments; the
operator creates the serving objects, reports status and Events, refuses nothing
it should accept, and rewrites nothing after a restart.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from specops.adapters.kube import KubeApiError, KubeClient
from specops.api.models import API_VERSION, KIND
from specops_local.serving import ServingController
from tests.e2e.conftest import NAMESPACE, Operator, example
from tests.e2e.waiting import condition, events_for, eventually, resource, wait_condition

pytestmark = pytest.mark.e2e


async def children(kube: KubeClient, name: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for api_version, kind in (("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "ConfigMap")):
        for obj in await kube.list(api_version, kind, NAMESPACE, {"specops.dev/deployment": name}):
            found[f"{kind}/{obj['metadata']['name']}"] = obj
    return found


async def make_serving_ready(cluster: Any, name: str, replicas: int) -> None:
    """Play the Deployment controller: report the serving pods ready."""
    cluster.patch_status(
        "deployments",
        name,
        {
            "observedGeneration": cluster.get("deployments", name)["metadata"]["generation"],
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
        },
    )


@pytest.mark.emulated_only
async def test_apply_creates_owned_children_status_and_events(
    cluster: Any, kube: KubeClient, operator: Operator
) -> None:
    # Given the operator runs; when a user applies the dense example
    created = await kube.create(example())
    uid = created["metadata"]["uid"]

    # Then the serving objects appear, owned by the resource and labelled for selection
    found = await eventually(lambda: children(kube, "llama-70b-chat"), what="children")
    found = await eventually(
        lambda: _when(children(kube, "llama-70b-chat"), lambda c: len(c) >= 4), what="all children"
    )
    assert {
        "Deployment/llama-70b-chat",
        "Service/llama-70b-chat",
        "ConfigMap/llama-70b-chat-engine-config",
    } <= set(found)
    for obj in found.values():
        owner = obj["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            KIND,
            "llama-70b-chat",
            uid,
            True,
        )
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "specops"
        assert not any(key.startswith("kopf.") for key in obj["metadata"].get("annotations", {}))

    # And status says Progressing while no pod is ready
    body = await wait_condition(kube, "llama-70b-chat", "Progressing", "True")
    assert body["status"]["phase"] == "Pending"
    assert body["status"]["observedGeneration"] == body["metadata"]["generation"]
    assert condition(body, "Ready")["status"] == "False"

    # When the pods become ready, then Ready=True with reason Serving and the control loop's first phase
    await make_serving_ready(cluster, "llama-70b-chat", 2)
    body = await wait_condition(kube, "llama-70b-chat", "Ready", "True", "Serving")
    assert body["status"]["phase"] == "Baseline"
    assert condition(body, "Progressing")["status"] == "False"

    # And Events with specific reasons were posted
    reasons = {
        e["reason"] for e in await eventually(lambda: events_for(kube, "llama-70b-chat"), what="events")
    }
    assert "ChildCreated" in reasons


async def _when(awaitable: Any, predicate: Any) -> Any:
    value = await awaitable
    return value if predicate(value) else None


@pytest.mark.emulated_only
async def test_spec_change_patches_children_and_observed_generation_follows(
    cluster: Any, kube: KubeClient, operator: Operator
) -> None:
    # Given a reconciled resource
    await kube.create(example())
    await wait_condition(kube, "llama-70b-chat", "Progressing", "True")
    before = (await children(kube, "llama-70b-chat"))["Deployment/llama-70b-chat"]

    # When the user scales it and changes the image
    await kube.patch(
        API_VERSION,
        KIND,
        NAMESPACE,
        "llama-70b-chat",
        {"spec": {"serving": {"replicas": 3, "image": "registry.example.com/triton:2"}}},
    )

    # Then the Deployment is patched in place and status follows the new generation
    async def patched() -> dict[str, Any] | None:
        deployment = (await children(kube, "llama-70b-chat"))["Deployment/llama-70b-chat"]
        return deployment if deployment["spec"]["replicas"] == 3 else None

    after = await eventually(patched, what="deployment scaled")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example.com/triton:2"

    async def observed() -> bool:
        body = await resource(kube, "llama-70b-chat")
        return bool(body and body["status"].get("observedGeneration") == body["metadata"]["generation"] == 2)

    await eventually(observed, what="observedGeneration 2")


INVALID_CASES = [
    (
        "draft length initial above max",
        {"speculation": {"draftLength": {"initial": 9, "min": 1, "max": 8}}},
        "spec.speculation.draftLength",
    ),
    (
        "draft length max above the engines'",
        {"speculation": {"draftLength": {"initial": 4, "min": 1, "max": 20}}},
        "spec.speculation.draftLength.max",
    ),
    ("unknown speculation mode", {"speculation": {"mode": "sometimes"}}, "spec.speculation.mode"),
    ("unknown backend", {"serving": {"backend": "tgi"}}, "spec.serving.backend"),
    ("zero GPUs", {"serving": {"gpu": {"type": "H100", "count": 0}}}, "spec.serving.gpu.count"),
    (
        "tensor parallel not dividing GPUs",
        {"serving": {"gpu": {"type": "H100", "count": 4}, "tensorParallel": 3}},
        "spec.serving.tensorParallel",
    ),
    (
        "canary weights not increasing",
        {"canary": {"steps": [{"weight": 50}, {"weight": 10}]}},
        "spec.canary.steps",
    ),
    ("canary weight above 100", {"canary": {"steps": [{"weight": 150}]}}, "spec.canary.steps[0].weight"),
    ("acceptance above 1", {"slo": {"minAcceptance": 1.5}}, "spec.slo.minAcceptance"),
    ("bad duration", {"metrics": {"interval": "soon"}}, "spec.metrics.interval"),
    ("bad parameter count", {"target": {"parameters": "seventy"}}, "spec.target.parameters"),
    (
        "s3 checkpoint without fetcher image",
        {"draft": {"uri": "s3://bucket/draft"}},
        "spec.serving.checkpointFetcherImage",
    ),
    (
        "hub checkpoint without its revision",
        {"target": {"uri": "hf://meta-llama/Llama-3.1-70B-Instruct"}},
        "spec.target.uri",
    ),
    ("mtp with a draft checkpoint", {"draft": {"method": "mtp"}}, "spec.draft.uri"),
    ("draft as large as the target", {"draft": {"parameters": "70B"}}, "spec.draft.parameters"),
    ("unknown draft method", {"draft": {"method": "medusa"}}, "spec.draft.method"),
]


@pytest.mark.parametrize(("case", "change", "field"), INVALID_CASES, ids=[c[0] for c in INVALID_CASES])
async def test_invalid_resources_are_refused_naming_the_field(
    cluster: Any, kube: KubeClient, case: str, change: dict[str, Any], field: str
) -> None:
    body = example()
    for block, value in change.items():
        body["spec"][block] = (
            {**body["spec"].get(block, {}), **value}
            if block != "target"
            else {**body["spec"]["target"], **value}
        )
    if "draft" in change:
        body["spec"]["draft"] = {**example()["spec"]["draft"], **change["draft"]}
    with pytest.raises(KubeApiError) as refused:
        await kube.create(body)
    assert refused.value.status == 422, refused.value
    assert field in refused.value.message, refused.value.message


async def test_immutable_fields_refuse_changes(cluster: Any, kube: KubeClient) -> None:
    await kube.create(example())
    with pytest.raises(KubeApiError) as refused:
        await kube.patch(
            API_VERSION, KIND, NAMESPACE, "llama-70b-chat", {"spec": {"target": {"model": "other"}}}
        )
    assert refused.value.status == 422 and "spec.target.model" in refused.value.message


@pytest.mark.emulated_only
async def test_what_slips_past_the_schema_gets_invalid_spec_not_a_crash(
    cluster: Any, kube: KubeClient, operator: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an older CRD without validation (admission off), when a bad resource is applied
    resource_key = cluster.resource("speculativedeployments")
    monkeypatch.delitem(cluster.emulator.admission, resource_key)
    bad = example(speculation={"draftLength": {"initial": 9, "min": 1, "max": 8}})
    await kube.create(bad)

    # Then it is parked with Ready=False/InvalidSpec naming the field, a Warning Event, and no children
    body = await wait_condition(kube, "llama-70b-chat", "Ready", "False", "InvalidSpec")
    assert "spec.speculation.draftLength" in condition(body, "Ready")["message"]
    assert body["status"]["phase"] == "Invalid"
    assert await children(kube, "llama-70b-chat") == {}
    warnings = await eventually(lambda: events_for(kube, "llama-70b-chat"), what="InvalidSpec event")
    assert any(e["reason"] == "InvalidSpec" and e["type"] == "Warning" for e in warnings)

    # And no hot retry loop: the status is not rewritten while nothing changes (read once Kopf
    # has recorded the parked handler's retry in its annotations, right after the status write)
    await eventually(lambda: _settled(kube), what="resource settled")
    version = (await resource(kube, "llama-70b-chat"))["metadata"]["resourceVersion"]
    await operator.restart()
    assert (await resource(kube, "llama-70b-chat"))["metadata"]["resourceVersion"] == version


@pytest.mark.emulated_only
async def test_delete_removes_children_and_releases_the_resource(
    cluster: Any, kube: KubeClient, operator: Operator
) -> None:
    await kube.create(example())
    await eventually(lambda: _when(children(kube, "llama-70b-chat"), lambda c: len(c) >= 4), what="children")

    await kube.delete(API_VERSION, KIND, NAMESPACE, "llama-70b-chat")

    async def gone() -> bool:
        return await resource(kube, "llama-70b-chat") is None and await children(kube, "llama-70b-chat") == {}

    await eventually(gone, what="resource and children gone")


@pytest.mark.emulated_only
async def test_restart_rewrites_nothing(
    cluster: Any, kube: KubeClient, operator: Operator, serving: ServingController
) -> None:
    # Given a reconciled resource whose plain pods serve (speculation off), the control loop
    # holding its revision (no metrics at this Prometheus)
    await kube.create(example(speculation={"mode": "off"}))
    await eventually(lambda: _when(children(kube, "llama-70b-chat"), lambda c: len(c) >= 4), what="children")
    await wait_condition(kube, "llama-70b-chat", "Ready", "True")
    await eventually(lambda: _settled(kube), what="status settled")
    before = {
        key: obj["metadata"]["resourceVersion"]
        for key, obj in (await children(kube, "llama-70b-chat")).items()
    }
    body_before = copy.deepcopy(await resource(kube, "llama-70b-chat"))

    # When the operator restarts and resumes the resource
    await operator.restart()
    await eventually(lambda: _settled(kube), what="status settled after restart")

    # Then no child was rewritten, and spec and lifecycle status are unchanged
    after = {
        key: obj["metadata"]["resourceVersion"]
        for key, obj in (await children(kube, "llama-70b-chat")).items()
    }
    assert after == before
    body_after = await resource(kube, "llama-70b-chat")
    assert body_after["spec"] == body_before["spec"]
    assert body_after["status"]["conditions"] == body_before["status"]["conditions"]


async def _settled(kube: KubeClient) -> bool:
    """True once two reads a short while apart see the same resourceVersion."""
    import asyncio

    first = (await resource(kube, "llama-70b-chat"))["metadata"]["resourceVersion"]
    await asyncio.sleep(1.5)
    return first == (await resource(kube, "llama-70b-chat"))["metadata"]["resourceVersion"]
