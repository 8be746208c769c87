"""Split-fleet A/B, the measured-slowdown guard and a profile prior, end to end, in a world the
roofline gets wrong.

Real operator, emulated API server, Debian's Prometheus scraping simulated Triton pods every
second; the pods serve a profile that breaks even near batch 24 while the operator's roofline
prior says ~250 (tests/e2e/test_closed_loop.py builds it). Time is compressed as there.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from specops.adapters.kube import KubeClient
from specops.domain.profile import ServingProfile
from specops_local.prometheus import PrometheusProcess
from specops_local.serving import ServingController
from specops_local.sim import LoadPoint
from tests.e2e.conftest import Operator
from tests.e2e.test_closed_loop import (
    ALPHA,
    HIGH,
    NAME,
    calibration,
    decided_off,
    fast_resource,
    in_dynamic,
    operator_env,  # noqa: F401  (the compressed-time fixture)
    pod_lengths,
    serving,  # noqa: F401
    serving_load,  # noqa: F401
    story,
    world,  # noqa: F401
)
from tests.e2e.waiting import condition, events_for, eventually, resource

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only]


async def events_named(kube: KubeClient, reason: str) -> list[dict[str, Any]]:
    """The Events with this reason, once one is there (Events land just after the status write)."""

    async def probe() -> list[dict[str, Any]] | None:
        found = [e for e in await events_for(kube, NAME) if e["reason"] == reason]
        return found or None

    try:
        return await eventually(probe, timeout_s=5, interval_s=0.2, what=f"an Event {reason}")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{await story(kube)}") from None


# Light enough that this world's extra verification cost (per draft token per sequence) hides in
# the noise of a low-batch sample: at batch 8 the fit sometimes learned the break-even from the soak
# alone and switched speculation off by itself before the split could measure.
QUIET = LoadPoint(batch=2, alpha=ALPHA)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("serving_load", [QUIET])
async def test_two_pods_run_a_split_ab_and_its_measured_slowdown_switches_speculation_off(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,  # noqa: F811
    prometheus: PrometheusProcess,
) -> None:
    loop = asyncio.get_running_loop()
    # Given two pods speculating at low load, where speculation pays in this world too
    await kube.create(fast_resource(prometheus, replicas=2, soak="8s"))
    await in_dynamic(kube)

    async def both_on() -> list[int] | None:
        lengths = pod_lengths(serving)
        return lengths if len(lengths) == 2 and all(lengths) else None

    await eventually(both_on, timeout_s=30, interval_s=0.1, what="two pods speculating at low load")

    # When the load rises past the world's break-even (the roofline still promises a gain there)
    serving.set_load(HIGH)
    raised = loop.time()

    # Then the operator runs a split-fleet A/B: the two pods at different settings at the same moment
    seen_split: list[tuple[float, list[int], dict[str, Any]]] = []

    async def split_seen() -> bool:
        lengths = pod_lengths(serving)
        found = await calibration(kube)
        if len(lengths) == 2 and (lengths[0] == 0) != (lengths[1] == 0) and found.get("probeKind") == "split":
            seen_split.append((loop.time() - raised, lengths, found))
            return True
        return False

    try:
        await eventually(split_seen, timeout_s=40, interval_s=0.1, what="a split-fleet A/B")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{await story(kube)}") from None
    at_s, lengths, shown = seen_split[0]
    assert len(shown["probePods"]) == 1 and shown["probeShare"] == 0.5, shown

    # And its measured slowdown is what switches speculation off, the Event naming the evidence
    await decided_off(kube, serving, 40, "speculation off after the split")
    off_after_s = loop.time() - raised
    split_off = await events_named(kube, "SpeculationOffSplitSlowdown")
    events = await events_for(kube, NAME)
    assert split_off[0]["type"] == "Warning"
    message = split_off[0]["message"]
    assert "split-fleet A/B" in message and "ms per token" in message and "measured speedup" in message, (
        message
    )
    body = await resource(kube, NAME)
    assert body is not None
    speculation = body["status"]["speculation"]
    last = speculation["calibration"]["lastSplit"]
    assert last["acted"] is True and last["measuredSpeedup"] < 0.97, last
    assert last["onPods"] and last["offPods"] and set(last["onPods"]).isdisjoint(last["offPods"]), last
    # the split's cost is the probe pod's share of the fleet's token throughput, within the budget
    ledger = speculation["calibration"]["ledger"]
    assert ledger["probeSeconds"] <= 0.02 * max(ledger["elapsedSeconds"], 3600) + 30, ledger
    reasons = [e["reason"] for e in events]
    print(
        f"split {at_s:.1f} s after the load rose (pods at {lengths}); off {off_after_s:.1f} s after it rose: "
        f"measured speedup {last['measuredSpeedup']} at batch {last['batch']} from {last['comparisons']} "
        f"comparisons; probe seconds {ledger['probeSeconds']} of {ledger['elapsedSeconds']}; reasons {reasons}"
    )


@pytest.mark.parametrize("serving_load", [HIGH])
@pytest.mark.timeout(120)
async def test_where_the_prior_promises_a_gain_the_measured_slowdown_guard_switches_speculation_off(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,  # noqa: F811
    prometheus: PrometheusProcess,
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    # Given one pod at batch 48, where this world's speculation is slower than plain, while the
    # roofline prior says it pays and so does an explicit limit (on below 64, as measured on other
    # hardware); the baseline measures plain speed there
    body = fast_resource(prometheus, replicas=1, soak="2s")
    body["spec"]["speculation"]["rollout"]["baseline"] = "10s"
    body["spec"]["speculation"]["draftLength"]["initial"] = 1  # the least-bad length: no steps to wait for
    body["spec"]["speculation"]["batchGuard"].update({"onBelow": 64, "offAbove": 96})
    await kube.create(body)
    await in_dynamic(kube)

    # Then the guard switches speculation off from what the pod measures, whatever the limit and
    # the young calibration say
    await decided_off(kube, serving, 60, "speculation off by the measured-slowdown guard")
    guarded = await events_named(kube, "SpeculationOffMeasuredSlowdown")
    assert guarded[0]["type"] == "Warning"
    message = guarded[0]["message"]
    assert "ms plain at batch 48" in message and "measurements in a row" in message, message
    found = await calibration(kube)
    assert found["slowdownBatch"] is not None and found["slowdownBatch"] >= 40, found
    # And it stays off at this load (the limit alone would switch it straight back on): for 5 s
    # every look finds it off, and once past the minimum dwell the measured slowdown is why
    reasons = []
    for _ in range(10):
        await asyncio.sleep(0.5)
        body = await resource(kube, NAME)
        assert body is not None
        assert body["status"]["speculation"]["state"] == "off", body["status"]["speculation"]
        assert not any(pod_lengths(serving)), pod_lengths(serving)
        reasons.append(body["status"]["speculation"]["reason"])
    assert reasons[-1] in ("HeldMeasuredSlowdown", "SpeculationOffMeasuredSlowdown"), reasons
    print(f"guard fired {loop.time() - started:.1f} s after creation: {message}")


@pytest.mark.timeout(120)
async def test_a_profile_in_a_config_map_is_the_prior_the_operator_decides_from(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,  # noqa: F811
    prometheus: PrometheusProcess,
    world: ServingProfile,  # noqa: F811
) -> None:
    # Given the world's own profile (as `specops profile` would measure it) in a ConfigMap
    await kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "measured-profile", "namespace": "default"},
            "data": {"profile.json": json.dumps(world.to_dict())},
        }
    )
    body = fast_resource(prometheus)
    body["spec"]["speculation"]["calibration"]["profile"] = {"configMapRef": {"name": "measured-profile"}}
    await kube.create(body)

    # Then status names the profile as the prior, and its break-even is the profile's, not the roofline's
    truth = world.break_even_batch(0.8)
    assert truth is not None

    async def from_profile() -> dict[str, Any] | None:
        found = await calibration(kube)
        prior = found.get("priorBreakEvenBatch")
        ok = found.get("priorSource") == "profile" and prior is not None and abs(prior - truth) <= 0.3 * truth
        return found if ok else None

    try:
        shown = await eventually(from_profile, timeout_s=60, interval_s=0.5, what="the profile as the prior")
    except AssertionError as error:
        raise AssertionError(f"{error}\n{await story(kube)}") from None
    assert shown["profileName"] == world.name
    loaded = condition(await resource(kube, NAME), "CalibrationProfile")
    assert loaded is not None and loaded["status"] == "True" and loaded["reason"] == "ProfileLoaded", loaded
    print(f"prior break-even {shown['priorBreakEvenBatch']} (profile {truth}); model {shown['modelSource']}")
