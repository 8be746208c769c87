"""Retraining, end to end: a target update leads, by itself, to a retrained, tested, promoted draft.

The emulated cluster runs no Job controller, so the test plays it: it marks the training
Job complete and publishes the trainer's result the documented way (the Job annotation
specops.dev/result). Everything else is the real operator.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from specops.adapters.kube import KubeClient
from specops.api.models import API_VERSION, KIND
from specops_local.prometheus import PrometheusProcess
from specops_local.serving import ServingController
from tests.e2e.conftest import NAMESPACE, Operator
from tests.e2e.test_canary import canary_resource, serving_ready
from tests.e2e.test_control_loop import all_pods_at, in_dynamic
from tests.e2e.waiting import condition, events_for, eventually, resource, wait_condition

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only]

NAME = "llama-70b-chat"


def retraining_resource(prometheus: PrometheusProcess) -> dict[str, Any]:
    body = canary_resource(prometheus)
    body["spec"]["canary"].pop("trafficRouting")  # replica-ratio split behind the shared Service
    body["spec"]["retraining"] = {
        "enabled": True,
        "method": "onPolicy",
        "image": "registry.example.com/specops-trainer:1",
        "data": {"uri": "s3://prompts/llama-70b-chat/"},
        "autoCanary": True,
    }
    return body


async def training_jobs(kube: KubeClient) -> list[dict[str, Any]]:
    return await kube.list("batch/v1", "Job", NAMESPACE, {"specops.dev/deployment": NAME})


def env_of(job: dict[str, Any]) -> dict[str, str]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


@pytest.mark.timeout(300)  # a canary and a training round, each at the calibrated loop's pace
async def test_target_bump_retrains_once_and_promotes_the_new_draft(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    # Given a serving resource with retraining enabled
    await kube.create(retraining_resource(prometheus))
    await serving_ready(kube)
    await wait_condition(kube, NAME, "MetricsUnavailable", "False", timeout_s=30)

    # When the target's version changes
    await kube.patch(API_VERSION, KIND, NAMESPACE, NAME, {"spec": {"target": {"version": "2026-11-15"}}})

    # Then the draft is marked stale and one training Job starts, carrying the trainer contract
    body = await wait_condition(kube, NAME, "DraftStale", "True", timeout_s=20)
    assert "2026-10-01" in condition(body, "DraftStale")["message"]
    jobs = await eventually(lambda: training_jobs(kube), timeout_s=20, what="training Job")
    assert len(jobs) == 1
    env = env_of(jobs[0])
    assert env["SPECOPS_TARGET_VERSION"] == "2026-11-15" and env["SPECOPS_METHOD"] == "onPolicy"
    assert env["SPECOPS_DATA_URI"] == "s3://prompts/llama-70b-chat/"
    assert jobs[0]["metadata"]["ownerReferences"][0]["name"] == NAME

    # And an operator restart during training creates no second Job
    await operator.restart()
    await wait_condition(kube, NAME, "DraftStale", "True", timeout_s=10)
    assert len(await training_jobs(kube)) == 1

    # When the trainer finishes and publishes its draft (the test plays the Job controller)
    job = jobs[0]
    version = env["SPECOPS_OUTPUT_VERSION"]
    result = {
        "draftVersion": version,
        "checkpointUri": f"pvc://models/llama-70b-draft/{version}",
        "metrics": {},
    }
    await kube.patch(
        "batch/v1",
        "Job",
        NAMESPACE,
        job["metadata"]["name"],
        {"metadata": {"annotations": {"specops.dev/result": json.dumps(result)}}},
    )
    cluster.patch_status(
        "jobs",
        job["metadata"]["name"],
        {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1},
    )

    # Then the trained draft is canaried and promoted, and the draft is current again
    body = await wait_condition(kube, NAME, "CanaryRollout", "False", "CanaryPromoted", timeout_s=120)
    assert body["status"]["draft"]["version"] == version
    assert body["status"]["draft"]["source"] == "Retraining"
    body = await wait_condition(kube, NAME, "DraftStale", "False", timeout_s=20)
    assert body["status"]["retraining"]["draftTargetVersion"] == "2026-11-15"
    reasons = [e["reason"] for e in await events_for(kube, NAME)]
    for reason in ("RetrainingStarted", "RetrainingSucceeded", "CanaryStarted", "CanaryPromoted"):
        assert reason in reasons
    assert len(await training_jobs(kube)) == 1


async def test_stale_draft_policy_off_switches_speculation_off_until_a_new_draft_serves(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    # Given a resource that wants no speculation with a stale draft, speculating now
    body = retraining_resource(prometheus)
    body["spec"]["retraining"]["whileStale"] = "off"
    await kube.create(body)
    await serving_ready(kube)

    await in_dynamic(kube)
    await all_pods_at(serving, lambda n: n > 0, 20, "speculating in the Dynamic phase")

    # When the target changes, then speculation goes off on every pod, saying why
    await kube.patch(API_VERSION, KIND, NAMESPACE, NAME, {"spec": {"target": {"version": "2026-11-15"}}})
    await all_pods_at(serving, lambda n: n == 0, 30, "speculation off while stale")

    # the pods are set before the tick's one status write lands, so wait for the write
    async def off_for_staleness() -> dict[str, Any] | None:
        body = await resource(kube, NAME)
        speculation = ((body or {}).get("status") or {}).get("speculation") or {}
        return (
            body
            if speculation.get("reason") == "SpeculationHeld" and "stale" in str(speculation.get("message"))
            else None
        )

    live = await eventually(off_for_staleness, timeout_s=10, what="status saying speculation is off as stale")
    assert condition(live, "DraftStale")["status"] == "True"
