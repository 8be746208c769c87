"""The local stack's training controller finishes each kind of training object so the operator reads a trained draft."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from specops.adapters.kube import KubeClient
from specops.api.models import SpeculativeDeployment
from specops.services.retraining import RetrainingService
from specops_local.cluster import EmulatedCluster
from specops_local.serving import DraftBehaviour
from specops_local.training import TrainingController
from tests.conftest import EXAMPLES

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RETRAINING = EXAMPLES / "retraining"


def stale(cluster: EmulatedCluster, example: str) -> SpeculativeDeployment:
    """The example resource, created in its namespace, its draft trained for an older target."""
    body: dict[str, Any] = yaml.safe_load((RETRAINING / example).read_text())
    namespace = body["metadata"]["namespace"]
    if cluster.get("namespaces", namespace, namespace=None) is None:
        cluster.create("namespaces", {"metadata": {"name": namespace}}, namespace=None)
    cluster.create("speculativedeployments", body, namespace=namespace)
    name = body["metadata"]["name"]
    cluster.patch_status(
        "speculativedeployments",
        name,
        {"phase": "Dynamic", "retraining": {"draftTargetVersion": "2026-01-01"}},
        namespace=namespace,
    )
    live = cluster.get("speculativedeployments", name, namespace=namespace)
    assert live is not None
    return SpeculativeDeployment.model_validate(live)


@pytest.mark.parametrize("example", ["job.yaml", "jobset-multinode.yaml", "trainjob.yaml"])
async def test_a_round_started_by_the_operator_finishes_with_a_trained_draft(
    cluster: EmulatedCluster, kube: KubeClient, example: str
) -> None:
    # Given the operator's retraining started a round for a stale draft
    resource = stale(cluster, example)
    service = RetrainingService(kube)
    started = await service.tick(resource, resource.status, T0)
    assert started.retraining.active is not None
    drafts = {resource.spec.draft.version: DraftBehaviour(alpha=0.8)}
    controller = TrainingController(cluster, drafts, train_s=0.0)

    # When the local stack's training controller runs
    controller.sync()

    # Then the round's training object finished, and the operator's next tick reads the trained
    # draft the trainer published and hands it to a canary
    assert controller.completed == [started.retraining.active.job_name]
    running = resource.model_copy(
        update={"status": resource.status.model_copy(update={"retraining": started.retraining})}
    )
    finished = await service.tick(running, running.status, T0)
    assert [event.reason for event in finished.events] == ["RetrainingSucceeded"]
    version = started.retraining.active.output_version
    assert finished.candidate is not None and finished.candidate.version == version
    assert finished.candidate.uri == f"pvc://models/{resource.spec.draft.model}/{version}"
    # and the simulated engines will serve it a little better than the draft it was trained from
    assert drafts[version].alpha > drafts[resource.spec.draft.version].alpha

    # A finished object is left alone
    controller.sync()
    assert len(controller.completed) == 1
