"""Creating a round's training Job against the emulated API server: exactly once, and a refusal is not a round."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from specops.adapters.kube import KubeClient
from specops.api.models import SpeculativeDeployment
from specops.domain.retraining.naming import LABEL_JOB
from specops.ports import KubeApiError
from specops.services.retraining import RetrainingResult, RetrainingService
from specops_local.cluster import EmulatedCluster
from tests.conftest import EXAMPLES
from tests.secret_shapes import IDS, SHAPES, SecretShape

NAME, NAMESPACE = "chat", "default"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def stale_resource(cluster: EmulatedCluster) -> SpeculativeDeployment:
    """A serving resource whose draft was trained for an older target version, retraining on."""
    body = yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())
    body["metadata"] = {"name": NAME, "namespace": NAMESPACE}
    body["spec"]["retraining"] = {
        "enabled": True,
        "image": "registry.example.com/specops-trainer:1",
        "data": {"uri": "s3://prompts/chat/"},
    }
    cluster.create("speculativedeployments", body)
    cluster.patch_status(
        "speculativedeployments",
        NAME,
        {"phase": "Dynamic", "retraining": {"draftTargetVersion": "2026-01-01"}},
    )
    live = cluster.get("speculativedeployments", NAME)
    assert live is not None
    return SpeculativeDeployment.model_validate(live)


async def test_a_conflict_that_is_not_already_exists_is_an_error_not_a_started_round(
    cluster: EmulatedCluster, kube: KubeClient
) -> None:
    # Given a stale draft, and an API server that refuses the Job with 409 Conflict (a quota, say)
    resource = stale_resource(cluster)

    def job_post(request: Any) -> bool:
        return request.method == "POST" and str(request.url).endswith("/jobs")

    cluster.emulator[job_post] << 409

    # When retraining ticks, then the refusal surfaces (the tick logs it and retries next interval)
    with pytest.raises(KubeApiError) as refused:
        await RetrainingService(kube).tick(resource, resource.status, T0)
    assert refused.value.status == 409
    assert cluster.objects("jobs", NAMESPACE) == []


async def test_a_job_that_already_exists_is_adopted_once(cluster: EmulatedCluster, kube: KubeClient) -> None:
    # Given the round's Job was created before an operator restart
    resource = stale_resource(cluster)
    first = await RetrainingService(kube).tick(resource, resource.status, T0)
    assert [e.reason for e in first.events] == ["RetrainingStarted"]
    assert first.retraining.active is not None
    # When a restarted operator (status lost this round) decides the same round again
    again = await RetrainingService(kube).tick(resource, resource.status, T0)
    # Then it adopts the Job: one Job, no second RetrainingStarted
    assert (
        again.retraining.active is not None
        and again.retraining.active.job_name == first.retraining.active.job_name
    )
    assert again.events == [] and len(cluster.objects("jobs", NAMESPACE)) == 1


def retargeted(resource: SpeculativeDeployment, status: Any, version: str) -> SpeculativeDeployment:
    """The resource after its spec names target ``version``, with the status a tick left."""
    target = resource.spec.target.model_copy(update={"version": version})
    spec = resource.spec.model_copy(update={"target": target})
    return resource.model_copy(
        update={"spec": spec, "status": resource.status.model_copy(update={"retraining": status})}
    )


async def round_running(
    cluster: EmulatedCluster, kube: KubeClient
) -> tuple[SpeculativeDeployment, RetrainingResult]:
    """A stale resource whose first round's Job was just created."""
    resource = stale_resource(cluster)
    first = await RetrainingService(kube).tick(resource, resource.status, T0)
    assert first.retraining.active is not None and len(cluster.objects("jobs", NAMESPACE)) == 1
    return resource, first


async def test_a_round_for_a_target_that_changed_is_stopped_and_the_new_targets_starts_at_once(
    cluster: EmulatedCluster, kube: KubeClient
) -> None:
    # Given a round training a draft for the current target
    resource, first = await round_running(cluster, kube)
    assert first.retraining.active is not None
    old_job = first.retraining.active.job_name
    assert [job["metadata"]["name"] for job in cluster.objects("jobs", NAMESPACE)] == [old_job]

    # When the target version changes while it runs
    moved = retargeted(resource, first.retraining, "2026-11-15")
    second = await RetrainingService(kube).tick(moved, moved.status, T0)

    # Then the obsolete round's Job is deleted (its GPUs freed) and recorded as superseded, not
    # failed, and the round for the new target starts in the same tick
    assert [e.reason for e in second.events] == ["RetrainingSuperseded", "RetrainingStarted"]
    assert old_job in second.events[0].message and "superseded by 2026-11-15" in second.events[0].message
    state = second.retraining
    assert state.last_result == "Superseded" and state.consecutive_failures == 0
    assert state.active is not None and state.active.target_version == "2026-11-15"
    assert [job["metadata"]["name"] for job in cluster.objects("jobs", NAMESPACE)] == [state.active.job_name]
    assert state.active.job_name != old_job


async def test_a_refused_delete_keeps_the_obsolete_round_recorded_until_it_goes(
    cluster: EmulatedCluster, kube: KubeClient
) -> None:
    # Given a round running for a target the spec no longer names, and an API server refusing its delete
    resource, first = await round_running(cluster, kube)
    moved = retargeted(resource, first.retraining, "2026-11-15")

    def job_delete(request: Any) -> bool:
        return request.method == "DELETE" and "/jobs/" in str(request.url)

    cluster.emulator[job_delete] << 503

    # When retraining ticks, then the refusal surfaces (the tick keeps its blocks and retries next
    # interval): the round stays recorded, its Job runs, and no second Job starts beside it
    with pytest.raises(KubeApiError):
        await RetrainingService(kube).tick(moved, moved.status, T0)
    assert len(cluster.objects("jobs", NAMESPACE)) == 1


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
async def test_no_secret_shape_in_a_trainers_message_reaches_status_conditions_or_events(
    cluster: EmulatedCluster, kube: KubeClient, shape: SecretShape
) -> None:
    # Given a round whose trainer failed, its termination message quoting a credential
    resource, first = await round_running(cluster, kube)
    assert first.retraining.active is not None
    job_name = first.retraining.active.job_name
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}
    cluster.patch_status("jobs", job_name, failed)
    pod = f"{job_name}-0"
    cluster.create(
        "pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": NAMESPACE, "labels": {LABEL_JOB: job_name}},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]},
        },
    )
    terminated = {"exitCode": 1, "message": shape.text}
    cluster.patch_status(
        "pods", pod, {"containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]}
    )

    # When retraining follows the round
    status = resource.status.model_copy(update={"retraining": first.retraining})
    result = await RetrainingService(kube).tick(resource, status, T0)

    # Then the round failed, saying where, and the secret is in none of status, condition, Event
    assert result.retraining.last_result == "Failed"
    assert f"{job_name}-0/trainer" in result.retraining.last_message
    shown = {
        "status.retraining.lastMessage": result.retraining.last_message,
        "Retraining condition": " ".join(u.message for u in result.updates if u.type == "Retraining"),
        "RetrainingFailed Event": " ".join(
            e.message for e in result.events if e.reason == "RetrainingFailed"
        ),
    }
    assert all(shown.values()), shown
    leaked = {sink: text for sink, text in shown.items() if shape.secret in text}
    assert not leaked, leaked
