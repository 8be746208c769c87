"""The emulated API server behaves like a Kubernetes API server where clients and Kopf can tell."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import httpx
import kmock
import kopf
import kubernetes
import pytest
import yaml

from specops_local import emulator
from specops_local.cluster import WIDGET_CRD, EmulatedCluster, emulated_cluster
from specops_local.kopf_runner import run_kopf

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
WIDGETS = "/apis/test.specops.dev/v1/namespaces/default/widgets"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmulatedCluster]:
    async with emulated_cluster([], tmp_path, crds=[WIDGET_CRD]) as running:
        yield running


@pytest.fixture
async def api(cluster: EmulatedCluster) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=cluster.url, timeout=5) as client:
        yield client


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "test.specops.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"model": "m", **spec},
    }


async def create_configmap(api: httpx.AsyncClient, name: str, **metadata: Any) -> dict[str, Any]:
    response = await api.post(CONFIGMAPS, json={"metadata": {"name": name, **metadata}, "data": {"k": "v"}})
    assert response.status_code == 201, response.text
    return dict(response.json())


def watch_events(text: str) -> list[tuple[str, str]]:
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [(event["type"], event["object"]["metadata"].get("name", "")) for event in events]


# --- objects and metadata ---


async def test_create_stamps_metadata_and_answers_201(api: httpx.AsyncClient) -> None:
    response = await api.post(CONFIGMAPS, json={"metadata": {"name": "a"}, "data": {"k": "v"}})

    assert response.status_code == 201
    meta = response.json()["metadata"]
    assert meta["namespace"] == "default"
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0
    assert response.json()["kind"] == "ConfigMap" and response.json()["apiVersion"] == "v1"


async def test_resource_versions_grow_across_all_objects(api: httpx.AsyncClient) -> None:
    first = await create_configmap(api, "a")
    second = await create_configmap(api, "b")
    patched = (await api.patch(f"{CONFIGMAPS}/a", json={"data": {"k": "w"}}, headers=MERGE)).json()

    versions = [int(obj["metadata"]["resourceVersion"]) for obj in (first, second, patched)]
    assert versions == sorted(versions) and len(set(versions)) == 3


async def test_duplicate_create_is_409_already_exists(api: httpx.AsyncClient) -> None:
    await create_configmap(api, "a")

    response = await api.post(CONFIGMAPS, json={"metadata": {"name": "a"}})

    assert response.status_code == 409
    assert response.json()["reason"] == "AlreadyExists"
    assert response.json()["kind"] == "Status"


SERVICES = "/api/v1/namespaces/default/services"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


@pytest.mark.parametrize(
    ("path", "name", "field"),
    [
        (SERVICES, "70b-chat-stable", "metadata.name"),  # DNS-1035: must start with a letter
        (SERVICES, "llama-3.1-70b", "metadata.name"),  # DNS-1035: no dots
        (SERVICES, "s" * 64, "metadata.name"),
        (CONFIGMAPS, "Upper-Case", "metadata.name"),
        (CONFIGMAPS, "a" * 254, "metadata.name"),
        (DEPLOYMENTS, "ends-with-dash-", "metadata.name"),
    ],
)
async def test_names_a_real_server_refuses_are_422_invalid(
    api: httpx.AsyncClient, path: str, name: str, field: str
) -> None:
    response = await api.post(path, json={"metadata": {"name": name}, "spec": {}})

    assert response.status_code == 422, response.text
    assert response.json()["reason"] == "Invalid"
    assert [cause["field"] for cause in response.json()["details"]["causes"]] == [field]


async def test_names_a_real_server_accepts_are_stored(api: httpx.AsyncClient) -> None:
    for path, name in ((SERVICES, "llama-3-1-70b"), (CONFIGMAPS, "llama-3.1-70b"), (CONFIGMAPS, "70b-chat")):
        response = await api.post(path, json={"metadata": {"name": name}})
        assert response.status_code == 201, response.text


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({"specops.dev/deployment": "d" * 64}, "metadata.labels"),
        ({"specops.dev/deployment": "has/slash"}, "metadata.labels"),
        ({"bad key!": "v"}, "metadata.labels"),
        ({"-x.example/name": "v"}, "metadata.labels"),
    ],
)
async def test_labels_a_real_server_refuses_are_422_invalid(
    api: httpx.AsyncClient, labels: dict[str, str], field: str
) -> None:
    response = await api.post(CONFIGMAPS, json={"metadata": {"name": "labelled", "labels": labels}})

    assert response.status_code == 422, response.text
    assert {cause["field"] for cause in response.json()["details"]["causes"]} == {field}


async def test_selectors_follow_the_label_rules_and_updates_are_checked_too(api: httpx.AsyncClient) -> None:
    long_value = "x" * 64
    service = await api.post(
        SERVICES, json={"metadata": {"name": "svc"}, "spec": {"selector": {"a": long_value}}}
    )
    deployment = await api.post(
        DEPLOYMENTS,
        json={"metadata": {"name": "dep"}, "spec": {"selector": {"matchLabels": {"a": long_value}}}},
    )
    await create_configmap(api, "fine")
    relabel = await api.patch(
        f"{CONFIGMAPS}/fine", json={"metadata": {"labels": {"a": long_value}}}, headers=MERGE
    )

    assert service.status_code == 422
    assert service.json()["details"]["causes"][0]["field"] == "spec.selector"
    assert deployment.status_code == 422
    assert deployment.json()["details"]["causes"][0]["field"] == "spec.selector.matchLabels"
    assert relabel.status_code == 422


async def test_missing_object_is_404_with_a_status_body(api: httpx.AsyncClient) -> None:
    response = await api.get(f"{CONFIGMAPS}/nope")

    assert response.status_code == 404
    assert response.json()["reason"] == "NotFound"
    assert response.json()["message"] == 'configmaps "nope" not found'
    assert response.json()["details"]["name"] == "nope"


async def test_generate_name_makes_a_unique_name_and_events_are_creatable(api: httpx.AsyncClient) -> None:
    event = {"metadata": {"generateName": "widget-"}, "reason": "Ready", "message": "ok", "type": "Normal"}

    names = [
        (await api.post("/api/v1/namespaces/default/events", json=event)).json()["metadata"]["name"]
        for _ in "ab"
    ]

    assert all(name.startswith("widget-") and len(name) == len("widget-") + 5 for name in names)
    assert names[0] != names[1]


@pytest.mark.parametrize(("taken_draws", "status"), [(7, 201), (8, 409)])
async def test_a_generated_name_that_is_taken_is_generated_again_before_a_conflict(
    api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, taken_draws: int, status: int
) -> None:
    # Given an event named as the generator's next draws would name another (kube-apiserver since
    # 1.32 generates again up to 8 names in all: with 27^5 suffixes, thousands of Events in an hour
    # would otherwise collide now and then, and Kopf drops an Event that gets a 409)
    event = {"metadata": {"generateName": "widget-"}, "reason": "Ready", "message": "ok", "type": "Normal"}
    await api.post("/api/v1/namespaces/default/events", json={**event, "metadata": {"name": "widget-bbbbb"}})
    draws = iter(["bbbbb"] * taken_draws + ["ccccc"])
    monkeypatch.setattr(emulator.random, "choices", lambda alphabet, k: list(next(draws)))

    # When one more is created by generateName
    response = await api.post("/api/v1/namespaces/default/events", json=event)

    # Then a taken name is drawn again, up to 8 draws; only then the create conflicts
    assert response.status_code == status, response.text
    if status == 201:
        assert response.json()["metadata"]["name"] == "widget-ccccc"
    else:
        assert response.json()["reason"] == "AlreadyExists"


async def test_generation_moves_only_with_spec_changes(api: httpx.AsyncClient) -> None:
    await api.post(WIDGETS, json=widget("w"))

    labelled = await api.patch(f"{WIDGETS}/w", json={"metadata": {"labels": {"a": "b"}}}, headers=MERGE)
    status = await api.patch(f"{WIDGETS}/w/status", json={"status": {"phase": "Ready"}}, headers=MERGE)
    spec = await api.patch(f"{WIDGETS}/w", json={"spec": {"replicas": 2}}, headers=MERGE)

    assert labelled.json()["metadata"]["generation"] == 1
    assert status.json()["metadata"]["generation"] == 1
    assert spec.json()["metadata"]["generation"] == 2


async def test_a_no_op_patch_keeps_the_resource_version(api: httpx.AsyncClient) -> None:
    created = await create_configmap(api, "a")

    response = await api.patch(f"{CONFIGMAPS}/a", json={"data": {"k": "v"}}, headers=MERGE)

    assert response.json()["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


# --- patches and concurrency ---


async def test_merge_patch_deletes_nulls_and_replaces_lists(api: httpx.AsyncClient) -> None:
    await api.post(WIDGETS, json=widget("w", ports=[{"name": "a"}, {"name": "b"}], extra={"x": 1, "y": 2}))

    response = await api.patch(
        f"{WIDGETS}/w", json={"spec": {"ports": [{"name": "c"}], "extra": {"x": None}}}, headers=MERGE
    )

    assert response.json()["spec"]["ports"] == [{"name": "c", "port": 80}]
    assert response.json()["spec"]["extra"] == {"y": 2}


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [  # RFC 7386's appendix A, and an object merged onto a scalar
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
        ({"a": 1}, {"a": {"b": {"c": 2, "d": None}}}, {"a": {"b": {"c": 2}}}),
    ],
)
def test_merge_patch_follows_rfc_7386_and_shares_nothing_with_its_arguments(
    target: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]
) -> None:
    target_before, patch_before = json.loads(json.dumps(target)), json.loads(json.dumps(patch))

    merged = emulator.merge_patch(target, patch)

    assert merged == expected
    assert target == target_before and patch == patch_before
    for value in merged.values():  # a change to the result reaches neither argument
        if isinstance(value, dict):
            value["added"] = 1
        elif isinstance(value, list):
            value.append("added")
    assert target == target_before and patch == patch_before


async def test_nan_and_infinity_are_not_json_and_are_refused(api: httpx.AsyncClient) -> None:
    await create_configmap(api, "a")

    for constant in ("NaN", "Infinity", "-Infinity"):
        response = await api.patch(
            f"{CONFIGMAPS}/a", content=f'{{"metadata": {{"labels": {{"x": {constant}}}}}}}', headers=MERGE
        )

        assert response.status_code == 400, constant
    assert "labels" not in (await api.get(f"{CONFIGMAPS}/a")).json()["metadata"]


async def test_strategic_merge_patch_is_treated_as_a_merge_patch(api: httpx.AsyncClient) -> None:
    await create_configmap(api, "a")

    response = await api.patch(
        f"{CONFIGMAPS}/a",
        json={"data": {"k": None, "n": "1"}, "$retainKeys": ["data"]},
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )

    assert response.status_code == 200
    assert response.json()["data"] == {"n": "1"}


async def test_json_patch_applies_operations_in_order(api: httpx.AsyncClient) -> None:
    created = await create_configmap(api, "a", finalizers=["x"])
    version = created["metadata"]["resourceVersion"]
    operations = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "y"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
        {"op": "replace", "path": "/data/k", "value": "w"},
    ]

    response = await api.patch(f"{CONFIGMAPS}/a", json=operations, headers=JSON_PATCH)

    assert response.status_code == 200
    assert response.json()["metadata"]["finalizers"] == ["y"]
    assert response.json()["data"] == {"k": "w"}


async def test_a_failed_json_patch_test_is_422_and_changes_nothing(api: httpx.AsyncClient) -> None:
    await create_configmap(api, "a")
    stale = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
        {"op": "remove", "path": "/data"},
    ]

    response = await api.patch(f"{CONFIGMAPS}/a", json=stale, headers=JSON_PATCH)

    assert response.status_code == 422
    assert (await api.get(f"{CONFIGMAPS}/a")).json()["data"] == {"k": "v"}


async def test_a_stale_resource_version_is_409_conflict(api: httpx.AsyncClient) -> None:
    created = await create_configmap(api, "a")
    await api.patch(f"{CONFIGMAPS}/a", json={"data": {"k": "newer"}}, headers=MERGE)
    stale_version = created["metadata"]["resourceVersion"]

    patched = await api.patch(
        f"{CONFIGMAPS}/a",
        json={"metadata": {"resourceVersion": stale_version}, "data": {"k": "x"}},
        headers=MERGE,
    )
    replaced = await api.put(f"{CONFIGMAPS}/a", json={**created, "data": {"k": "x"}})

    assert (patched.status_code, patched.json()["reason"]) == (409, "Conflict")
    assert (replaced.status_code, replaced.json()["reason"]) == (409, "Conflict")


async def test_put_replaces_the_object(api: httpx.AsyncClient) -> None:
    created = await create_configmap(api, "a")

    response = await api.put(f"{CONFIGMAPS}/a", json={"metadata": {"name": "a"}, "data": {"only": "this"}})

    assert response.status_code == 200
    assert response.json()["data"] == {"only": "this"}
    assert response.json()["metadata"]["uid"] == created["metadata"]["uid"]


async def test_apply_patch_creates_a_missing_object(api: httpx.AsyncClient) -> None:
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\ndata:\n  k: v\n"

    created = await api.patch(
        f"{CONFIGMAPS}/applied", content=manifest, headers={"Content-Type": "application/apply-patch+yaml"}
    )

    assert created.status_code == 201
    assert (await api.get(f"{CONFIGMAPS}/applied")).json()["data"] == {"k": "v"}


async def test_protobuf_bodies_are_refused_with_415(api: httpx.AsyncClient) -> None:
    response = await api.post(
        CONFIGMAPS, content=b"k8s\x00\x0a", headers={"Content-Type": "application/vnd.kubernetes.protobuf"}
    )

    assert response.status_code == 415
    assert (await api.get(CONFIGMAPS)).json()["items"] == []


# --- status subresource ---


async def test_main_endpoint_ignores_status_and_status_endpoint_changes_only_status(
    api: httpx.AsyncClient,
) -> None:
    created = await api.post(WIDGETS, json={**widget("w"), "status": {"phase": "Forged"}})
    await api.patch(f"{WIDGETS}/w", json={"status": {"phase": "Forged"}}, headers=MERGE)

    status_write = await api.patch(
        f"{WIDGETS}/w/status", json={"spec": {"replicas": 7}, "status": {"phase": "Ready"}}, headers=MERGE
    )

    assert "status" not in created.json()
    assert status_write.json()["status"] == {"phase": "Ready"}
    assert status_write.json()["spec"]["replicas"] == 1


# --- deletion, finalizers, garbage collection ---


async def test_finalizers_hold_deletion_until_removed(api: httpx.AsyncClient) -> None:
    await create_configmap(api, "a", finalizers=["example.com/hold"])

    deleting = await api.delete(f"{CONFIGMAPS}/a")
    still_there = await api.get(f"{CONFIGMAPS}/a")
    await api.patch(f"{CONFIGMAPS}/a", json={"metadata": {"finalizers": None}}, headers=MERGE)
    gone = await api.get(f"{CONFIGMAPS}/a")

    assert deleting.status_code == 200 and deleting.json()["metadata"]["deletionTimestamp"]
    assert still_there.status_code == 200
    assert gone.status_code == 404


async def test_deleting_an_owner_deletes_its_dependents_recursively(
    api: httpx.AsyncClient, cluster: EmulatedCluster
) -> None:
    owner = (await api.post(WIDGETS, json=widget("owner"))).json()
    other = (await api.post(WIDGETS, json=widget("other"))).json()

    def ref(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        return {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
        }

    child = await create_configmap(api, "child", ownerReferences=[ref(owner)])
    await create_configmap(api, "grandchild", ownerReferences=[ref(child)])
    await create_configmap(api, "shared", ownerReferences=[ref(owner), ref(other)])

    await api.delete(f"{WIDGETS}/owner")

    assert [obj["metadata"]["name"] for obj in cluster.objects("configmaps", "default")] == ["shared"]


async def test_deleting_a_namespace_deletes_its_objects(
    api: httpx.AsyncClient, cluster: EmulatedCluster
) -> None:
    await api.post("/api/v1/namespaces", json={"metadata": {"name": "team"}})
    await api.post("/api/v1/namespaces/team/configmaps", json={"metadata": {"name": "a"}})

    response = await api.delete("/api/v1/namespaces/team")

    assert response.status_code == 200
    assert cluster.objects("configmaps", "team") == []


# --- the cluster as clients see it ---


async def test_crd_files_and_the_kubeconfig_serve_a_kubernetes_client(tmp_path: Path) -> None:
    crd_path = tmp_path / "crds.yaml"
    crd_path.write_text(yaml.safe_dump_all([{"kind": "Namespace"}, WIDGET_CRD]))

    def list_widget_names(kubeconfig: Path) -> list[str]:
        client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        with client:
            objects = kubernetes.client.CustomObjectsApi(client)
            listed = objects.list_namespaced_custom_object("test.specops.dev", "v1", "default", "widgets")
        return [item["metadata"]["name"] for item in listed["items"]]

    async with emulated_cluster([crd_path], tmp_path) as running:
        running.create("widgets", widget("from-file"))
        names = await asyncio.to_thread(list_widget_names, running.kubeconfig_path)

    assert names == ["from-file"]


# --- lists, selectors, watches ---


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("tier=web", ["a"]),
        ("tier==web", ["a"]),
        ("tier!=web", ["b", "c"]),
        ("tier in (web,db)", ["a", "b"]),
        ("tier notin (web)", ["b", "c"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c"]),
        ("tier in (web, db),team=x", ["b"]),
    ],
)
async def test_label_selectors(api: httpx.AsyncClient, selector: str, expected: list[str]) -> None:
    await create_configmap(api, "a", labels={"tier": "web"})
    await create_configmap(api, "b", labels={"tier": "db", "team": "x"})
    await create_configmap(api, "c")

    response = await api.get(CONFIGMAPS, params={"labelSelector": selector})

    assert [item["metadata"]["name"] for item in response.json()["items"]] == expected


async def test_field_selector_on_name_and_list_envelope(api: httpx.AsyncClient) -> None:
    await create_configmap(api, "a")
    await create_configmap(api, "b")

    response = await api.get(CONFIGMAPS, params={"fieldSelector": "metadata.name=b"})

    body = response.json()
    assert [item["metadata"]["name"] for item in body["items"]] == ["b"]
    assert (body["kind"], body["apiVersion"]) == ("ConfigMapList", "v1")
    assert int(body["metadata"]["resourceVersion"]) >= int(body["items"][0]["metadata"]["resourceVersion"])


async def test_watch_resumes_after_a_resource_version_and_honours_the_timeout(api: httpx.AsyncClient) -> None:
    await create_configmap(api, "before")
    listed = (await api.get(CONFIGMAPS)).json()["metadata"]["resourceVersion"]
    await create_configmap(api, "after")
    await api.delete(f"{CONFIGMAPS}/before")

    response = await api.get(
        CONFIGMAPS, params={"watch": "true", "resourceVersion": listed, "timeoutSeconds": "0.3"}
    )

    assert response.headers["Content-Type"].startswith("application/json")
    assert watch_events(response.text) == [("ADDED", "after"), ("DELETED", "before")]
    assert all(
        json.loads(line)["object"]["metadata"]["namespace"] == "default"
        for line in response.text.splitlines()
    )


async def test_watch_streams_live_changes_matching_the_selector(api: httpx.AsyncClient) -> None:
    params = {"watch": "true", "labelSelector": "tier=web", "timeoutSeconds": "5"}
    async with api.stream("GET", CONFIGMAPS, params=params) as stream:
        lines = stream.aiter_lines()
        await create_configmap(api, "ignored")
        await create_configmap(api, "web", labels={"tier": "web"})
        await api.patch(f"{CONFIGMAPS}/web", json={"metadata": {"labels": {"tier": "db"}}}, headers=MERGE)
        received = [json.loads(await anext(lines)) for _ in range(2)]

    assert [(event["type"], event["object"]["metadata"]["name"]) for event in received] == [
        ("ADDED", "web"),
        ("DELETED", "web"),
    ]


async def test_a_watch_whose_connection_is_gone_ends_without_an_error(
    api: httpx.AsyncClient,
    cluster: EmulatedCluster,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a watch whose connection goes away after its first event (the client stopped, or the
    # server is closing its connections while the stream writes)
    write = aiohttp.web.StreamResponse.write
    writes = collections.Counter[int]()

    async def write_until_gone(self: aiohttp.web.StreamResponse, data: bytes) -> None:
        writes[id(self)] += 1
        if writes[id(self)] > 1:
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        await write(self, data)

    monkeypatch.setattr(aiohttp.web.StreamResponse, "write", write_until_gone)
    with caplog.at_level(logging.ERROR):
        async with api.stream("GET", CONFIGMAPS, params={"watch": "true", "timeoutSeconds": "2"}) as stream:
            lines = stream.aiter_lines()
            await create_configmap(api, "first")
            assert json.loads(await anext(lines))["object"]["metadata"]["name"] == "first"
            # When the next event has to be written
            await create_configmap(api, "second")
            await cluster.wait_for(lambda: sum(cluster.emulator._watchers.values()) == 0, timeout_s=2)

    # Then the watch ended, and the server logged no error for it
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_watch_from_a_compacted_resource_version_is_410_gone(
    api: httpx.AsyncClient, cluster: EmulatedCluster
) -> None:
    first = await create_configmap(api, "a")
    await create_configmap(api, "b")
    cluster.emulator.compact()

    response = await api.get(
        CONFIGMAPS, params={"watch": "true", "resourceVersion": first["metadata"]["resourceVersion"]}
    )

    event = json.loads(response.text.splitlines()[0])
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


async def test_cut_watches_ends_open_streams_and_a_resumed_watch_gets_what_it_missed(
    api: httpx.AsyncClient, cluster: EmulatedCluster
) -> None:
    # Given a client watching configmaps (a long timeout: only the cut can end the stream soon)
    first = await create_configmap(api, "a")
    params = {
        "watch": "true",
        "resourceVersion": first["metadata"]["resourceVersion"],
        "timeoutSeconds": "30",
    }
    async with api.stream("GET", CONFIGMAPS, params=params) as stream:
        await cluster.wait_for(lambda: cluster.emulator.watchers(cluster.resource("configmaps")) > 0)

        # When every watch is cut, then the stream ends while the server keeps serving
        cluster.emulator.cut_watches()

        async def rest() -> list[str]:
            return [line async for line in stream.aiter_lines()]

        assert await asyncio.wait_for(rest(), 5.0) == []  # ended by the cut, 25 s before its timeout
    await create_configmap(api, "b")
    resumed = await api.get(CONFIGMAPS, params={**params, "timeoutSeconds": "0.2"})
    assert watch_events(resumed.text) == [("ADDED", "b")]


async def test_watch_with_initial_events_ends_them_with_a_bookmark(api: httpx.AsyncClient) -> None:
    await create_configmap(api, "a")
    params = {
        "watch": "true",
        "sendInitialEvents": "true",
        "allowWatchBookmarks": "true",
        "resourceVersionMatch": "NotOlderThan",
        "timeoutSeconds": "0.2",
    }

    response = await api.get(CONFIGMAPS, params=params)

    events = [json.loads(line) for line in response.text.splitlines()]
    assert [event["type"] for event in events] == ["ADDED", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


# --- discovery ---


async def test_core_discovery_reports_group_version_v1(api: httpx.AsyncClient) -> None:
    versions = (await api.get("/api")).json()
    core = (await api.get("/api/v1")).json()

    assert versions["versions"] == ["v1"]
    assert core["groupVersion"] == "v1"
    pods = next(entry for entry in core["resources"] if entry["name"] == "pods")
    assert (pods["kind"], pods["namespaced"]) == ("Pod", True)


async def test_namespace_paths_are_served(api: httpx.AsyncClient) -> None:
    listed = await api.get("/api/v1/namespaces")
    default = await api.get("/api/v1/namespaces/default")

    assert [item["metadata"]["name"] for item in listed.json()["items"]] == ["default"]
    assert default.json()["kind"] == "Namespace"


async def test_custom_resource_discovery_lists_verbs_and_the_status_subresource(
    api: httpx.AsyncClient,
) -> None:
    groups = (await api.get("/apis")).json()
    resources = (await api.get("/apis/test.specops.dev/v1")).json()["resources"]

    assert "test.specops.dev" in [group["name"] for group in groups["groups"]]
    by_name = {entry["name"]: entry for entry in resources}
    assert by_name["widgets"]["kind"] == "Widget"
    assert by_name["widgets"]["shortNames"] == ["wdg"]
    assert {"list", "watch", "patch", "get", "create", "update", "delete"} <= set(by_name["widgets"]["verbs"])
    assert by_name["widgets/status"]["verbs"] == ["get", "patch", "update"]


async def test_an_unknown_resource_is_404(api: httpx.AsyncClient) -> None:
    response = await api.get("/apis/nothing.example.com/v1/things")

    assert response.status_code == 404


# --- kmock reactions ---


async def test_test_reactions_override_the_server_and_see_each_request_once(
    api: httpx.AsyncClient, cluster: EmulatedCluster
) -> None:
    seen: list[kmock.Request] = []
    cluster.emulator[lambda request: bool(seen.append(request))] << 500  # records, never matches
    cluster.emulator[kmock.method.DELETE, kmock.resource("v1/configmaps")] << 503

    for index in range(20):
        await create_configmap(api, f"cm{index}")
    refused = await api.delete(f"{CONFIGMAPS}/cm0")

    assert refused.status_code == 503
    assert len(seen) == 21  # one look per request, not a rescan of all earlier requests
    assert len(cluster.objects("configmaps", "default")) == 20


# --- Kopf on top of the emulator ---


def widget_operator(url: str, calls: collections.Counter[str]) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(
            server=url, insecure=True, scheme="Bearer", token="dummy", default_namespace="default"
        )

    @kopf.on.create("test.specops.dev", "v1", "widgets", registry=registry)
    def created(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        calls[f"create/{body['metadata']['name']}"] += 1
        patch.status["phase"] = "Ready"
        kopf.info(body, reason="WidgetReady", message="the widget is ready")

    @kopf.on.update("test.specops.dev", "v1", "widgets", registry=registry)
    def updated(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        calls[f"update/{body['metadata']['name']}"] += 1
        patch.status["replicas"] = body["spec"]["replicas"]

    @kopf.on.delete("test.specops.dev", "v1", "widgets", registry=registry)
    def deleted(body: kopf.Body, **_: Any) -> None:
        calls[f"delete/{body['metadata']['name']}"] += 1

    return registry


@pytest.mark.timeout(30)
async def test_kopf_handles_each_change_once_and_survives_a_restart(
    api: httpx.AsyncClient, cluster: EmulatedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kopf")
    calls: collections.Counter[str] = collections.Counter()

    async with run_kopf(widget_operator(cluster.url, calls), namespaces=["default"]):
        await api.post(WIDGETS, json=widget("w"))
        ready = await cluster.wait_for(
            lambda: (cluster.get("widgets", "w") or {}).get("status", {}).get("phase")
        )
        await api.patch(f"{WIDGETS}/w", json={"spec": {"replicas": 3}}, headers=MERGE)
        await cluster.wait_for(
            lambda: (cluster.get("widgets", "w") or {}).get("status", {}).get("replicas") == 3
        )

    async with run_kopf(widget_operator(cluster.url, calls), namespaces=["default"]):
        await api.patch(f"{WIDGETS}/w", json={"spec": {"replicas": 4}}, headers=MERGE)
        await cluster.wait_for(
            lambda: (cluster.get("widgets", "w") or {}).get("status", {}).get("replicas") == 4
        )
        await api.delete(f"{WIDGETS}/w")
        await cluster.wait_for(lambda: cluster.get("widgets", "w") is None)

    assert ready == "Ready"
    assert calls == {"create/w": 1, "update/w": 2, "delete/w": 1}
    events = cluster.objects("events", "default")
    assert [(event["reason"], event["involvedObject"]["name"]) for event in events] == [("WidgetReady", "w")]
    problems = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert problems == []


async def test_kopf_exit_leaves_the_tests_own_tasks_running(cluster: EmulatedCluster) -> None:
    bystander = asyncio.create_task(asyncio.sleep(30))
    calls: collections.Counter[str] = collections.Counter()

    async with run_kopf(widget_operator(cluster.url, calls)):  # clusterwide
        started_inside = asyncio.create_task(asyncio.sleep(30))
        await cluster.wait_for_watch("widgets")

    assert not bystander.done() and not started_inside.done()
    bystander.cancel()
    started_inside.cancel()
