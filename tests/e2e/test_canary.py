"""Draft canaries, end to end: a new draft reaches users only through a measured canary.

The simulated engines give each draft version its own acceptance (and can serve a broken,
non-lossless draft whose greedy outputs part from the target's); Debian's Prometheus scrapes
them; the real operator runs the lossless gate through the engines' own completions / generate
API (a canary engine speculating with the new draft against a stable one), moves real Gateway
API weights, analyses, and promotes or rolls back.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specops.adapters.kube import KubeClient
from specops.api.models import API_VERSION, KIND
from specops_local.prometheus import PrometheusProcess
from specops_local.serving import DraftBehaviour, ServingController
from specops_local.sim import LoadPoint
from tests.e2e.conftest import NAMESPACE, Operator, example
from tests.e2e.waiting import condition, events_for, eventually, resource, wait_condition

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only]

NAME = "llama-70b-chat"
ROUTE = "chat"
STABLE_SERVICE = f"{NAME}-stable"
CANARY_SERVICE = f"{NAME}-canary"
DRAFTS = {
    "v3": DraftBehaviour(alpha=0.75),
    "v4": DraftBehaviour(alpha=0.88),  # better
    "v5": DraftBehaviour(alpha=0.55),  # worse
    "v6": DraftBehaviour(alpha=0.90, lossless=False),  # fast but wrong
}


@pytest.fixture
def serving_load() -> LoadPoint:
    return LoadPoint(batch=16, alpha=0.75)


@pytest.fixture
def draft_behaviours() -> dict[str, DraftBehaviour]:
    return DRAFTS


# The HTTPRoute CRD defaults group and kind (specops_local/upstream_crds.py registers the real one)
STABLE_BACKEND_AT_100 = {"group": "", "kind": "Service", "name": STABLE_SERVICE, "port": 8000, "weight": 100}


@pytest.fixture
def route(cluster: Any) -> dict[str, Any]:
    return create_route(cluster)


def create_route(cluster: Any) -> dict[str, Any]:
    """The user's HTTPRoute: their Gateway, one rule sending everything to the stable variant."""
    return cluster.create(
        "httproutes",
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": ROUTE, "namespace": NAMESPACE},
            "spec": {
                "parentRefs": [{"name": "inference-gateway"}],
                "rules": [
                    {
                        "matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}],
                        "backendRefs": [{"name": STABLE_SERVICE, "port": 8000}],
                    }
                ],
            },
        },
    )


def canary_resource(prometheus: PrometheusProcess, **canary: Any) -> dict[str, Any]:
    body = example()
    body["spec"]["serving"]["replicas"] = 2
    body["spec"]["metrics"] = {"prometheus": {"url": prometheus.url}, "interval": "1s"}
    body["spec"]["speculation"] = {
        "rollout": {"baseline": "2s", "soak": "2s"},
        "reconfigure": {"minInterval": "2s"},
    }
    body["spec"]["canary"] = {
        "steps": [{"weight": 25, "pause": "8s"}, {"weight": 100, "pause": "1s"}],
        "trafficRouting": {"gatewayAPI": {"httpRoute": ROUTE}},
        "analysis": {"failureLimit": 0, "inconclusiveLimit": 4},
        "goldenPrompts": {"prompts": ["What is 2 + 2?", "Name a colour."], "maxTokens": 16},
        **canary,
    }
    return body


async def serving_ready(kube: KubeClient) -> None:
    """Until the stable pods serve a speculating revision (past the baseline, no rollout running):
    a canary is judged on acceptance against theirs."""

    async def probe() -> bool:
        status = ((await resource(kube, NAME)) or {}).get("status") or {}
        speculation = status.get("speculation") or {}
        return (
            status.get("phase") in ("Fixed", "Dynamic")
            and (speculation.get("revision") or {}).get("mode") == "spec"
            and not speculation.get("rollout")
        )

    await eventually(probe, timeout_s=40, what="stable pods speculating")


async def new_draft(kube: KubeClient, version: str) -> None:
    draft = {"version": version, "uri": f"pvc://models/llama-70b-draft/{version}"}
    await kube.patch(API_VERSION, KIND, NAMESPACE, NAME, {"spec": {"draft": draft}})


class RouteWatcher:
    """Records every canary weight the HTTPRoute carried."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.weights: list[int] = []
        self._task: asyncio.Task[None] | None = None

    async def _watch(self) -> None:
        while True:
            live = await self.kube.get("gateway.networking.k8s.io/v1", "HTTPRoute", NAMESPACE, ROUTE)
            refs = live["spec"]["rules"][0]["backendRefs"] if live else []
            weight = next((r.get("weight", 0) for r in refs if r["name"] == CANARY_SERVICE), 0)
            if not self.weights or self.weights[-1] != weight:
                self.weights.append(weight)
            await asyncio.sleep(0.1)

    async def __aenter__(self) -> RouteWatcher:
        self._task = asyncio.get_running_loop().create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def canary_deployments(kube: KubeClient) -> list[dict[str, Any]]:
    return await kube.list("apps/v1", "Deployment", NAMESPACE, {"specops.dev/variant": "canary"})


async def test_a_better_draft_is_promoted_through_real_route_weights(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    # Given a serving resource whose canaries use the user's HTTPRoute
    await kube.create(canary_resource(prometheus))
    await serving_ready(kube)

    # When the user publishes a better draft
    async with RouteWatcher(kube) as watcher:
        await new_draft(kube, "v4")

        # Then it passes the lossless gate, takes 25 % of the route, wins the analysis and is promoted
        body = await wait_condition(kube, NAME, "CanaryRollout", "False", "CanaryPromoted", timeout_s=90)
    assert body["status"]["draft"]["version"] == "v4"
    assert "v4 promoted" in condition(body, "CanaryRollout")["message"]
    assert [w for w in watcher.weights if w] == [25, 100], watcher.weights  # stepped, then all in to promote

    # And the stable variant now serves v4, the canary objects are gone, all traffic is stable again
    stable = cluster.get("deployments", NAME)
    assert stable["spec"]["template"]["metadata"]["labels"]["specops.dev/draft-version"] == "v4"
    assert await canary_deployments(kube) == []
    live = await kube.get("gateway.networking.k8s.io/v1", "HTTPRoute", NAMESPACE, ROUTE)
    assert live["spec"]["rules"][0]["backendRefs"] == [STABLE_BACKEND_AT_100]
    # the user's parts untouched (as defaulted by the CRD)
    assert live["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"}
    ]
    reasons = [e["reason"] for e in await events_for(kube, NAME)]
    for reason in ("CanaryStarted", "LosslessCheckPassed", "CanaryStepStarted", "CanaryPromoted"):
        assert reason in reasons


async def test_a_worse_draft_is_rolled_back_with_its_evidence(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    await kube.create(canary_resource(prometheus))
    await serving_ready(kube)

    await new_draft(kube, "v5")

    body = await wait_condition(kube, NAME, "CanaryRollout", "False", "CanaryRolledBack", timeout_s=90)
    message = condition(body, "CanaryRollout")["message"]
    assert "v5 rolled back" in message and "alpha" in message
    assert body["status"]["draft"]["version"] == "v3"
    assert body["status"]["rejectedDraft"].startswith("v5@")
    assert await canary_deployments(kube) == []
    live = await kube.get("gateway.networking.k8s.io/v1", "HTTPRoute", NAMESPACE, ROUTE)
    assert live["spec"]["rules"][0]["backendRefs"] == [STABLE_BACKEND_AT_100]
    # And the rejected draft is not retried while spec.draft still names it
    await asyncio.sleep(3)
    assert (await resource(kube, NAME))["status"].get("canary") is None
    assert any(
        e["reason"] == "CanaryRolledBack" and e["type"] == "Warning" for e in await events_for(kube, NAME)
    )


async def test_a_canary_right_after_a_promotion_is_not_judged_on_the_previous_drafts_series(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    # Given a better draft (v4, alpha 0.88) just promoted through a canary
    await kube.create(canary_resource(prometheus))
    await serving_ready(kube)
    await new_draft(kube, "v4")
    await wait_condition(kube, NAME, "CanaryRollout", "False", "CanaryPromoted", timeout_s=90)

    # When a worse draft (v5, alpha 0.55) is published at once, while v4's canary series are still
    # in the rate window
    await new_draft(kube, "v5")

    async def v5_ended() -> dict[str, Any] | None:
        body = await resource(kube, NAME)
        last = ((body or {}).get("status") or {}).get("lastCanary") or {}
        rollout = condition(body, "CanaryRollout") or {}
        ended = rollout.get("status") == "False" and "v5" in (rollout.get("message") or "")
        return body if ended or last.get("draft") == "v5" else None

    body = await eventually(v5_ended, timeout_s=90, what="the v5 canary to end")

    # Then v5 is rolled back on its own acceptance, and stable keeps serving v4
    rollout = condition(body, "CanaryRollout")
    assert rollout is not None and rollout["reason"] == "CanaryRolledBack", rollout
    assert body["status"]["draft"]["version"] == "v4"
    analysis_alpha = re.search(r"alpha canary ([0-9.]+)", rollout["message"])
    assert analysis_alpha is not None and float(analysis_alpha.group(1)) < 0.7, rollout["message"]


async def test_a_non_lossless_draft_is_refused_before_any_traffic(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    await kube.create(canary_resource(prometheus))
    await serving_ready(kube)

    async with RouteWatcher(kube) as watcher:
        await new_draft(kube, "v6")
        body = await wait_condition(kube, NAME, "CanaryRollout", "False", "CanaryRolledBack", timeout_s=60)

    assert "NotLossless" in condition(body, "CanaryRollout")["message"]
    assert body["status"]["lastCanary"]["reason"] == "NotLossless"
    assert set(watcher.weights) == {0}, watcher.weights  # the canary never received traffic
    assert "CanaryStepStarted" not in [e["reason"] for e in await events_for(kube, NAME)]


async def test_metrics_outage_pauses_judgement_and_a_restart_resumes_the_same_step(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    body = canary_resource(
        prometheus,
        steps=[{"weight": 25, "pause": "6s"}, {"weight": 50, "pause": "6s"}, {"weight": 100, "pause": "1s"}],
    )
    await kube.create(body)
    await serving_ready(kube)
    await wait_condition(kube, NAME, "MetricsUnavailable", "False", timeout_s=30)
    await new_draft(kube, "v4")

    async def in_step() -> dict[str, Any] | None:
        live = await resource(kube, NAME)
        canary = (live or {}).get("status", {}).get("canary") or {}
        return live if canary.get("phase") == "Progressing" else None

    await eventually(in_step, timeout_s=40, what="canary progressing")

    # When Prometheus goes away mid-canary, then judgement pauses: no rollback, no promotion
    await prometheus.stop()
    paused = await wait_condition(
        kube, NAME, "CanaryRollout", "True", "CanaryMetricsUnavailable", timeout_s=40
    )
    step = paused["status"]["canary"]["step"]
    await asyncio.sleep(4)
    live = await resource(kube, NAME)
    assert live["status"]["canary"]["step"] == step and live["status"]["draft"]["version"] == "v3"
    assert live["status"]["canary"]["lastAnalysis"]["verdict"] == "Error"

    # When the operator restarts meanwhile, then it resumes the same step (state lives in status)
    started = live["status"]["canary"]["stepStartedAt"]
    await operator.restart()
    live = await resource(kube, NAME)
    assert live["status"]["canary"]["step"] == step and live["status"]["canary"]["stepStartedAt"] == started

    # When Prometheus returns, then the canary goes on to promotion
    await prometheus.start()
    body = await wait_condition(kube, NAME, "CanaryRollout", "False", "CanaryPromoted", timeout_s=120)
    assert body["status"]["draft"]["version"] == "v4"


async def test_manual_gates_pause_then_promote_now(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    from specops.cli import set_canary_gate

    body = canary_resource(prometheus, steps=[{"weight": 10, "pause": "1h"}, {"weight": 100, "pause": "1s"}])
    await kube.create(body)
    await serving_ready(kube)
    await new_draft(kube, "v4")

    async def progressing() -> dict[str, Any] | None:
        live = await resource(kube, NAME)
        return (
            live
            if ((live or {}).get("status", {}).get("canary") or {}).get("phase") == "Progressing"
            else None
        )

    await eventually(progressing, timeout_s=40, what="canary progressing")

    # While the step bakes, status shows both variants' readings, when the step is judged and what
    # comes next, and stays small
    async def measured() -> dict[str, Any] | None:
        live = await resource(kube, NAME)
        window = ((live or {}).get("status", {}).get("canary") or {}).get("window") or {}
        counts = [(window.get(v) or {}).get("samples", 0) for v in ("stable", "canary")]
        return live if min(counts) >= 2 else None

    live = await eventually(measured, timeout_s=60, what="both variants measured in the step")
    canary = live["status"]["canary"]
    assert canary["nextWeight"] == 100
    assert datetime.fromisoformat(canary["judgeAt"]) > datetime.now(UTC) + timedelta(minutes=50)
    for variant in ("stable", "canary"):
        assert canary["window"][variant]["alpha"] > 0 and canary["window"][variant]["p99"].endswith("ms")
    assert len(json.dumps(canary)) < 3072  # summaries, no raw samples

    # When an operator pauses the canary from the CLI, then status says so and nothing moves
    assert await set_canary_gate("pause", NAME, NAMESPACE) == 0

    async def paused() -> bool:
        return bool(((await resource(kube, NAME))["status"].get("canary") or {}).get("paused"))

    await eventually(paused, timeout_s=10, what="canary paused")

    # When they promote it now (a one-hour bake notwithstanding), then it is promoted
    assert await set_canary_gate("promote", NAME, NAMESPACE) == 0
    body = await wait_condition(kube, NAME, "CanaryRollout", "False", "CanaryPromoted", timeout_s=60)
    assert body["status"]["draft"]["version"] == "v4"
    annotations = body["metadata"].get("annotations") or {}
    assert "specops.dev/canary-action" not in annotations and "specops.dev/canary-paused" not in annotations


async def test_manual_abort_rolls_back(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    from specops.cli import set_canary_gate

    await kube.create(
        canary_resource(prometheus, steps=[{"weight": 10, "pause": "1h"}, {"weight": 100, "pause": "1s"}])
    )
    await serving_ready(kube)
    assert await set_canary_gate("abort", NAME, NAMESPACE) == 1  # nothing to abort yet: a clear error
    await new_draft(kube, "v4")
    await eventually(lambda: _canary_phase(kube, "Progressing"), timeout_s=40, what="canary progressing")

    assert await set_canary_gate("abort", NAME, NAMESPACE) == 0

    body = await wait_condition(kube, NAME, "CanaryRollout", "False", "CanaryRolledBack", timeout_s=30)
    assert body["status"]["lastCanary"]["reason"] == "CanaryAborted"
    assert body["status"]["draft"]["version"] == "v3"
    assert await canary_deployments(kube) == []


async def test_a_spec_reverted_mid_canary_ends_the_canary_unpromoted_and_serves_the_stable_draft(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    # Given a canary of v4 taking traffic (its step would bake for an hour)
    await kube.create(
        canary_resource(prometheus, steps=[{"weight": 25, "pause": "1h"}, {"weight": 100, "pause": "1s"}])
    )
    await serving_ready(kube)
    async with RouteWatcher(kube) as watcher:
        await new_draft(kube, "v4")
        await eventually(lambda: _canary_phase(kube, "Progressing"), timeout_s=40, what="canary progressing")

        # When the edit is reverted (git revert, then a sync): spec.draft names v3 again
        await new_draft(kube, "v3")

        # Then the canary ends there, unpromoted, and status says why
        body = await wait_condition(kube, NAME, "CanaryRollout", "False", "CanarySuperseded", timeout_s=20)
    status = body["status"]
    message = condition(body, "CanaryRollout")["message"]
    assert "canary of draft v4" in message and "stable draft v3" in message, message
    assert status["lastCanary"]["result"] == "Superseded" and status["lastCanary"]["draft"] == "v4"
    assert "rejectedDraft" not in status  # v3 may be canaried again later; so may v4
    assert status["draft"]["version"] == "v3" and status["observedSpecDraft"].startswith("v3@")
    assert [w for w in watcher.weights if w] == [25], watcher.weights  # never all in, never promoted
    # The pods serve v3: the stable variant never rolled, the canary is gone, the route is all stable
    stable = cluster.get("deployments", NAME)
    assert stable["spec"]["template"]["metadata"]["labels"]["specops.dev/draft-version"] == "v3"
    assert await canary_deployments(kube) == []
    live = await kube.get("gateway.networking.k8s.io/v1", "HTTPRoute", NAMESPACE, ROUTE)
    assert live["spec"]["rules"][0]["backendRefs"] == [STABLE_BACKEND_AT_100]
    events = await events_for(kube, NAME)
    assert [e["type"] for e in events if e["reason"] == "CanarySuperseded"] == ["Normal"]
    assert not {"CanaryPromoted", "CanaryRolledBack"} & {e["reason"] for e in events}
    # And no canary of v3 against itself follows
    await asyncio.sleep(2)
    assert (await resource(kube, NAME))["status"].get("canary") is None


async def _canary_phase(kube: KubeClient, phase: str) -> bool:
    live = await resource(kube, NAME)
    return ((live or {}).get("status", {}).get("canary") or {}).get("phase") == phase


async def test_deleting_mid_canary_takes_the_canary_out_of_the_users_route(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    await kube.create(
        canary_resource(prometheus, steps=[{"weight": 10, "pause": "1h"}, {"weight": 100, "pause": "1s"}])
    )
    await serving_ready(kube)
    await new_draft(kube, "v4")
    await eventually(lambda: _canary_phase(kube, "Progressing"), timeout_s=40, what="canary progressing")

    await kube.delete(API_VERSION, KIND, NAMESPACE, NAME)

    async def released() -> bool:
        live = await kube.get("gateway.networking.k8s.io/v1", "HTTPRoute", NAMESPACE, ROUTE)
        names = [ref["name"] for ref in live["spec"]["rules"][0]["backendRefs"]]
        return await resource(kube, NAME) is None and CANARY_SERVICE not in names

    await eventually(released, timeout_s=20, what="resource gone and canary backend removed from the route")


async def test_a_resource_recreated_mid_canary_checks_its_first_draft_before_speculating(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    route: dict[str, Any],
) -> None:
    from tests.e2e.test_control_loop import all_pods_at, pod_lengths

    # Given a resource deleted while a canary runs
    slow = [{"weight": 10, "pause": "1h"}, {"weight": 100, "pause": "1s"}]
    await kube.create(canary_resource(prometheus, steps=slow))
    await serving_ready(kube)
    await new_draft(kube, "v4")
    await eventually(lambda: _canary_phase(kube, "Progressing"), timeout_s=40, what="canary progressing")
    await kube.delete(API_VERSION, KIND, NAMESPACE, NAME)
    await eventually(lambda: _gone(kube), timeout_s=20, what="resource gone")

    # When it is created again at once, naming a draft that breaks greedy output (v6)
    body = canary_resource(prometheus, steps=slow)
    body["spec"]["draft"]["version"] = "v6"
    body["spec"]["draft"]["uri"] = "pvc://models/llama-70b-draft/v6"
    await kube.create(body)

    # Then its first draft is checked (a check pod speculating with it against a plain stable
    # pod, through the engines' API), fails, and the stable pods stay plain
    failed = await wait_condition(kube, NAME, "CanaryRollout", "False", "NotLossless", timeout_s=40)
    assert failed["status"]["draft"]["version"] == "v6"
    assert failed["status"]["draft"]["losslessCheck"] == "Failed"
    for _ in range(30):  # past the 2 s baseline and soak that would otherwise switch it on
        assert set(pod_lengths(serving)) <= {0}, pod_lengths(serving)
        await asyncio.sleep(0.2)
    live = await resource(kube, NAME)
    assert live is not None and live["status"]["speculation"]["reason"] == "SpeculationHeld"
    assert live["status"]["speculation"]["revision"]["mode"] == "plain"

    # And a lossless draft published next replaces it on the stable pods, is checked, then speculates
    await new_draft(kube, "v4")
    await wait_condition(kube, NAME, "CanaryRollout", "False", "DraftReplaced", timeout_s=20)

    async def checked() -> dict[str, Any] | None:
        live = await resource(kube, NAME)
        draft = ((live or {}).get("status") or {}).get("draft") or {}
        return live if draft.get("version") == "v4" and draft.get("losslessCheck") == "Passed" else None

    await eventually(checked, timeout_s=40, what="v4 checked on the stable pods")
    await all_pods_at(serving, lambda n: n > 0, 40, "speculating once the draft passed its check")
    stable = cluster.get("deployments", NAME)
    assert stable["spec"]["template"]["metadata"]["labels"]["specops.dev/draft-version"] == "v4"


async def _gone(kube: KubeClient) -> bool:
    return await resource(kube, NAME) is None
