"""Kopf's last-handled configuration is the same whether Kopf builds it or we do."""

from __future__ import annotations

import copy
import json
from typing import Any

import kopf
import pytest

from specops.handlers.essence import FastCopyProgressStorage, StatuslessDiffBaseStorage


def _resource() -> dict[str, Any]:
    return {
        "apiVersion": "specops.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {
            "name": "llama-70b-chat",
            "namespace": "default",
            "uid": "0b6c",
            "resourceVersion": "4711",
            "generation": 3,
            "labels": {"team": "serving"},
            "annotations": {
                "specops.dev/last-handled-configuration": json.dumps({"spec": {"replicas": 1}}),
                "specops.dev/reconcile": '{"started": "2026-12-06T00:00:00Z"}',
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                "owner/note": "kept",
            },
            "finalizers": ["specops.dev/finalizer"],
            "managedFields": [{"manager": "kopf", "fieldsV1": {"f:status": {"f:speculation": {}}}}],
        },
        "spec": {"target": {"model": "llama", "parameters": "70B"}, "serving": {"replicas": 2}},
        "status": {"speculation": {"draftLength": 4, "calibration": {"samples": [[1.0, 2.0]] * 50}}},
    }


def _owned_replica_set() -> dict[str, Any]:
    body = _resource()
    body["kind"] = "ReplicaSet"
    body["metadata"]["ownerReferences"] = [{"kind": "Deployment", "name": "llama", "uid": "1"}]
    return body


def _bare() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}}


def _storages() -> tuple[StatuslessDiffBaseStorage, kopf.AnnotationsDiffBaseStorage]:
    return StatuslessDiffBaseStorage(prefix="specops.dev"), kopf.AnnotationsDiffBaseStorage(
        prefix="specops.dev"
    )


@pytest.mark.parametrize("raw", [_resource(), _owned_replica_set(), _bare()], ids=["sdep", "owned", "bare"])
def test_the_essence_matches_kopfs_own(raw: dict[str, Any]) -> None:
    # Given Kopf's storage and ours, under the same prefix
    ours, kopfs = _storages()
    untouched = copy.deepcopy(raw)

    # When each builds the essence of the same body
    built = ours.build(body=kopf.Body(raw))

    # Then they are equal, key order included (Kopf stores it as JSON), the body is left as it
    # was, and the essence shares nothing with it
    expected = kopfs.build(body=kopf.Body(raw))
    assert built == expected and json.dumps(built) == json.dumps(expected)
    assert raw == untouched
    for value in built.values():
        if isinstance(value, dict):
            value["added"] = 1
    assert raw == untouched


def test_extra_fields_reach_into_the_status_as_kopfs_own() -> None:
    # Given a handler that asks for a status field to be part of the essence
    raw = _resource()
    ours, kopfs = _storages()
    fields = [("status", "speculation", "draftLength")]

    # When each builds it
    built = ours.build(body=kopf.Body(raw), extra_fields=fields)

    # Then the status field is in it, as in Kopf's
    assert built == kopfs.build(body=kopf.Body(raw), extra_fields=fields)
    assert built["status"]["speculation"]["draftLength"] == 4


@pytest.mark.parametrize("raw", [_resource(), _bare()], ids=["sdep", "bare"])
def test_clearing_the_progress_leaves_what_kopfs_own_leaves(raw: dict[str, Any]) -> None:
    # Given an essence with our progress annotations (Kopf's, under our prefix) and someone else's
    essence = kopf.AnnotationsDiffBaseStorage(prefix="other.dev").build(body=kopf.Body(raw))
    untouched = copy.deepcopy(essence)
    ours = FastCopyProgressStorage(prefix="specops.dev")
    kopfs = kopf.AnnotationsProgressStorage(prefix="specops.dev")

    # When each clears it of the progress
    cleared = ours.clear(essence=essence)

    # Then the same is left (our progress annotations gone, the other's kept), the essence given is
    # unchanged, and the result is a copy
    expected = kopfs.clear(essence=copy.deepcopy(untouched))
    assert cleared == expected and json.dumps(cleared) == json.dumps(expected)
    assert essence == untouched and cleared is not essence
    if "annotations" in raw["metadata"]:
        assert "specops.dev/reconcile" in essence["metadata"]["annotations"]
        assert list(cleared["metadata"]["annotations"]) == ["owner/note"]
