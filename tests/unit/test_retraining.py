"""Draft retraining: when a round starts, the Job it renders, and how its end is read."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from specops.api.models import SpeculativeDeployment
from specops.api.status import RetrainingStatus
from specops.domain import retraining as rt
from specops.domain.retraining import (
    ACCEPTANCE_BELOW_SLO,
    TARGET_VERSION_CHANGED,
    ActiveRound,
    Failed,
    RetrainingState,
    Running,
    Succeeded,
    TemplateError,
    TrainedDraft,
    Trigger,
)

ROOT = Path(__file__).resolve().parents[2]
RETRAINING_EXAMPLES = ROOT / "docs" / "examples" / "retraining"
UID = "7a3c1e52-9b0d-4f6e-8c21-5d4f3a2b1c00"
NOW = datetime(2026, 10, 2, 12, 0, tzinfo=UTC)
K8S_VERSION = latest_version()
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DRAFT_VERSION = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
CONTRACT = {
    "SPECOPS_TARGET_MODEL",
    "SPECOPS_TARGET_VERSION",
    "SPECOPS_TARGET_URI",
    "SPECOPS_DRAFT_MODEL",
    "SPECOPS_DRAFT_VERSION",
    "SPECOPS_DRAFT_KIND",
    "SPECOPS_DATA_URI",
    "SPECOPS_METHOD",
    "SPECOPS_TARGET_ASSISTED_ROLLOUT",
    "SPECOPS_REPLAY_REJECTED",
    "SPECOPS_REJECTED_WEIGHT",
    "SPECOPS_OUTPUT_VERSION",
    "SPECOPS_RESULT_PATH",
}


def body(
    *,
    target_version: str = "2026-10-01",
    template: dict[str, Any] | None = None,
    image: str | None = "registry.example.com/ml/draft-trainer:1.4.0",
    **retraining: Any,
) -> dict[str, Any]:
    spec_retraining: dict[str, Any] = {
        "enabled": True,
        "data": {"uri": "s3://prompts/chat/"},
        "triggers": {"targetVersionChange": True, "acceptanceBelowSLO": {"for": "30m", "cooldown": "24h"}},
        **retraining,
    }
    if image:
        spec_retraining["image"] = image
    if template is not None:
        spec_retraining["template"] = template
    return {
        "apiVersion": "specops.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": "llama-70b-chat", "namespace": "inference", "uid": UID},
        "spec": {
            "target": {
                "model": "llama-3.1-70b-instruct",
                "version": target_version,
                "parameters": "70B",
                "uri": "pvc://models/llama-3.1-70b-instruct",
            },
            "draft": {
                "model": "llama-3.1-8b-draft",
                "version": "v3",
                "parameters": "7B",
                "uri": "pvc://models/llama-70b-draft/v3",
            },
            "serving": {"gpu": {"type": "H100", "count": 4}, "tensorParallel": 4},
            "slo": {"minAcceptance": 0.5},
            "retraining": spec_retraining,
        },
    }


def resource(**kwargs: Any) -> SpeculativeDeployment:
    """The base resource; keyword arguments go to body() (spec.retraining fields among them)."""
    return SpeculativeDeployment.model_validate(body(**kwargs))


def example(name: str) -> SpeculativeDeployment:
    data = yaml.safe_load((RETRAINING_EXAMPLES / name).read_text())
    data["metadata"]["uid"] = UID
    return SpeculativeDeployment.model_validate(data)


def stale_state(**changes: Any) -> RetrainingState:
    """A draft trained for the previous target version."""
    return replace(RetrainingState(draft_target_version="2026-09-01"), **changes)


def trigger(reason: rt.TriggerReason = TARGET_VERSION_CHANGED, round_number: int = 1) -> Trigger:
    return Trigger(reason, "2026-10-01", round_number, f"v3-rt{round_number}-2026-10-01", "test")


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env", [])}


def active_round(kind: str = "Job") -> ActiveRound:
    return ActiveRound(
        "llama-70b-chat-rt1-x", "batch/v1", kind, TARGET_VERSION_CHANGED, 1, "2026-10-01", "v", NOW
    )


# ---------------------------------------------------------------- names


@pytest.mark.parametrize(
    "resource_name",
    ["llama-70b-chat", "a" * 253, "7b.draft.test", "x", "long.name.with.dots-" + "z" * 80, "---weird---"],
)
def test_job_names_are_short_dns_labels_starting_with_a_letter(resource_name: str) -> None:
    name = rt.job_name(resource_name, "2026-10-01", TARGET_VERSION_CHANGED, 12)
    assert DNS_1035.match(name), name
    assert len(name) <= rt.MAX_JOB_NAME <= 63


def test_job_name_is_the_same_for_the_same_round_and_differs_between_rounds() -> None:
    first = rt.job_name("llama-70b-chat", "2026-10-01", TARGET_VERSION_CHANGED, 1)
    assert first == rt.job_name("llama-70b-chat", "2026-10-01", TARGET_VERSION_CHANGED, 1)
    others = {
        rt.job_name("llama-70b-chat", "2026-10-01", TARGET_VERSION_CHANGED, 2),
        rt.job_name("llama-70b-chat", "2026-11-01", TARGET_VERSION_CHANGED, 1),
        rt.job_name("llama-70b-chat", "2026-10-01", ACCEPTANCE_BELOW_SLO, 1),
        rt.job_name("llama-70b-chat-2", "2026-10-01", TARGET_VERSION_CHANGED, 1),
    }
    assert first not in others and len(others) == 4


def test_long_names_that_share_a_prefix_still_differ() -> None:
    base = "a" * 80
    assert rt.job_name(base + "1", "t", TARGET_VERSION_CHANGED, 1) != rt.job_name(
        base + "2", "t", TARGET_VERSION_CHANGED, 1
    )


@pytest.mark.parametrize(
    ("draft", "target", "expected"),
    [
        ("v3", "2026-10-01", "v3-rt1-2026-10-01"),
        ("v3", "release/7 build#2", "v3-rt1-release-7-build-2"),
        ("v3", "--", "v3-rt1-target"),
    ],
)
def test_output_version_is_a_valid_draft_version(draft: str, target: str, expected: str) -> None:
    assert rt.output_version(draft, target, 1) == expected


def test_output_version_of_long_inputs_is_bounded_and_valid() -> None:
    version = rt.output_version("d" * 63, "t" * 63, 99)
    assert len(version) <= 63 and DRAFT_VERSION.match(version)


# ---------------------------------------------------------------- trigger rules


def _failed(failures: int, minutes_ago: float, spec_key: str | None = None, **kwargs: Any) -> RetrainingState:
    spec = resource(**kwargs).spec
    return stale_state(
        consecutive_failures=failures,
        failure_key=spec_key or rt.setup_key(spec),
        last_finished_at=NOW - timedelta(minutes=minutes_ago),
        last_result="Failed",
        rounds=failures,
    )


TRIGGER_CASES: list[tuple[str, dict[str, Any], RetrainingState, str | None]] = [
    ("disabled: nothing even when stale", {"enabled": False}, stale_state(), None),
    ("stale draft starts a round", {}, stale_state(), TARGET_VERSION_CHANGED),
    (
        "stale draft, trigger switched off",
        {"triggers": {"targetVersionChange": False}},
        stale_state(),
        None,
    ),
    ("current draft: nothing", {}, RetrainingState(draft_target_version="2026-10-01"), None),
    ("a round runs: never a second", {}, stale_state(active=active_round()), None),
    (
        "trained draft for this target waits for its canary",
        {},
        stale_state(trained=TrainedDraft("v3-rt1-2026-10-01", "pvc://e/d", "2026-10-01")),
        None,
    ),
    (
        "trained draft for an older target does not block",
        {},
        stale_state(trained=TrainedDraft("v3-rt1-2026-09-01", "pvc://e/d", "2026-09-01")),
        TARGET_VERSION_CHANGED,
    ),
    ("1 failure, 5 min ago: backoff (10 min)", {}, _failed(1, 5), None),
    ("1 failure, 11 min ago: retry", {}, _failed(1, 11), TARGET_VERSION_CHANGED),
    ("3 failures, 30 min ago: backoff (40 min)", {}, _failed(3, 30), None),
    ("3 failures, 41 min ago: retry", {}, _failed(3, 41), TARGET_VERSION_CHANGED),
    ("5 failures: gave up, even a week later", {}, _failed(5, 7 * 24 * 60), None),
    ("5 failures of another setup: retry now", {}, _failed(5, 1, spec_key="other"), TARGET_VERSION_CHANGED),
    (
        "acceptance below SLO for 31 of 30 min",
        {},
        RetrainingState(draft_target_version="2026-10-01", alpha_below_since=NOW - timedelta(minutes=31)),
        ACCEPTANCE_BELOW_SLO,
    ),
    (
        "acceptance below SLO for 29 of 30 min",
        {},
        RetrainingState(draft_target_version="2026-10-01", alpha_below_since=NOW - timedelta(minutes=29)),
        None,
    ),
    (
        "acceptance below SLO but within the 24 h cooldown",
        {},
        RetrainingState(
            draft_target_version="2026-10-01",
            alpha_below_since=NOW - timedelta(hours=5),
            last_finished_at=NOW - timedelta(hours=2),
            last_result="Succeeded",
        ),
        None,
    ),
    (
        "acceptance below SLO after the cooldown",
        {},
        RetrainingState(
            draft_target_version="2026-10-01",
            alpha_below_since=NOW - timedelta(hours=5),
            last_finished_at=NOW - timedelta(hours=25),
            last_result="Succeeded",
        ),
        ACCEPTANCE_BELOW_SLO,
    ),
    (
        "acceptance trigger not configured",
        {"triggers": {"targetVersionChange": True}},
        RetrainingState(draft_target_version="2026-10-01", alpha_below_since=NOW - timedelta(hours=5)),
        None,
    ),
    ("acceptance fine", {}, RetrainingState(draft_target_version="2026-10-01"), None),
]


@pytest.mark.parametrize(
    ("retraining", "state", "expected"), [c[1:] for c in TRIGGER_CASES], ids=[c[0] for c in TRIGGER_CASES]
)
def test_trigger_rules(retraining: dict[str, Any], state: RetrainingState, expected: str | None) -> None:
    spec = resource(**retraining).spec
    decided = rt.retraining_trigger(spec, state, now=NOW)
    assert (decided.reason if decided else None) == expected
    if decided:
        assert decided.round_number == state.rounds + 1
        assert decided.target_version == "2026-10-01"
        assert decided.output_version == f"v3-rt{state.rounds + 1}-2026-10-01"


@pytest.mark.parametrize(
    ("failures", "seconds"),
    [(0, 0.0), (1, 600.0), (2, 1200.0), (3, 2400.0), (7, 38400.0), (8, 12 * 3600.0), (40, 12 * 3600.0)],
)
def test_backoff_doubles_and_is_capped(failures: int, seconds: float) -> None:
    assert rt.backoff_seconds(failures) == seconds


@pytest.mark.parametrize(
    ("since", "alpha", "expected"),
    [
        (None, 0.3, NOW),
        (NOW - timedelta(minutes=10), 0.3, NOW - timedelta(minutes=10)),
        (NOW - timedelta(minutes=10), 0.6, None),
        (NOW - timedelta(minutes=10), None, None),
        (None, 0.5, None),
    ],
)
def test_acceptance_clock(since: datetime | None, alpha: float | None, expected: datetime | None) -> None:
    state = RetrainingState(alpha_below_since=since)
    assert rt.observe_acceptance(state, alpha, 0.5, NOW).alpha_below_since == expected


def test_a_new_resource_adopts_its_draft_as_current() -> None:
    state = RetrainingState.from_status(None, default_target_version="2026-10-01")
    spec = resource().spec
    assert not rt.draft_stale(spec, state)
    assert rt.retraining_trigger(spec, state, now=NOW) is None


# ---------------------------------------------------------------- round lifecycle


def test_a_round_from_trigger_to_promoted_draft() -> None:
    res = resource()
    spec = res.spec
    # given a stale draft
    state = stale_state()
    assert rt.retraining_conditions(spec, state, NOW)[0].status == "True"
    # when the round starts
    decided = rt.retraining_trigger(spec, state, now=NOW)
    assert decided is not None
    manifest = rt.render_training_job(res, decided)
    state = rt.start_round(state, decided, manifest, NOW)
    # then no second round starts while it runs, even much later
    assert rt.retraining_trigger(spec, state, now=NOW + timedelta(days=3)) is None
    assert state.active is not None and state.active.job_name == manifest["metadata"]["name"]
    assert rt.retraining_conditions(spec, state, NOW)[1].reason == "RetrainingStarted"
    # when it succeeds, the trained draft goes to a canary
    later = NOW + timedelta(hours=3)
    state = rt.finish_round(
        spec, state, Succeeded(decided.output_version, "pvc://engines/d/new", {"alpha": 0.8}), later
    )
    trained = rt.draft_to_canary(spec, state)
    assert trained == TrainedDraft(
        decided.output_version, "pvc://engines/d/new", "2026-10-01", {"alpha": 0.8}
    )
    assert rt.retraining_trigger(spec, state, now=later + timedelta(days=3)) is None
    # and once promoted, the draft is current again
    state = rt.accept_trained_draft(state, trained.target_version)
    assert not rt.draft_stale(spec, state)
    assert rt.retraining_conditions(spec, state, later)[0].reason == "DraftCurrent"
    assert rt.retraining_trigger(spec, state, now=later + timedelta(days=3)) is None


def test_without_auto_canary_the_trained_draft_waits_for_a_person() -> None:
    spec = resource(autoCanary=False).spec
    state = stale_state(active=active_round(), rounds=1)
    state = rt.finish_round(spec, state, Succeeded("v3-rt1-2026-10-01", "pvc://e/d"), NOW)
    assert rt.draft_to_canary(spec, state) is None
    assert state.trained is not None
    assert rt.retraining_conditions(spec, state, NOW)[1].reason == "RetrainingSucceeded"


def test_failures_back_off_then_give_up() -> None:
    spec = resource().spec
    state = stale_state()
    now = NOW
    for attempt in range(1, rt.MAX_CONSECUTIVE_FAILURES + 1):
        decided = rt.retraining_trigger(spec, state, now=now)
        assert decided is not None, f"attempt {attempt} should start"
        state = rt.start_round(
            state,
            decided,
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"j{attempt}"}},
            now,
        )
        state = rt.finish_round(spec, state, Failed("CUDA out of memory"), now)
        assert state.consecutive_failures == attempt
        assert rt.retraining_trigger(spec, state, now=now + timedelta(seconds=1)) is None
        condition = rt.retraining_conditions(spec, state, now)[1]
        now += timedelta(seconds=rt.backoff_seconds(attempt) + 1)
    assert condition.reason == "RetrainingGaveUp"
    assert "CUDA out of memory" in condition.message
    assert rt.retraining_trigger(spec, state, now=now + timedelta(days=30)) is None
    # a changed setup (here: a new data uri) is worth one more try at once
    fixed = resource(data={"uri": "s3://prompts/chat-v2/"}).spec
    assert rt.retraining_trigger(fixed, state, now=now) is not None


def test_backoff_condition_says_when_the_next_attempt_may_start() -> None:
    spec = resource().spec
    state = rt.finish_round(spec, stale_state(active=active_round(), rounds=1), Failed("exit 1"), NOW)
    condition = rt.retraining_conditions(spec, state, NOW + timedelta(minutes=1))[1]
    assert condition.reason == "RetrainingBackoff"
    assert "2026-10-02T12:10:00Z" in condition.message


def test_a_rejected_canary_counts_as_a_failed_round() -> None:
    spec = resource().spec
    state = stale_state(trained=TrainedDraft("v3-rt1-2026-10-01", "pvc://e/d", "2026-10-01"), rounds=1)
    state = rt.reject_trained_draft(spec, state, "acceptance 0.41 < 0.55", NOW)
    assert state.trained is None and state.consecutive_failures == 1
    assert rt.retraining_trigger(spec, state, now=NOW + timedelta(minutes=5)) is None
    assert rt.retraining_trigger(spec, state, now=NOW + timedelta(minutes=11)) is not None


def test_status_round_trips_through_json() -> None:
    state = RetrainingState(
        draft_target_version="2026-09-01",
        rounds=3,
        active=active_round("JobSet"),
        trained=TrainedDraft("v3-rt2", "pvc://e/d", "2026-09-01", {"alpha": 0.75}),
        last_finished_at=NOW - timedelta(hours=1),
        last_result="Failed",
        last_message="round 2: boom",
        consecutive_failures=2,
        failure_key="abc",
        alpha_below_since=NOW - timedelta(minutes=3),
    )
    wire = json.loads(json.dumps(state.to_status().model_dump(by_alias=True, mode="json")))
    assert wire["active"]["startedAt"] == "2026-10-02T11:00:00Z" or wire["active"]["startedAt"].endswith("Z")
    status = RetrainingStatus.model_validate(wire)
    assert RetrainingState.from_status(status, default_target_version="ignored") == state


def test_disabled_retraining_still_reports_a_stale_draft() -> None:
    spec = resource(enabled=False).spec
    conditions = rt.retraining_conditions(spec, stale_state(), NOW)
    assert [(c.type, c.status, c.reason) for c in conditions] == [
        ("DraftStale", "True", "TargetVersionChanged")
    ]


# ---------------------------------------------------------------- rendering


def _pod_templates(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec = manifest["spec"]
    if manifest["kind"] == "Job":
        return [spec["template"]]
    if manifest["kind"] == "JobSet":
        return [rj["template"]["spec"]["template"] for rj in spec["replicatedJobs"]]
    return [replica["template"] for replica in spec["pytorchReplicaSpecs"].values()]


def _assert_identity(manifest: dict[str, Any], round_number: int = 1) -> None:
    meta = manifest["metadata"]
    assert meta["name"] == rt.job_name("llama-70b-chat", "2026-10-01", TARGET_VERSION_CHANGED, round_number)
    assert meta["namespace"] == "inference"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "specops.dev/v1alpha1",
            "kind": "SpeculativeDeployment",
            "name": "llama-70b-chat",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    labels = meta["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "specops"
    assert labels["app.kubernetes.io/instance"] == "llama-70b-chat"
    assert labels["app.kubernetes.io/component"] == "retraining"
    assert labels["specops.dev/deployment"] == "llama-70b-chat"
    assert labels["specops.dev/retraining-round"] == str(round_number)
    assert meta["annotations"]["specops.dev/output-version"] == f"v3-rt{round_number}-2026-10-01"


def _assert_contract(container: dict[str, Any]) -> dict[str, str]:
    env = env_of(container)
    assert set(env) >= CONTRACT
    assert env["SPECOPS_TARGET_MODEL"] == "llama-3.1-70b-instruct"
    assert env["SPECOPS_TARGET_VERSION"] == "2026-10-01"
    assert env["SPECOPS_DRAFT_VERSION"] == "v3"
    assert env["SPECOPS_OUTPUT_VERSION"] == "v3-rt1-2026-10-01"
    return env


def test_empty_template_gives_a_valid_restricted_job_running_the_image() -> None:
    manifest = rt.render_training_job(resource(), trigger())
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    _assert_identity(manifest)
    assert manifest["spec"]["backoffLimit"] == rt.JOB_BACKOFF_LIMIT
    assert manifest["spec"]["ttlSecondsAfterFinished"] == rt.TTL_AFTER_FINISHED_S
    pod_template = manifest["spec"]["template"]
    assert (
        pod_template["metadata"]["labels"] == rt.pod_selector(manifest) | pod_template["metadata"]["labels"]
    )
    pod = pod_template["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    [container] = pod["containers"]
    assert container["image"] == "registry.example.com/ml/draft-trainer:1.4.0"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    env = _assert_contract(container)
    assert env["SPECOPS_METHOD"] == "onPolicy"
    assert env["SPECOPS_TARGET_ASSISTED_ROLLOUT"] == "true"
    assert env["SPECOPS_REJECTED_WEIGHT"] == "2.0"
    assert env["SPECOPS_RESULT_PATH"] == "/dev/termination-log"
    assert "--output-version=v3-rt1-2026-10-01" in container["args"]
    assert "--target-uri=pvc://models/llama-3.1-70b-instruct" in container["args"]
    assert "--result-path=/dev/termination-log" in container["args"]


def test_rendering_is_deterministic_and_leaves_the_spec_alone() -> None:
    template = yaml.safe_load((RETRAINING_EXAMPLES / "jobset-multinode.yaml").read_text())["spec"][
        "retraining"
    ]["template"]
    res = resource(template=template)
    before = copy.deepcopy(res.spec.retraining.template)
    assert rt.render_training_job(res, trigger()) == rt.render_training_job(res, trigger())
    assert res.spec.retraining.template == before


def test_no_image_and_no_template_names_the_field() -> None:
    with pytest.raises(TemplateError) as error:
        rt.render_training_job(resource(image=None), trigger())
    assert error.value.field == "spec.retraining.image"


def test_job_template_keeps_its_own_settings_and_gets_the_contract() -> None:
    template = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ignored", "generateName": "x-", "labels": {"team": "ml"}},
        "spec": {
            "backoffLimit": 3,
            "template": {
                "spec": {
                    "restartPolicy": "OnFailure",
                    "securityContext": {"runAsNonRoot": False, "runAsUser": 0},
                    "initContainers": [{"name": "fetch", "image": "fetcher:1", "args": ["fetch"]}],
                    "containers": [
                        {
                            "name": "trainer",
                            "command": ["python", "train.py"],
                            "env": [
                                {"name": "DATA", "value": "$(SPECOPS_DATA_URI)"},
                                {"name": "SPECOPS_METHOD", "value": "spoofed"},
                            ],
                            "terminationMessagePath": "/tmp/result.json",
                            "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}},
                        }
                    ],
                }
            },
        },
    }
    manifest = rt.render_training_job(resource(template=template), trigger())
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    _assert_identity(manifest)
    assert "generateName" not in manifest["metadata"]
    assert manifest["metadata"]["labels"]["team"] == "ml"
    assert manifest["spec"]["backoffLimit"] == 3
    pod = manifest["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "OnFailure"
    assert pod["securityContext"]["runAsNonRoot"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [init] = pod["initContainers"]
    assert "SPECOPS_DATA_URI" in env_of(init) and init["args"] == ["fetch"]
    [container] = pod["containers"]
    assert container["image"] == "registry.example.com/ml/draft-trainer:1.4.0"
    assert "args" not in container, "a container with its own command reads the contract from env only"
    names = [item["name"] for item in container["env"]]
    assert names.index("SPECOPS_DATA_URI") < names.index("DATA"), "contract first, so $(SPECOPS_...) expands"
    env = _assert_contract(container)
    assert env["SPECOPS_METHOD"] == "onPolicy", "the contract wins over the template"
    assert env["SPECOPS_RESULT_PATH"] == "/tmp/result.json"
    assert container["securityContext"]["capabilities"] == {"add": ["SYS_PTRACE"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_jobset_template_injects_every_replicated_job() -> None:
    template = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "spec": {
            "replicatedJobs": [
                {
                    "name": name,
                    "replicas": 1,
                    "template": {
                        "spec": {"template": {"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}}
                    },
                }
                for name in ("driver", "workers")
            ]
        },
    }
    manifest = rt.render_training_job(resource(template=template), trigger())
    _assert_identity(manifest)
    assert manifest["spec"]["ttlSecondsAfterFinished"] == rt.TTL_AFTER_FINISHED_S
    assert manifest["spec"]["failurePolicy"] == {"maxRestarts": rt.JOBSET_MAX_RESTARTS}
    for replicated in manifest["spec"]["replicatedJobs"]:
        assert replicated["template"]["spec"]["backoffLimit"] == rt.DISTRIBUTED_BACKOFF_LIMIT
    pods = _pod_templates(manifest)
    assert len(pods) == 2
    for pod_template in pods:
        assert (
            pod_template["metadata"]["labels"]["specops.dev/retraining-job"] == manifest["metadata"]["name"]
        )
        assert pod_template["spec"]["restartPolicy"] == "Never"
        assert pod_template["spec"]["securityContext"]["runAsNonRoot"] is True
        for container in pod_template["spec"]["containers"]:
            _assert_contract(container)
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_trainjob_template_sets_trainer_env_image_and_args() -> None:
    template = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2, "env": [{"name": "X", "value": "1"}]},
        },
    }
    manifest = rt.render_training_job(resource(template=template), trigger())
    _assert_identity(manifest)
    trainer = manifest["spec"]["trainer"]
    assert trainer["image"] == "registry.example.com/ml/draft-trainer:1.4.0"
    assert trainer["numNodes"] == 2
    env = _assert_contract(trainer)
    assert env["X"] == "1"
    assert "--method=onPolicy" in trainer["args"]
    assert rt.pod_selector(manifest) == {"jobset.sigs.k8s.io/jobset-name": manifest["metadata"]["name"]}


def test_trainjob_with_its_own_command_gets_no_args() -> None:
    template = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"command": ["torchrun", "t.py"]}},
    }
    trainer = rt.render_training_job(resource(template=template), trigger())["spec"]["trainer"]
    assert "args" not in trainer and trainer["command"] == ["torchrun", "t.py"]


def test_pytorchjob_template_injects_every_replica() -> None:
    pod = {"spec": {"containers": [{"name": "pytorch", "command": ["python", "t.py"]}]}}
    template = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": pod},
                "Worker": {"replicas": 3, "template": pod},
            }
        },
    }
    manifest = rt.render_training_job(resource(template=template), trigger())
    _assert_identity(manifest)
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == rt.DISTRIBUTED_BACKOFF_LIMIT
    for replica in manifest["spec"]["pytorchReplicaSpecs"].values():
        assert replica["restartPolicy"] == "Never"
        [container] = replica["template"]["spec"]["containers"]
        _assert_contract(container)


BAD_TEMPLATES: list[tuple[str, dict[str, Any], str]] = [
    (
        "a Deployment",
        {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}},
        "spec.retraining.template.kind",
    ),
    (
        "a Job of another version",
        {"apiVersion": "batch/v2", "kind": "Job", "spec": {}},
        "spec.retraining.template.kind",
    ),
    ("no kind", {"spec": {}}, "spec.retraining.template.kind"),
    (
        "a Job without pod template",
        {"apiVersion": "batch/v1", "kind": "Job", "spec": {}},
        "spec.retraining.template.spec.template",
    ),
    (
        "a Job without containers",
        {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": {"containers": []}}}},
        "spec.retraining.template.spec.template.spec.containers",
    ),
    (
        "a JobSet without replicated jobs",
        {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spec": {"replicatedJobs": []}},
        "spec.retraining.template.spec.replicatedJobs",
    ),
    (
        "a JobSet whose second job has no pod template",
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "a",
                        "template": {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}},
                    },
                    {"name": "b", "template": {"spec": {}}},
                ]
            },
        },
        "spec.retraining.template.spec.replicatedJobs[1].template.spec.template",
    ),
    (
        "a TrainJob without runtime",
        {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "spec": {"trainer": {}}},
        "spec.retraining.template.spec.runtimeRef.name",
    ),
    (
        "another namespace",
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": "other"}, "spec": {}},
        "spec.retraining.template.metadata.namespace",
    ),
]


@pytest.mark.parametrize(
    ("template", "field"), [c[1:] for c in BAD_TEMPLATES], ids=[c[0] for c in BAD_TEMPLATES]
)
def test_bad_templates_name_the_field_to_fix(template: dict[str, Any], field: str) -> None:
    with pytest.raises(TemplateError) as error:
        rt.render_training_job(resource(template=template), trigger())
    assert error.value.field == field


def test_unsupported_kind_message_lists_the_supported_ones() -> None:
    with pytest.raises(TemplateError, match=r"Deployment.*batch/v1 Job.*JobSet.*TrainJob"):
        rt.render_training_job(resource(template={"apiVersion": "apps/v1", "kind": "Deployment"}), trigger())


def test_container_without_image_and_no_default_image_is_refused() -> None:
    template = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {"template": {"spec": {"containers": [{"name": "t"}]}}},
    }
    with pytest.raises(TemplateError) as error:
        rt.render_training_job(resource(template=template, image=None), trigger())
    assert error.value.field == "spec.retraining.template.spec.template.spec.containers[0].image"


@pytest.mark.parametrize("path", sorted(RETRAINING_EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_documented_templates_render(path: Path) -> None:
    res = example(path.name)
    state = RetrainingState(draft_target_version="2026-09-01")
    decided = rt.retraining_trigger(res.spec, state, now=NOW)
    assert decided is not None and decided.reason == TARGET_VERSION_CHANGED
    manifest = rt.render_training_job(res, decided)
    if manifest["kind"] == "Job":
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    containers = (
        [manifest["spec"]["trainer"]]
        if manifest["kind"] == "TrainJob"
        else [c for p in _pod_templates(manifest) for c in p["spec"]["containers"]]
    )
    for container in containers:
        assert set(env_of(container)) >= CONTRACT
        assert container["image"]


def test_every_example_resource_has_its_own_name() -> None:
    """Applied together (kubectl apply -f docs/examples/ -R), no example replaces another."""
    paths = [*RETRAINING_EXAMPLES.parent.glob("*.yaml"), *RETRAINING_EXAMPLES.glob("*.yaml")]
    names = [yaml.safe_load(path.read_text())["metadata"]["name"] for path in paths]
    assert len(paths) >= 6 and len(set(names)) == len(names), sorted(names)


def test_documented_templates_cover_each_kind() -> None:
    kinds = {example(p.name).spec.retraining.template["kind"] for p in RETRAINING_EXAMPLES.glob("*.yaml")}  # type: ignore[index]
    assert {"Job", "JobSet", "TrainJob"} <= kinds


# ---------------------------------------------------------------- completion


def job(
    kind: str = "Job",
    condition: str | None = None,
    *,
    annotations: dict[str, str] | None = None,
    **status: Any,
) -> dict[str, Any]:
    api_version = {
        "Job": "batch/v1",
        "JobSet": "jobset.x-k8s.io/v1alpha2",
        "TrainJob": "trainer.kubeflow.org/v1alpha1",
        "PyTorchJob": "kubeflow.org/v1",
    }[kind]
    conditions = [{"type": condition, "status": "True", **status}] if condition else []
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {
            "name": "j",
            "annotations": {"specops.dev/output-version": "v3-rt1-2026-10-01", **(annotations or {})},
        },
        "status": {"conditions": [{"type": "Suspended", "status": "False"}, *conditions]},
    }


def pod(name: str, exit_code: int | None, message: str = "", container: str = "trainer") -> dict[str, Any]:
    state: dict[str, Any] = (
        {"running": {}} if exit_code is None else {"terminated": {"exitCode": exit_code, "message": message}}
    )
    return {
        "metadata": {"name": name},
        "status": {"containerStatuses": [{"name": container, "state": state}]},
    }


RESULT = json.dumps(
    {
        "draftVersion": "v3-rt1-2026-10-01",
        "checkpointUri": "pvc://engines/d/v3-rt1",
        "metrics": {"alpha": 0.81},
    }
)
SUCCEEDED = Succeeded("v3-rt1-2026-10-01", "pvc://engines/d/v3-rt1", {"alpha": 0.81})
DONE = {"Job": "Complete", "JobSet": "Completed", "TrainJob": "Complete", "PyTorchJob": "Succeeded"}


@pytest.mark.parametrize("kind", list(DONE))
def test_each_kind_reads_running_succeeded_and_failed(kind: str) -> None:
    assert rt.training_outcome(job(kind), [pod("p0", None)]) == Running()
    assert rt.training_outcome(job(kind, DONE[kind]), [pod("p0", 0, RESULT)]) == SUCCEEDED
    failed = rt.training_outcome(
        job(
            kind,
            "Failed",
            reason="BackoffLimitExceeded",
            message="Job has reached the specified backoff limit",
        ),
        [pod("p0", 1, "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory")],
    )
    assert isinstance(failed, Failed)
    assert "backoff limit" in failed.message and "CUDA out of memory" in failed.message


def test_completion_condition_of_another_kind_does_not_count() -> None:
    assert rt.training_outcome(job("JobSet", "Complete"), [pod("p0", 0, RESULT)]) == Running()


def test_suspended_job_is_running() -> None:
    suspended = job()
    suspended["status"]["conditions"] = [{"type": "Suspended", "status": "True"}]
    assert rt.training_outcome(suspended, []) == Running("suspended")


def test_result_from_the_job_annotation() -> None:
    assert (
        rt.training_outcome(job("JobSet", "Completed", annotations={"specops.dev/result": RESULT}), [])
        == SUCCEEDED
    )


def test_multi_node_result_from_rank_zero_only() -> None:
    pods = [pod("j-node-0-1", 0, ""), pod("j-node-0-0", 0, RESULT), pod("j-node-0-2", 0, "")]
    assert rt.training_outcome(job("JobSet", "Completed"), pods) == SUCCEEDED


def test_same_result_from_every_rank_is_fine() -> None:
    assert (
        rt.training_outcome(job("Job", "Complete"), [pod("a", 0, RESULT), pod("b", 0, RESULT)]) == SUCCEEDED
    )


def test_a_failed_attempt_before_the_successful_one_is_ignored() -> None:
    pods = [pod("a", 137, "OOMKilled"), pod("b", 0, RESULT)]
    assert rt.training_outcome(job("Job", "Complete"), pods) == SUCCEEDED


BAD_RESULTS: list[tuple[str, list[dict[str, Any]], str]] = [
    ("no result at all", [pod("a", 0, "")], "published no result"),
    ("not JSON", [pod("a", 0, "done!")], "not JSON"),
    ("a JSON list", [pod("a", 0, "[1]")], "not a JSON object"),
    (
        "bad version",
        [pod("a", 0, json.dumps({"draftVersion": "-x", "checkpointUri": "pvc://e/d"}))],
        "not a valid draft version",
    ),
    (
        "another version than asked",
        [pod("a", 0, json.dumps({"draftVersion": "v9", "checkpointUri": "pvc://e/d"}))],
        "differs from SPECOPS_OUTPUT_VERSION",
    ),
    (
        "bad engine uri",
        [pod("a", 0, json.dumps({"draftVersion": "v3-rt1-2026-10-01", "checkpointUri": "/mnt/d"}))],
        "checkpointUri",
    ),
    (
        "metrics not numbers",
        [
            pod(
                "a",
                0,
                json.dumps(
                    {
                        "draftVersion": "v3-rt1-2026-10-01",
                        "checkpointUri": "pvc://e/d",
                        "metrics": {"a": "high"},
                    }
                ),
            )
        ],
        "metrics",
    ),
    (
        "ranks disagree",
        [
            pod("a", 0, RESULT),
            pod(
                "b",
                0,
                json.dumps({"draftVersion": "v3-rt1-2026-10-01", "checkpointUri": "pvc://engines/other"}),
            ),
        ],
        "publish from one rank only",
    ),
]


@pytest.mark.parametrize(("pods", "expected"), [c[1:] for c in BAD_RESULTS], ids=[c[0] for c in BAD_RESULTS])
def test_completed_without_a_valid_result_is_a_failure(pods: list[dict[str, Any]], expected: str) -> None:
    outcome = rt.training_outcome(job("Job", "Complete"), pods)
    assert isinstance(outcome, Failed)
    assert expected in outcome.message


def test_invalid_annotation_result_is_a_failure() -> None:
    outcome = rt.training_outcome(
        job("TrainJob", "Complete", annotations={"specops.dev/result": "{}"}), [pod("a", 0, RESULT)]
    )
    assert isinstance(outcome, Failed) and "annotation specops.dev/result" in outcome.message


def test_a_job_of_unknown_kind_is_a_failure() -> None:
    outcome = rt.training_outcome({"apiVersion": "apps/v1", "kind": "Deployment"}, [])
    assert isinstance(outcome, Failed)


def test_rendered_job_and_trainer_result_close_the_round() -> None:
    res = resource()
    decided = rt.retraining_trigger(res.spec, stale_state(), now=NOW)
    assert decided is not None
    manifest = rt.render_training_job(res, decided)
    finished = {**manifest, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    result = json.dumps({"draftVersion": decided.output_version, "checkpointUri": "pvc://engines/d/new"})
    assert rt.training_outcome(finished, [pod("p", 0, result)]) == Succeeded(
        decided.output_version, "pvc://engines/d/new"
    )


TRAINER_SECRETS = {
    "bearer": "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0cmFpbmVyIn0.c2lnbmF0dXJlLXNlY3JldA",
    "hf": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "password": "password=Tr0ub4dor&3",
    "token": "token=9f8e7d6c5b4a39281706",
}


@pytest.mark.parametrize("kind", list(TRAINER_SECRETS))
def test_a_trainer_log_tail_reaches_status_and_the_event_without_its_secrets(kind: str) -> None:
    secret_line = TRAINER_SECRETS[kind]
    secret = secret_line.split("=", 1)[-1].split()[-1]
    failed = rt.training_outcome(
        job("Job", "Failed", reason="BackoffLimitExceeded", message="Job has reached the backoff limit"),
        [pod("p0", 1, f"connecting to the hub\n{secret_line}\nRuntimeError: 401 Unauthorized")],
    )
    assert isinstance(failed, Failed)
    assert "401 Unauthorized" in failed.message  # the useful part of the tail stays
    assert secret not in failed.message

    spec = resource().spec
    state = rt.finish_round(spec, stale_state(active=active_round(), rounds=1), failed, NOW)
    shown = json.dumps(
        [state.last_message, [c.message for c in rt.retraining_conditions(spec, state, NOW)]], default=str
    )
    assert secret not in shown and "***" in shown


def test_a_result_the_trainer_mangled_is_reported_without_its_secrets() -> None:
    mangled = json.dumps(
        {"draftVersion": "v3-rt1-2026-10-01", "checkpointUri": "https://trainer:hunter2-pw@store.local/d/v3"}
    )
    outcome = rt.training_outcome(job("Job", "Complete"), [pod("a", 0, mangled)])
    assert isinstance(outcome, Failed)
    assert "is not a pvc://" in outcome.message and "trainer:***@store.local" in outcome.message
    assert "hunter2-pw" not in outcome.message


# ---------------------------------------------------------------- after a rollback: the serving draft


class RecordingKube:
    """Records what the retraining service creates (the only call a round's start makes)."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.created.append(manifest)
        return manifest


async def test_after_a_rollback_retraining_speaks_of_and_trains_from_the_serving_draft() -> None:
    from specops.api.status import DraftStatus, SpeculativeDeploymentStatus
    from specops.services.retraining import RetrainingService

    # Given spec.draft names v4, which a canary rolled back, while v3 serves; the target moved on
    data = body()
    data["spec"]["draft"].update(version="v4", uri="pvc://models/llama-70b-draft/v4")
    rejected = SpeculativeDeployment.model_validate(data)
    status = SpeculativeDeploymentStatus(
        draft=DraftStatus(
            model="llama-3.1-8b-draft", version="v3", parameters="7B", uri="pvc://models/llama-70b-draft/v3"
        ),
        rejected_draft="v4@pvc://models/llama-70b-draft/v4",
        retraining=RetrainingStatus(draft_target_version="2026-09-01"),
    )
    kube = RecordingKube()
    result = await RetrainingService(kube).tick(rejected, status, NOW)  # type: ignore[arg-type]
    # Then DraftStale, the round's output and its Job name draft v3, never the rejected v4
    [stale] = [u for u in result.updates if u.type == "DraftStale"]
    assert stale.message.startswith("draft v3 was trained for target version 2026-09-01")
    [job] = kube.created
    assert env_of(_pod_templates(job)[0]["spec"]["containers"][0])["SPECOPS_DRAFT_VERSION"] == "v3"
    assert result.retraining.active is not None and result.retraining.active.output_version.startswith(
        "v3-rt1"
    )
    assert "v4" not in json.dumps(job)
