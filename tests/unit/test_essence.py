"""Kopf's last-handled configuration is the same whether built from the whole body or the slim one."""

from __future__ import annotations

import copy
import json
from typing import Any

import kopf
import pytest

from specops.handlers.essence import StatuslessDiffBaseStorage


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


def _pod_of_a_deployment() -> dict[str, Any]:
    body = _resource()
    body["kind"] = "ReplicaSet"
    body["metadata"]["ownerReferences"] = [{"kind": "Deployment", "name": "llama", "uid": "1"}]
    return body


def _bare() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}}


@pytest.mark.parametrize("raw", [_resource(), _pod_of_a_deployment(), _bare()], ids=["sdep", "owned", "bare"])
def test_the_essence_and_what_is_stored_match_kopfs_own(raw: dict[str, Any]) -> None:
    # Given Kopf's storage and ours, under the same prefix
    ours, kopfs = (
        StatuslessDiffBaseStorage(prefix="specops.dev"),
        kopf.AnnotationsDiffBaseStorage(prefix="specops.dev"),
    )
    untouched = copy.deepcopy(raw)

    # When each builds the essence of the same body
    built = ours.build(body=kopf.Body(raw))

    # Then they are equal, the body is left as it was, and the essence shares nothing with it
    assert built == kopfs.build(body=kopf.Body(raw))
    assert raw == untouched
    if "spec" in built:
        built["spec"]["serving"] = "changed"
        assert raw["spec"]["serving"] == untouched["spec"]["serving"]


def test_extra_fields_reach_into_the_status_as_kopfs_own() -> None:
    # Given a handler that asks for a status field to be part of the essence
    raw = _resource()
    ours, kopfs = (
        StatuslessDiffBaseStorage(prefix="specops.dev"),
        kopf.AnnotationsDiffBaseStorage(prefix="specops.dev"),
    )
    fields = [("status", "speculation", "draftLength")]

    # When each builds it
    built = ours.build(body=kopf.Body(raw), extra_fields=fields)

    # Then the status field is in it, as in Kopf's
    assert built == kopfs.build(body=kopf.Body(raw), extra_fields=fields)
    assert built["status"]["speculation"]["draftLength"] == 4
