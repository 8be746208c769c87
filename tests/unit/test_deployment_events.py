"""A serving Deployment's events refresh its owner's readiness only when what readiness reads moved.

Thousands of resources starting at once send several Deployment events each (the operator's own
patches, the controller's status bookkeeping); each refresh is a GET of the owner, a render and a
status write, so the events that cannot change the owner's conditions must cost nothing.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

import kopf

from specops.api.models import API_VERSION, KIND
from specops.domain.lifecycle import EventRecord
from specops.handlers.lifecycle import serving_deployment_changed


class CountingReconciler:
    def __init__(self, fail: bool = False) -> None:
        self.refreshed: list[str] = []
        self.fail = fail

    async def refresh(
        self, namespace: str, name: str, now: datetime, **_: Any
    ) -> tuple[dict[str, Any] | None, list[EventRecord]]:
        from specops.ports import KubeApiError

        if self.fail:
            raise KubeApiError(503, "ServiceUnavailable", "unavailable")
        self.refreshed.append(name)
        return None, []


class FakeServices:
    def __init__(self, reconciler: CountingReconciler) -> None:
        self.reconciler = reconciler


def _deployment(ready: int, *, resource_version: str = "1", annotation: str = "") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "chat-stable",
            "namespace": "default",
            "uid": "d-1",
            "generation": 1,
            "resourceVersion": resource_version,
            "annotations": {"note": annotation},
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": KIND, "name": "chat", "uid": "o-1"}],
        },
        "status": {"observedGeneration": 1, "readyReplicas": ready, "updatedReplicas": ready},
    }


async def _event(memo: kopf.Memo, body: dict[str, Any], type: str = "MODIFIED") -> None:
    await serving_deployment_changed(body=copy.deepcopy(body), memo=memo, type=type)


async def test_events_that_leave_readiness_unchanged_do_not_refresh_the_owner() -> None:
    reconciler = CountingReconciler()
    memo = kopf.Memo(services=FakeServices(reconciler))

    # The first event of a Deployment refreshes its owner
    await _event(memo, _deployment(0))
    assert reconciler.refreshed == ["chat"]
    # An annotation or resourceVersion change alone does not
    await _event(memo, _deployment(0, resource_version="2", annotation="x"))
    assert reconciler.refreshed == ["chat"]
    # A pod becoming ready does
    await _event(memo, _deployment(1, resource_version="3"))
    assert reconciler.refreshed == ["chat", "chat"]
    # The Deployment going away always does
    await _event(memo, _deployment(1, resource_version="4"), type="DELETED")
    assert reconciler.refreshed == ["chat", "chat", "chat"]


async def test_a_refresh_that_failed_is_tried_again_on_the_next_event() -> None:
    failing = CountingReconciler(fail=True)
    memo = kopf.Memo(services=FakeServices(failing))
    await _event(memo, _deployment(1))
    assert failing.refreshed == []

    # The same readiness, seen again after the API came back, still refreshes
    working = CountingReconciler()
    memo.services = FakeServices(working)
    await _event(memo, _deployment(1, resource_version="2"))
    assert working.refreshed == ["chat"]
