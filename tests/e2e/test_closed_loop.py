"""The closed loop, end to end: simulated pods serve a world the operator's roofline gets wrong.

Real operator, emulated API server, Debian's Prometheus scraping simulated Triton pods every
second. The pods serve a serving profile (their step times come from a table, not from the
roofline the operator starts from), so only what the operator measures can tell it the truth.
Time is compressed: 1 s decisions, a 5 s rate window, a 10-minute calibration half-life.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from specops import profiles
from specops.adapters.kube import KubeClient
from specops.api.models import SpeculativeDeployment
from specops.domain.control_status import policy_config
from specops.domain.profile import ServingProfile, profile_from_setup
from specops_local.prometheus import PrometheusProcess
from specops_local.serving import ServingController
from specops_local.sim import LoadPoint
from tests.e2e.conftest import Operator, example
from tests.e2e.waiting import events_for, eventually, resource

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only]

NAME = "llama-70b-chat"
ALPHA = 0.8
LOW = LoadPoint(batch=8, alpha=ALPHA)
HIGH = LoadPoint(batch=48, alpha=ALPHA)


def fast_resource(prometheus: PrometheusProcess, replicas: int = 1, soak: str = "2s") -> dict[str, Any]:
    body = example()
    body["spec"]["serving"]["replicas"] = replicas
    body["spec"]["metrics"] = {"prometheus": {"url": prometheus.url}, "interval": "1s"}
    body["spec"]["speculation"] = {
        "mode": "auto",
        "draftLength": {"initial": 3, "min": 1, "max": 8},
        # a baseline longer than one rate window gives the fit clean samples of plain decoding
        "rollout": {"baseline": "8s", "soak": soak},
        "batchGuard": {"minDwell": "2s"},
        "calibration": {"halfLife": "10m"},
        # time runs ~60x faster than in production here (1 s intervals): so do probe spacings
        "exploration": {"minSpacing": "5s"},
    }
    return body


def the_setup() -> Any:
    return policy_config(SpeculativeDeployment.model_validate(example()).spec).setup


def early_break_even_world(target_break_even: int = 24) -> ServingProfile:
    """The roofline of this very setup plus a verification cost per draft token per sequence,
    sized so that no length pays from batch `target_break_even` on (the roofline says ~250)."""
    base = profile_from_setup("early-break-even", the_setup(), alpha=ALPHA)

    def world(extra_ms: float) -> ServingProfile:
        data = base.to_dict()
        data["round_ms"] = {
            g: [ms + int(g) * b * extra_ms for ms, b in zip(row, data["batches"], strict=True)]
            for g, row in data["round_ms"].items()
        }
        return ServingProfile.from_dict(data)

    lo, hi = 0.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        found = world(mid).break_even_batch(ALPHA)
        if found is not None and found <= target_break_even:
            hi = mid
        else:
            lo = mid
    return world(hi)


@pytest.fixture
def operator_env(operator_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compressed time: 5 s rate windows (1 s scrapes), so a setting is measured within 7 s."""
    monkeypatch.setenv("SPECOPS_RATE_WINDOW_SECONDS", "5")


@pytest.fixture
def world() -> ServingProfile:
    return early_break_even_world()


@pytest.fixture
def serving_load() -> LoadPoint:
    return LOW


@pytest.fixture
async def serving(
    cluster: Any, prometheus: PrometheusProcess, serving_load: LoadPoint, world: ServingProfile
) -> AsyncIterator[ServingController]:
    """Simulated pods serving `world` instead of the roofline."""

    def options(resource: SpeculativeDeployment, variant: str) -> dict[str, Any]:
        return {"serving_profile": world}

    async with ServingController(cluster, prometheus, load=serving_load, pod_options=options) as controller:
        yield controller


def pod_lengths(serving: ServingController) -> list[int]:
    return [pod.draft_length for pod in serving.all_pods()]


async def all_pods_at(serving: ServingController, predicate: Any, timeout_s: float, what: str) -> list[int]:
    async def probe() -> list[int] | None:
        lengths = pod_lengths(serving)
        return lengths if lengths and all(predicate(n) for n in lengths) else None

    return await eventually(probe, timeout_s=timeout_s, interval_s=0.1, what=what)


async def decided_off(kube: KubeClient, serving: ServingController, timeout_s: float, what: str) -> None:
    """The decision is off (not a probe off) and every pod runs it."""

    async def probe() -> bool:
        body = await resource(kube, NAME)
        speculation = ((body or {}).get("status") or {}).get("speculation") or {}
        lengths = pod_lengths(serving)
        return speculation.get("state") == "off" and bool(lengths) and not any(lengths)

    try:
        await eventually(probe, timeout_s=timeout_s, interval_s=0.2, what=what)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{await story(kube)}") from None


async def story(kube: KubeClient) -> str:
    """What the operator decided and why, for a failing assertion."""
    body = await resource(kube, NAME)
    speculation = dict(((body or {}).get("status") or {}).get("speculation") or {})
    learned = dict(speculation.pop("calibration", {}))
    learned.pop("statistics", None)
    events = [(e["reason"], e["message"]) for e in await events_for(kube, NAME)]
    return f"speculation: {speculation}\ncalibration: {learned}\nevents: {events}"


async def in_dynamic(kube: KubeClient) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        body = await resource(kube, NAME)
        speculation = (body or {}).get("status", {}).get("speculation", {})
        return body if speculation.get("controlPhase") == "Dynamic" else None

    return await eventually(probe, timeout_s=60, interval_s=0.25, what="control phase Dynamic")


async def calibration(kube: KubeClient) -> dict[str, Any]:
    body = await resource(kube, NAME)
    return dict(((body or {}).get("status") or {}).get("speculation", {}).get("calibration") or {})


# Known nondeterminism: the fit depends on which samples land before the load changes (see the
# closing note of this change); a second try is allowed while that is tracked down.
@pytest.mark.flaky(reruns=1)
@pytest.mark.timeout(300)
async def test_early_break_even_is_learned_speculation_goes_off_past_it_and_back_on_below(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    world: ServingProfile,
) -> None:
    truth = world.break_even_batch(ALPHA)
    assert truth is not None and 20 <= truth <= 26
    prior = profile_from_setup("roofline", the_setup()).break_even_batch(ALPHA)
    assert prior is None or prior > 4 * truth  # the operator's prior is far off

    # Given a resource speculating at low load, where speculation pays in this world too (its
    # soak at one length is long enough to be measured)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await kube.create(fast_resource(prometheus, soak="8s"))
    await in_dynamic(kube)
    await all_pods_at(serving, lambda n: n > 0, 30, "speculation on at low load")

    # When the load rises past the world's break-even (the roofline still predicts a gain there)
    serving.set_load(HIGH)
    raised = loop.time()

    # Then speculation goes off, from what the pods measure
    await decided_off(kube, serving, 60, "speculation off past the real break-even")
    off_after_s = loop.time() - raised

    # And status shows a calibrated model whose break-even is within 30 % of the truth
    async def learned() -> dict[str, Any] | None:
        found = await calibration(kube)
        batch = found.get("breakEvenBatch")
        ok = found.get("modelSource") == "calibrated" and batch and abs(batch - truth) <= 0.3 * truth
        return found if ok else None

    try:
        shown = await eventually(learned, timeout_s=15, interval_s=0.5, what="learned break-even")
    except AssertionError:
        found = await calibration(kube)
        found.pop("statistics", None)
        events = [(e["reason"], e["message"]) for e in await events_for(kube, NAME)]
        raise AssertionError(f"true break-even {truth}, status: {found}, events: {events}") from None
    assert shown["samples"] > 0 and shown["relativeFitError"] is not None
    reasons = {e["reason"] for e in await events_for(kube, NAME)}
    off_reasons = {
        "SpeculationDisabledHighBatch",
        "SpeculationDisabledNoMeasuredGain",
        "SpeculationOffMeasuredSlowdown",
    }
    assert reasons & off_reasons, reasons
    assert "CalibrationMovedBreakEven" in reasons, reasons

    # When the load falls below the break-even again, then speculation comes back on
    serving.set_load(LOW)
    lowered = loop.time()
    try:
        # Up to the minimum dwell after the last switch off, then the evidence to switch on again.
        await all_pods_at(serving, lambda n: n > 0, 90, "speculation back on at low load")
    except AssertionError:
        found = await calibration(kube)
        found.pop("statistics", None)
        events = [(e["reason"], e["message"]) for e in await events_for(kube, NAME)]
        raise AssertionError(f"not back on at low load; calibration: {found}, events: {events}") from None
    print(
        f"{loop.time() - started:.0f} s in all: off {off_after_s:.1f} s after the load passed break-even, back on "
        f"{loop.time() - lowered:.1f} s after it fell; learned break-even {shown['breakEvenBatch']} "
        f"(truth {truth}, prior {prior}), {shown['samples']} samples, fit error {shown['relativeFitError']}"
    )


@pytest.mark.parametrize("world", [profiles.load_builtin("qwen3-30b-a3b-moe-eagle3-h100")])
@pytest.mark.parametrize("serving_load", [LoadPoint(batch=16, alpha=0.55)])
async def test_where_speculation_never_pays_it_goes_off_and_stays_off_apart_from_bounded_probes(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
    world: ServingProfile,
) -> None:
    assert world.break_even_batch(0.55) == 1  # no batch at which it pays
    loop = asyncio.get_running_loop()
    started = loop.time()

    # Given a resource whose roofline prior promises a gain at batch 16
    await kube.create(fast_resource(prometheus))
    await in_dynamic(kube)

    # Then speculation goes off (within the time the pods need to show it does not pay)
    await decided_off(kube, serving, 60, "speculation off where it never pays")
    off_after_s = loop.time() - started

    # And it stays off: the decision never turns on again; pods run a draft only inside probes
    on_outside_probes: list[tuple[float, list[int]]] = []
    for _ in range(40):
        await asyncio.sleep(0.5)
        found = await calibration(kube)
        lengths = pod_lengths(serving)
        if any(lengths) and not found.get("probing"):
            on_outside_probes.append((loop.time() - started, lengths))
    body = await resource(kube, NAME)
    assert body is not None
    assert body["status"]["speculation"]["state"] == "off"
    # a probe's end reaches the pods one decision before status shows it: allow that second
    assert len(on_outside_probes) <= 2, on_outside_probes
    reasons = [e["reason"] for e in await events_for(kube, NAME)]
    assert "SpeculationEnabledLowBatch" not in reasons, reasons
    found = await calibration(kube)
    assert found["modelSource"] == "calibrated"
    # (only batch 16 was measured: below it the fit still leans on the prior)
    assert found.get("breakEvenBatch") is not None and found["breakEvenBatch"] <= 16, found
    assert found["samples"] > 0
    ledger = found["ledger"]
    assert ledger.get("probeSeconds", 0.0) <= 0.02 * max(ledger["elapsedSeconds"], 3600) + 30
    print(
        f"off {off_after_s:.1f} s after creation; probes {ledger.get('probes', 0)}, "
        f"{ledger.get('probeSeconds', 0.0):.0f} s of {ledger['elapsedSeconds']:.0f} s; learned break-even "
        f"{found['breakEvenBatch']} (prior {found.get('priorBreakEvenBatch')}); reasons {sorted(set(reasons))}"
    )
