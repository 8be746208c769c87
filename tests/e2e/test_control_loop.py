"""The speculation control loop, end to end: emulated API server, Debian's Prometheus scraping
simulated Triton pods every second, and the real operator deciding and actuating.

Each test brings one resource to the Dynamic phase (baseline 3 s, soak 3 s, 1 s decisions),
then changes what the pods serve and watches what the operator does to them.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from specops.adapters import operator_metrics
from specops.adapters.kube import KubeClient
from specops.api.models import API_VERSION, KIND
from specops_local.prometheus import PrometheusProcess
from specops_local.serving import ServingController
from specops_local.sim import LoadPoint
from tests.e2e.conftest import NAMESPACE, Operator, example
from tests.e2e.waiting import condition, events_for, eventually, resource, wait_condition

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only]

NAME = "llama-70b-chat"
LOW = LoadPoint(batch=16, alpha=0.8)
HIGH = LoadPoint(batch=400, alpha=0.8)  # far past break-even (~251 for 70B/7B on H100 at alpha 0.8)


@pytest.fixture
def serving_load() -> LoadPoint:
    return LOW


def fast_resource(prometheus: PrometheusProcess, replicas: int = 2, **spec: Any) -> dict[str, Any]:
    body = example(**spec)
    body["spec"]["serving"]["replicas"] = replicas
    body["spec"]["metrics"] = {"prometheus": {"url": prometheus.url}, "interval": "1s"}
    body["spec"]["speculation"] = {
        "mode": "auto",
        "draftLength": {"initial": 4, "min": 1, "max": 8},
        "rollout": {"baseline": "3s", "soak": "3s"},
        "batchGuard": {"minDwell": "2s"},
        # decisions from the calibrated model, without probes: these tests watch the decision
        # itself (tests/e2e/test_closed_loop.py covers probing)
        "exploration": {"maxProbeFraction": 0},
        **spec.get("speculation", {}),
    }
    return body


async def in_dynamic(kube: KubeClient) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        body = await resource(kube, NAME)
        speculation = (body or {}).get("status", {}).get("speculation", {})
        return body if speculation.get("controlPhase") == "Dynamic" else None

    return await eventually(probe, timeout_s=45, interval_s=0.25, what="control phase Dynamic")


def pod_lengths(serving: ServingController) -> list[int]:
    return [pod.draft_length for pod in serving.all_pods()]


async def pods_up(serving: ServingController, count: int, timeout_s: float) -> None:
    async def counted() -> bool:
        return len(serving.all_pods()) == count

    await eventually(counted, timeout_s=timeout_s, what=f"{count} pods")


async def all_pods_at(serving: ServingController, predicate: Any, timeout_s: float, what: str) -> list[int]:
    async def probe() -> list[int] | None:
        lengths = pod_lengths(serving)
        return lengths if lengths and all(predicate(n) for n in lengths) else None

    return await eventually(probe, timeout_s=timeout_s, interval_s=0.1, what=what)


async def test_speculation_follows_load_through_break_even_without_flapping(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    # Given a resource past its baseline and soak, speculating at low load
    await kube.create(fast_resource(prometheus))
    body = await in_dynamic(kube)
    assert body["status"]["baseline"]["samples"] > 0 and body["status"]["baseline"]["perTokenLatencyP50"]
    await all_pods_at(serving, lambda n: n > 0, 20, "speculation on at low load")

    # When the load rises far past break-even, then every pod stops speculating
    serving.set_load(HIGH)
    await all_pods_at(serving, lambda n: n == 0, 20, "speculation off at high load")

    async def decided_off() -> dict[str, Any] | None:  # pods are set before the tick's status write
        found = await resource(kube, NAME)
        return found if found and found["status"]["speculation"]["state"] == "off" else None

    body = await eventually(decided_off, timeout_s=5, interval_s=0.1, what="status off")
    assert body["status"]["speculation"]["pods"] == {"desired": 2, "applied": 2}

    # When the load falls again, then speculation comes back on every pod
    serving.set_load(LOW)
    await all_pods_at(serving, lambda n: n > 0, 30, "speculation back on at low load")

    # And it stays on: no flapping while the load holds
    loads_before = [pod.bls_loads for pod in serving.all_pods()]
    toggles_seen: list[list[int]] = []
    for _ in range(20):
        await asyncio.sleep(0.25)
        toggles_seen.append(pod_lengths(serving))
    assert all(all(n > 0 for n in lengths) for lengths in toggles_seen)
    on_off_events = [
        e
        for e in await events_for(kube, NAME)
        if e["reason"] in ("SpeculationDisabledHighBatch", "SpeculationEnabledLowBatch")
    ]
    assert len(on_off_events) <= 2, on_off_events
    assert [pod.bls_loads for pod in serving.all_pods()] >= loads_before
    body = await resource(kube, NAME)
    assert body["status"]["speculation"]["predictedSpeedup"] > 1.0


async def test_draft_length_follows_acceptance_up_and_never_back_on_the_way(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    # Given low acceptance: the best length is short (2 at alpha 0.5, batch 16; 3 models within
    # the length margin of it)
    serving.set_load(LoadPoint(batch=16, alpha=0.5))
    await kube.create(fast_resource(prometheus, replicas=1))
    await in_dynamic(kube)
    await all_pods_at(serving, lambda n: 0 < n <= 3, 30, "short drafts at low acceptance")

    # When acceptance drifts up to 0.9 (best length 8), then the length climbs: straight to the
    # modelled best for a clear gain, one confirmed step for a small one, never back on the way
    serving.set_load(LoadPoint(batch=16, alpha=0.9))
    seen: list[int] = []

    async def climbed() -> bool:
        length = pod_lengths(serving)[0]
        if not seen or seen[-1] != length:
            seen.append(length)
        return length >= 7

    # each change waits until the current length is measured (one rate window): ~12 s a change here
    await eventually(climbed, timeout_s=90, interval_s=0.05, what="draft length follows acceptance")
    steps = [b - a for a, b in itertools.pairwise(seen)]
    assert steps and all(step > 0 for step in steps), seen
    body = await resource(kube, NAME)
    assert body["status"]["speculation"]["reason"] in ("DraftLengthIncreased", "BestModelledSpeedup")
    assert body["status"]["observed"]["alpha"] > 0.8


async def test_prometheus_outage_holds_the_decision_and_recovers(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    # Given a speculating resource
    await kube.create(fast_resource(prometheus))
    await in_dynamic(kube)
    lengths = await all_pods_at(serving, lambda n: n > 0, 20, "speculation on")

    # When Prometheus goes away and the load rises meanwhile
    await prometheus.stop()
    serving.set_load(HIGH)

    # Then MetricsUnavailable is raised and nothing changes on the pods: no decision without data
    body = await wait_condition(kube, NAME, "MetricsUnavailable", "True", timeout_s=20)
    assert "holding num_draft_tokens" in condition(body, "MetricsUnavailable")["message"]
    await asyncio.sleep(3)
    assert pod_lengths(serving) == lengths
    assert any(
        e["reason"] == condition(body, "MetricsUnavailable")["reason"] for e in await events_for(kube, NAME)
    )

    # When it returns, then the condition clears and the loop acts on the (high) load again
    await prometheus.start()
    await wait_condition(kube, NAME, "MetricsUnavailable", "False", timeout_s=30)
    await all_pods_at(serving, lambda n: n == 0, 30, "speculation off after recovery at high load")


async def test_a_pod_down_does_not_block_the_others_and_status_shows_partial(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    # Given three speculating pods
    await kube.create(fast_resource(prometheus, replicas=3))
    await in_dynamic(kube)
    await all_pods_at(serving, lambda n: n > 0, 20, "speculation on")

    # When one pod stops answering (still listed Ready) and the load rises past break-even
    broken = serving.all_pods()[0]
    await broken.stop()
    serving.set_load(HIGH)

    # Then the other pods are switched off anyway
    async def others_off() -> bool:
        return all(pod.draft_length == 0 for pod in serving.all_pods()[1:])

    await eventually(others_off, timeout_s=30, what="healthy pods switched off")
    # And status shows the partial application with the failing pod named
    body = await wait_condition(kube, NAME, "SpeculationApplied", "False", "PartiallyApplied", timeout_s=20)
    assert body["status"]["speculation"]["pods"] == {"desired": 3, "applied": 2}
    assert broken.name in condition(body, "SpeculationApplied")["message"]

    # When the pod comes back, then it catches up and the condition clears
    await broken.start()
    await all_pods_at(serving, lambda n: n == 0, 20, "recovered pod switched off too")
    await wait_condition(kube, NAME, "SpeculationApplied", "True", timeout_s=20)


async def test_ticks_read_serving_pods_from_the_watch_and_a_new_pod_gets_the_setting(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    # Given two speculating pods, ticking every second
    await kube.create(fast_resource(prometheus, replicas=2))
    await in_dynamic(kube)
    await all_pods_at(serving, lambda n: n > 0, 20, "speculation on")

    # When five intervals pass
    seen = len(cluster.emulator.requests)
    await asyncio.sleep(5)

    # Then no tick listed pods: they come from the operator's pod watch (its index)
    pod_lists = [
        r
        for r in cluster.emulator.requests[seen:]
        if r.action == "LIST" and r.resource and r.resource.plural == "pods"
    ]
    assert pod_lists == [], [str(r.url) for r in pod_lists]

    # And a pod added later is seen by the next ticks and given the decided setting
    await kube.patch(API_VERSION, KIND, NAMESPACE, NAME, {"spec": {"serving": {"replicas": 3}}})

    await pods_up(serving, 3, timeout_s=20)
    await all_pods_at(serving, lambda n: n > 0, 20, "speculation on in the new pod too")


async def test_a_resource_at_rest_is_looked_at_by_the_rest_pass_and_a_load_surge_still_switches_at_once(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a resource speculating at low load with the rest budget of a large fleet (20 rests in a
    # row at 1 s intervals), so that its daemon hands it to the operator's shared rest pass
    from specops.services import tick as tick_module

    monkeypatch.setattr(tick_module, "SETTLED_DECISIONS_PER_S", 1 / 20)
    await kube.create(fast_resource(prometheus))
    await in_dynamic(kube)
    await all_pods_at(serving, lambda n: n > 0, 20, "speculation on at low load")
    assert operator.run is not None
    rests = operator.run.memo.services.rests

    async def held_and_looked_at() -> int | None:
        return rests.looks if rests.looks >= 3 and rests.holding == 1 else None

    await eventually(
        held_and_looked_at,
        timeout_s=30,
        interval_s=0.05,
        what="the rest pass holding and looking at the resource",
    )
    ended_before = rests.ended  # the daemon waits on its hold: only a look can end it
    counted_before = _rests_ended_counted()

    # When the load rises far past break-even
    serving.set_load(HIGH)

    # Then a look ends the rest and the woken daemon switches every pod off, as fast as a tick would
    # have (the 20-rest budget would otherwise hold it for 20 s)
    await all_pods_at(serving, lambda n: n == 0, 12, "speculation off at high load")
    assert rests.ended > ended_before
    # and the operator's metrics say why each rest ended (what sends resources to full ticks)
    counted = _rests_ended_counted()
    new = {why: counted[why] - counted_before.get(why, 0.0) for why in counted}
    assert sum(new.values()) == rests.ended - ended_before, new
    assert set(new) <= set(tick_module.REST_ENDS), new


def _rests_ended_counted() -> dict[str, float]:
    """The operator's ``specops_rests_ended_total`` by why."""
    return {
        sample.labels["why"]: sample.value
        for family in operator_metrics.METRICS.rests_ended.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


@pytest.mark.parametrize("at_rest", [True, False], ids=["at-rest", "ticking"])
async def test_a_new_pod_gets_the_setting_at_once_not_at_the_next_interval(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    monkeypatch: pytest.MonkeyPatch,
    at_rest: bool,
) -> None:
    # Given two speculating pods whose resource then ticks every 30 s: at rest in the rest pass
    # (a large fleet's budget), or sleeping in its daemon between full ticks
    from specops.services import tick as tick_module

    monkeypatch.setattr(tick_module, "SETTLED_DECISIONS_PER_S", 1 / 20 if at_rest else 100.0)
    await kube.create(fast_resource(prometheus, replicas=2))
    await in_dynamic(kube)
    await all_pods_at(serving, lambda n: n > 0, 20, "speculation on")
    await kube.patch(API_VERSION, KIND, NAMESPACE, NAME, {"spec": {"metrics": {"interval": "30s"}}})
    assert operator.run is not None
    services = operator.run.memo.services
    await asyncio.sleep(3)  # the spec change ends any rest at its next look: one tick reads 30 s

    # When a third pod comes up (it boots with speculation off)
    await kube.patch(API_VERSION, KIND, NAMESPACE, NAME, {"spec": {"serving": {"replicas": 3}}})

    await pods_up(serving, 3, timeout_s=10)

    # Then it speculates within seconds, not at the next tick 30 s away: its resource was woken
    await all_pods_at(serving, lambda n: n > 0, 8, "speculation on in the new pod at once")
    assert services.wakeups.woken >= 1
