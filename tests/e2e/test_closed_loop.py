"""The closed loop, end to end: simulated engines serve a world the operator's roofline gets wrong.

Real operator, emulated API server, Debian's Prometheus scraping simulated engines every second.
The engines serve a serving profile (their step times come from a table, not from the roofline
the operator starts from), so only what the operator measures can tell it the truth; what it
can change is the revision the pods run (a schedule rolled out pod by pod, or plain pods). Time
is compressed: 1 s decisions, a 5 s rate window, a 10-minute calibration half-life, revisions
every 2 s at most, engines ready 0.5 s after they start.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from specops import profiles
from specops.adapters.kube import KubeClient
from specops.api.models import SpeculativeDeployment
from specops.domain.profile import ServingProfile, profile_from_setup
from specops.domain.revision_step import config_from_spec
from specops_local.prometheus import PrometheusProcess
from specops_local.serving import ServingController
from specops_local.sim import LoadPoint
from tests.e2e.conftest import RESTART_S, Operator, example
from tests.e2e.test_control_loop import pod_lengths, settled_on, speculation_of
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
        # a baseline longer than the pods' first rate window and its settle time (5 s + 2
        # intervals) gives the fit settled samples of plain decoding
        "rollout": {"baseline": "16s", "soak": soak},
        "reconfigure": {"minInterval": "2s"},
        "calibration": {"halfLife": "10m"},
    }
    return body


def the_setup() -> Any:
    spec = SpeculativeDeployment.model_validate(example()).spec
    return config_from_spec(spec, spec.draft).setup


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
    """Simulated engines serving `world` instead of the roofline."""

    def options(resource: SpeculativeDeployment, variant: str) -> dict[str, Any]:
        return {"serving_profile": world}

    async with ServingController(
        cluster, prometheus, load=serving_load, pod_options=options, restart_s=RESTART_S, poll_s=0.05
    ) as controller:
        yield controller


async def story(kube: KubeClient) -> str:
    """What the operator decided and why, for a failing assertion."""
    speculation = speculation_of(await resource(kube, NAME))
    learned = dict(speculation.pop("calibration", {}))
    learned.pop("statistics", None)
    events = [(e["reason"], e["message"]) for e in await events_for(kube, NAME)]
    return f"speculation: {speculation}\ncalibration: {learned}\nevents: {events}"


def k_at(speculation: dict[str, Any], batch: int) -> int:
    """The K the revision status names gives at ``batch``."""
    bands = [
        (b.get("maxBatch"), int(b.get("k") or 0))
        for b in (speculation.get("revision") or {}).get("schedule") or []
    ]
    if (speculation.get("revision") or {}).get("mode") != "spec" or not bands:
        return 0
    return next((k for edge, k in bands if edge is None or batch <= edge), bands[-1][1])


@pytest.mark.timeout(300)
async def test_an_early_break_even_is_learned_and_a_schedule_with_k0_there_rolls_out(
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

    # Given a resource speculating at low load, its first schedule from the prior: drafting at
    # batch 48, where this world no longer pays
    loop = asyncio.get_running_loop()
    started = loop.time()
    await kube.create(fast_resource(prometheus, soak="8s"))
    first = await settled_on(
        kube,
        serving,
        1,
        "the prior's schedule",
        60,
        lambda s: (s.get("revision") or {}).get("mode") == "spec",
    )
    first_speculation = first["status"]["speculation"]
    assert k_at(first_speculation, HIGH.batch) > 0, first_speculation["schedule"]

    # When the load rises past the world's break-even (the roofline still predicts a gain there)
    serving.set_load(HIGH)
    raised = loop.time()

    # Then, from what the engines measure, a revision whose schedule gives K=0 at that batch rolls
    # out, and the engines stop drafting there
    try:
        tuned = await settled_on(
            kube,
            serving,
            1,
            "a schedule with K=0 at the heavy batch",
            180,  # headroom for a loaded CI machine: the learning itself takes about a minute
            lambda s: (
                (s.get("revision") or {}).get("digest") != first_speculation["revision"]["digest"]
                and k_at(s, HIGH.batch) == 0
            ),
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\n{await story(kube)}") from None
    rolled_after_s = loop.time() - raised
    assert all(k == 0 for k in pod_lengths(serving)), pod_lengths(serving)
    speculation = tuned["status"]["speculation"]
    calibration = speculation["calibration"]
    assert calibration["modelSource"] == "calibrated" and calibration["samples"] > 0
    reasons = {e["reason"] for e in await events_for(kube, NAME)}
    assert reasons & {"RevisionProposed", "MeasuredSlowdown"}, reasons
    assert "CalibrationMovedBreakEven" in reasons, reasons

    # When the load falls again, the engines of that revision draft at the low batch (if the
    # learned curve still pays there) with no restart: the schedule, not the operator, reacts
    names = sorted(slot.name for slot in serving.all_slots("stable"))
    serving.set_load(LOW)
    if k_at(speculation, LOW.batch) > 0:
        await asyncio.sleep(1.0)
        assert pod_lengths(serving) and all(k > 0 for k in pod_lengths(serving)), pod_lengths(serving)
        assert sorted(slot.name for slot in serving.all_slots("stable")) == names
    print(
        f"{loop.time() - started:.0f} s in all: {speculation['schedule']} rolled out {rolled_after_s:.1f} s "
        f"after the load passed break-even (truth {truth}, prior {prior}); learned break-even "
        f"{calibration.get('breakEvenBatch')}, {calibration['samples']} samples"
    )


@pytest.mark.parametrize("world", [profiles.load_builtin("qwen3-30b-a3b-moe-eagle3-h100")])
@pytest.mark.parametrize("serving_load", [LoadPoint(batch=16, alpha=0.55)])
async def test_where_speculation_never_pays_the_pods_go_plain_and_stay_plain(
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

    # Given a resource whose roofline prior promises a gain at batch 16: its first speculating
    # revision rolls out after the baseline (the next decision may replace it within seconds)
    await kube.create(fast_resource(prometheus))

    async def prior_rolled_out() -> bool:
        return any(
            e["reason"] == "BaselineRecorded" and "rolling out draftModel" in e["message"]
            for e in await events_for(kube, NAME)
        )

    await eventually(prior_rolled_out, timeout_s=60, what="the prior's schedule rolled out")

    # Then, once the engines show it does not pay, plain pods roll out
    try:
        await settled_on(
            kube,
            serving,
            1,
            "plain pods where speculation never pays",
            90,
            lambda s: s.get("controlPhase") == "Dynamic" and (s.get("revision") or {}).get("mode") == "plain",
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\n{await story(kube)}") from None
    plain_after_s = loop.time() - started

    # And it stays plain: no speculating revision comes back while the world holds
    for _ in range(20):
        await asyncio.sleep(0.5)
        speculation = speculation_of(await resource(kube, NAME))
        assert (speculation.get("revision") or {}).get("mode") == "plain", speculation.get("schedule")
        assert not any(pod_lengths(serving)), pod_lengths(serving)
    calibration = speculation["calibration"]
    assert calibration["modelSource"] == "calibrated" and calibration["samples"] > 0
    reasons = [e["reason"] for e in await events_for(kube, NAME)]
    print(f"plain {plain_after_s:.1f} s after creation; reasons {sorted(set(reasons))}")
