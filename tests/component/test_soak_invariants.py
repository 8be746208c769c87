"""The chaos soak's invariant checks find what they look for (so a soak reporting 0 violations means something).

Each check reads the emulated API server's store and the pods, as in a soak; the stack around
them is reduced to what the checks touch.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from specops.domain.retraining.naming import LABEL_ROUND
from specops_local.cluster import EmulatedCluster
from specops_local.soak import FAULT_KINDS, Excuse, FaultRecord, Soak, SoakSettings, round_order, summary
from tests.conftest import EXAMPLES

NAMESPACE = "default"
NAME = "llama-70b-chat"


@dataclass
class Engine:
    """A simulated engine as the revision check reads it: the K its parsed schedule drafts."""

    bands: list[tuple[int | None, int]]  # (largest batch, K), ascending; None: every batch above
    running: bool = True
    ready: bool = True

    def k_at(self, batch: int) -> int:
        return next((k for edge, k in self.bands if edge is None or batch <= edge), 0)


@dataclass
class Slot:
    """One stable pod: its revision label and its engine."""

    name: str
    revision: str
    engine: Engine | None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class ServingSet:
    owner: str
    variant: str
    slots: list[Slot] = field(default_factory=list)


@dataclass
class Serving:
    sets: dict[str, ServingSet] = field(default_factory=dict)


@dataclass
class Operator:
    running: bool = True


@dataclass
class Stack:
    cluster: EmulatedCluster
    serving: Serving = field(default_factory=Serving)
    operator: Operator = field(default_factory=Operator)
    namespace: str = NAMESPACE


@pytest.fixture
def soak(cluster: EmulatedCluster, monkeypatch: pytest.MonkeyPatch) -> Soak:
    checker = Soak(Stack(cluster), SoakSettings(resources=1), {})  # type: ignore[arg-type]
    clock = {"now": 100.0}
    monkeypatch.setattr(checker, "now_s", lambda: clock["now"])
    checker.clock = clock  # type: ignore[attr-defined]
    return checker


def advance(soak: Soak, seconds: float) -> None:
    soak.clock["now"] += seconds  # type: ignore[attr-defined]


def a_route_to(cluster: EmulatedCluster, *services: str) -> None:
    cluster.create(
        "httproutes",
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "route", "namespace": NAMESPACE},
            "spec": {
                "parentRefs": [{"name": "gateway"}],
                "rules": [{"backendRefs": [{"name": service, "port": 8000} for service in services]}],
            },
        },
    )


def a_service(cluster: EmulatedCluster, name: str) -> None:
    cluster.create(
        "services",
        {"metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"ports": [{"port": 8000}]}},
    )


def a_job(
    cluster: EmulatedCluster, name: str, round_number: str, status: dict[str, Any] | None = None
) -> None:
    labels = {"specops.dev/deployment": NAME, LABEL_ROUND: round_number}
    cluster.create(
        "jobs",
        {
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "train", "image": "trainer:1"}],
                    }
                }
            },
        },
    )
    if status:
        cluster.patch_status("jobs", name, status)


def a_resource(cluster: EmulatedCluster) -> None:
    body = yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())
    body["metadata"] = {"name": NAME, "namespace": NAMESPACE}
    cluster.create("speculativedeployments", body)


def violated(soak: Soak) -> list[str]:
    return [violation.invariant for violation in soak.violations]


async def test_a_route_to_a_missing_service_is_one_violation_until_it_is_repaired(
    cluster: EmulatedCluster, soak: Soak
) -> None:
    a_service(cluster, f"{NAME}-stable")
    a_route_to(cluster, f"{NAME}-stable", f"{NAME}-canary")
    soak.check_routes()
    soak.check_routes()
    assert violated(soak) == ["route-to-missing-backend"]
    assert f"{NAME}-canary" in soak.violations[0].detail
    a_service(cluster, f"{NAME}-canary")
    soak.check_routes()
    assert violated(soak) == ["route-to-missing-backend"]


async def test_two_unfinished_training_jobs_or_two_jobs_of_one_round_are_duplicates(
    cluster: EmulatedCluster, soak: Soak
) -> None:
    a_job(cluster, "train-1", "1", {"conditions": [{"type": "Complete", "status": "True"}]})
    a_job(cluster, "train-2", "2")
    soak.check_jobs()
    assert violated(soak) == []
    a_job(cluster, "train-2b", "2")
    soak.check_jobs()
    assert sorted(violated(soak)) == ["duplicate-training-job", "duplicate-training-job"]


SPECULATING = [(32, 4), (None, 0)]
REVISION = {
    "digest": "r2",
    "mode": "spec",
    "schedule": [{"maxBatch": 32, "k": 4}, {"k": 0}],
    "description": "draftModel K=4 to batch 32, K=0 above 32",
}


async def test_pods_may_differ_from_the_revision_in_status_for_a_rollout_and_longer_only_while_a_fault_explains_it(
    cluster: EmulatedCluster, soak: Soak
) -> None:
    # Given a resource whose status names revision r2 (K=4 to batch 32), one pod on it and one
    # still on the plain revision r1 (a rollout under way)
    a_resource(cluster)
    speculation = {"state": "on", "schedule": REVISION["description"], "revision": REVISION}
    cluster.patch_status("speculativedeployments", NAME, {"speculation": speculation})
    late = Slot(f"{NAME}-1", "r1", Engine([(None, 0)]))
    pods = [Slot(f"{NAME}-0", "r2", Engine(SPECULATING)), late]
    soak.stack.serving.sets["stable"] = ServingSet(NAME, "stable", pods)  # type: ignore[attr-defined]
    allowed = soak.rollout_allowance_s()

    # Then within the rollout's allowance nothing is wrong, after it it is (once)
    soak.check_revisions()
    advance(soak, allowed)
    soak.check_revisions()
    assert violated(soak) == []
    advance(soak, soak.settings.check_interval_s)
    soak.check_revisions()
    soak.check_revisions()
    assert violated(soak) == ["revision-mismatch"]
    assert f"{NAME}-1 runs revision r1, status of {NAME} names r2" in soak.violations[0].detail

    # And once it rolled out, a pod labelled with the revision whose engine drafts another schedule
    # is wrong too
    late.revision, late.engine = "r2", Engine(SPECULATING)
    soak.check_revisions()
    late.engine = Engine([(64, 4), (None, 0)])
    soak.check_revisions()
    advance(soak, allowed + soak.settings.check_interval_s)
    soak.check_revisions()
    assert violated(soak) == ["revision-mismatch", "revision-mismatch"]
    assert "drafts K [4, 4, 4, 4, 4, 0, 0, 0] at batches" in soak.violations[1].detail

    # And while the pod is faulted (and for two intervals after), a mismatch is explained
    late.engine = Engine(SPECULATING)
    soak.check_revisions()
    late.engine = Engine([(None, 0)])
    soak.excuses.append(Excuse("pod-crash", f"{NAME}-1", until_s=None))
    soak.check_revisions()
    advance(soak, 10 * allowed)
    soak.check_revisions()
    assert violated(soak) == ["revision-mismatch", "revision-mismatch"]

    # And once the fault ended, a mismatch that outlasts the grace and the allowance is wrong again
    soak.excuses = [Excuse("pod-crash", f"{NAME}-1", until_s=soak.now_s())]
    advance(soak, 2 * soak.interval_s() + 1)
    soak.check_revisions()
    advance(soak, allowed + 1)
    soak.check_revisions()
    assert violated(soak) == ["revision-mismatch"] * 3


async def test_once_no_canary_runs_the_stable_pods_serve_the_spec_draft_within_a_rollouts_time(
    cluster: EmulatedCluster, soak: Soak
) -> None:
    # Given a resource whose spec and status name draft v3, its two stable pods serving v3
    a_resource(cluster)
    v3 = {"version": "v3", "uri": "pvc://models/llama-70b-draft/v3", "source": "Spec"}
    cluster.patch_status(
        "speculativedeployments",
        NAME,
        {"draft": v3, "observedSpecDraft": "v3@pvc://models/llama-70b-draft/v3"},
    )
    pods = [
        Slot(f"{NAME}-{i}", "r1", Engine(SPECULATING), {"specops.dev/draft-version": "v3"}) for i in (0, 1)
    ]
    soak.stack.serving.sets["stable"] = ServingSet(NAME, "stable", pods)  # type: ignore[attr-defined]
    allowed = soak.rollout_allowance_s()
    soak.check_serving_drafts()
    assert violated(soak) == [] and soak.seen["serving draft checks"] == 1

    # When spec.draft names v4 while a canary of it runs, the pods may serve v3 for as long as it runs
    v4 = {**yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())["spec"]["draft"], "version": "v4"}
    v4["uri"] = "pvc://models/llama-70b-draft/v4"
    soak.patch_spec(NAME, {"draft": v4})
    canary = {"phase": "Progressing", "startedAt": "2026-12-01T12:00:00Z", "draft": {"version": "v4"}}
    cluster.patch_status("speculativedeployments", NAME, {"canary": canary})
    soak.check_serving_drafts()
    advance(soak, 10 * allowed)
    soak.check_serving_drafts()
    assert violated(soak) == []

    # Then once no canary runs (say a revert was overruled: v3 serves, spec says v4), a rollout's
    # time later it is a violation, once, naming both drafts
    cluster.patch_status("speculativedeployments", NAME, {"canary": None})
    soak.check_serving_drafts()
    advance(soak, allowed)
    soak.check_serving_drafts()
    assert violated(soak) == []
    advance(soak, soak.settings.check_interval_s)
    soak.check_serving_drafts()
    soak.check_serving_drafts()
    assert violated(soak) == ["serving-draft-not-spec"]
    assert "spec.draft names v4, status.draft v3, stable pods serve v3" in soak.violations[0].detail

    # And a spec draft a canary rejected leaves status.draft serving: no violation
    cluster.patch_status(
        "speculativedeployments", NAME, {"rejectedDraft": "v4@pvc://models/llama-70b-draft/v4"}
    )
    soak.check_serving_drafts()
    assert violated(soak) == ["serving-draft-not-spec"]
    # But pods that do not serve status.draft are wrong even then
    pods[1].labels["specops.dev/draft-version"] = "v2"
    soak.check_serving_drafts()
    advance(soak, allowed + soak.settings.check_interval_s)
    soak.check_serving_drafts()
    assert violated(soak) == ["serving-draft-not-spec"] * 2
    assert "stable pods serve v2, v3" in soak.violations[1].detail


async def test_a_resource_without_a_ready_condition_is_flagged_after_its_grace(
    cluster: EmulatedCluster, soak: Soak
) -> None:
    a_resource(cluster)
    soak.created_s[NAME] = 100.0
    soak.check_ready()
    assert violated(soak) == []
    advance(soak, 31.0)
    soak.check_ready()
    assert violated(soak) == ["no-ready-condition"]


def kopf_line(message: str) -> logging.LogRecord:
    record = logging.LogRecord("kopf.objects", logging.ERROR, __file__, 1, message, None, None)
    record.k8s_ref = {"namespace": NAMESPACE, "name": NAME}
    return record


async def test_a_handler_failing_three_times_in_a_row_is_a_crash_loop_and_a_success_ends_the_streak(
    soak: Soak,
) -> None:
    failing = "Daemon 'speculation_control' failed with an exception and will try again in 60 seconds: boom"
    for _ in range(2):
        soak.failures.emit(kopf_line(failing))
    soak.failures.emit(kopf_line("Daemon 'speculation_control' succeeded."))
    soak.failures.emit(kopf_line(failing))
    soak.failures.emit(kopf_line("Handler 'delete' failed temporarily: route not released"))
    soak.check_crash_loops()
    assert violated(soak) == []
    soak.failures.emit(kopf_line(failing))
    soak.failures.emit(kopf_line(failing))
    soak.check_crash_loops()
    assert violated(soak) == ["crash-loop"]
    assert "speculation_control default/llama-70b-chat" in soak.violations[0].detail


async def test_a_recovery_the_soak_ended_is_reported_as_cut_short_not_left_out(soak: Soak) -> None:
    # Given a soak whose new draft's canary finished, and whose target change's retraining round
    # was still running when the soak ended
    soak.faults.append(FaultRecord("new-draft", NAME, 10.0, ended_s=10.0, recovered_s=13.0))
    soak.faults.append(FaultRecord("target-change", NAME, 250.0, ended_s=250.0, cut_short=True))

    # When the soak reports
    report = soak.report()

    # Then the target change is listed, as still recovering rather than as a failure to recover
    assert report["recovery"]["target-change"] == {
        "count": 1,
        "mean_s": None,
        "max_s": None,
        "unrecovered": 0,
        "cut_short": 1,
    }
    assert report["recovery"]["new-draft"]["mean_s"] == 3.0
    assert "still recovering when the soak ended: 1" in summary(report)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_round_of_faults_begins_with_the_ones_that_run_in_the_background(seed: int) -> None:
    # Given the soak's fault kinds and a seeded schedule
    schedule = random.Random(seed)

    # When a round's order is drawn
    order = round_order(FAULT_KINDS, schedule)

    # Then every kind comes once, and a new draft and a target change (a canary, a retraining round
    # and its canary: minutes each) strike first, so a 5-minute soak sees them end
    assert sorted(order) == sorted(FAULT_KINDS)
    assert set(order[:2]) == {"new-draft", "target-change"}


def with_status(cluster: EmulatedCluster, status: dict[str, Any]) -> None:
    cluster.patch_status("speculativedeployments", NAME, status)


async def test_a_deletion_that_lasts_two_minutes_without_a_condition_saying_why_is_stuck(
    cluster: EmulatedCluster, soak: Soak
) -> None:
    body = yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())
    body["metadata"] = {"name": NAME, "namespace": NAMESPACE, "finalizers": ["specops.dev/finalizer"]}
    cluster.create("speculativedeployments", body)
    cluster.emulator.delete_object(cluster.resource("speculativedeployments"), NAMESPACE, NAME)
    soak.check_deletions()
    advance(soak, 119.0)
    soak.check_deletions()
    assert violated(soak) == [], "a deletion may take up to 2 minutes"
    why = {"type": "Degraded", "status": "True", "reason": "RouteNotReleased", "message": "route names x"}
    with_status(cluster, {"conditions": [why]})
    advance(soak, 2.0)
    soak.check_deletions()
    assert violated(soak) == [], "a condition says why it waits"
    with_status(cluster, {"conditions": [{**why, "status": "False", "reason": "AsExpected"}]})
    soak.check_deletions()
    soak.check_deletions()
    assert violated(soak) == ["stuck-in-deletion"]
    assert "no condition says why" in soak.violations[0].detail


@pytest.mark.parametrize(
    "leak",
    ["status", "event", "log"],
)
async def test_a_secret_of_the_corpus_in_status_an_event_or_a_log_line_is_a_leak(
    cluster: EmulatedCluster, soak: Soak, leak: str
) -> None:
    a_resource(cluster)
    assert "FakeTok3nValue9Z" in soak.secrets and len(soak.secrets) >= 30
    soak.check_secrets()
    assert violated(soak) == []
    message = "trainer failed: huggingface-cli upload --token FakeTok3nValue9Z org/draft"
    if leak == "status":
        with_status(cluster, {"retraining": {"lastMessage": message}})
    elif leak == "event":
        cluster.create(
            "events",
            {
                "metadata": {"name": f"{NAME}.1", "namespace": NAMESPACE},
                "involvedObject": {"kind": "SpeculativeDeployment", "name": NAME},
                "reason": "RetrainingFailed",
                "message": message,
            },
        )
    else:
        soak.log_lines.handle(logging.LogRecord("specops", logging.INFO, __file__, 1, message, None, None))
    soak.check_secrets()
    soak.check_secrets()
    assert violated(soak) == ["secret-in-output"]
    assert "FakeTok3nValue9Z" in soak.violations[0].detail


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -17])
async def test_a_non_finite_or_negative_number_in_status_is_flagged(
    cluster: EmulatedCluster, soak: Soak, value: float
) -> None:
    a_resource(cluster)
    signed = {"observed": {"batch": 4.0, "requestRate": 2.5}, "speculation": {"predictedGain": -0.02}}
    with_status(cluster, {**signed, "canary": {"step": -1}})
    soak.check_numbers()
    assert violated(soak) == [], "a predicted loss, and a canary before its first step at step -1"
    with_status(cluster, {"observed": {"batch": value, "requestRate": 2.5}})
    soak.check_numbers()
    assert violated(soak) == ["non-finite-status"]
    assert "status.observed.batch" in soak.violations[0].detail
