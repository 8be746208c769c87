"""The control loop on the engines, end to end: emulated API server, Debian's Prometheus scraping
simulated engines every second, and the real operator deciding revisions and rolling them out.

Each backend's engine is started from the very command, args and config files specops renders
(a field the real engine does not know would refuse to start), applies its draft-length
schedule at every iteration, and exports the engine's own metric names. Baseline 2 s, soak 2 s,
1 s decisions, engines ready 0.5 s after they start.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from specops.adapters.kube import KubeClient
from specops.api.models import BACKENDS
from specops.domain.metrics import PROFILES
from specops_local.prometheus import PrometheusProcess
from specops_local.serving import PodSlot, ServingController
from specops_local.sim import LoadPoint
from tests.e2e.conftest import Operator, example
from tests.e2e.waiting import condition, events_for, eventually, resource

pytestmark = [pytest.mark.e2e, pytest.mark.emulated_only]

NAME = "llama-70b-chat"
# The prior assumes alpha 0.7; the draft accepts 0.9 here, so the learned curve favours longer
# drafts than the first revision's and a tuned schedule rolls out in the Dynamic phase.
LOW = LoadPoint(batch=16, alpha=0.9)
HIGH = LoadPoint(batch=400, alpha=0.9)  # past break-even: the engines run at most 256 at once
PROBES = (1, 8, 16, 32, 64, 128, 256, 1024)
"""Batches at which an engine's parsed schedule is compared with the one status names."""


METHODS = {"sglang": "eagle3"}
"""The draft method per backend here (the example's draftModel elsewhere): SGLang applies a
batch schedule (--speculative-adaptive) to EAGLE and EAGLE-3 only."""


@pytest.fixture
def serving_load() -> LoadPoint:
    return LOW


@pytest.fixture
def operator_env(operator_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compressed time: 5 s rate windows (1 s scrapes), so a revision is measured within 7 s."""
    monkeypatch.setenv("SPECOPS_RATE_WINDOW_SECONDS", "5")


def fast_resource(
    prometheus: PrometheusProcess, backend: str = "triton", replicas: int = 2
) -> dict[str, Any]:
    body = example()
    body["spec"]["serving"].update(backend=backend, replicas=replicas, maxSurge=1, maxUnavailable=0)
    if backend in METHODS:
        body["spec"]["draft"].update(method=METHODS[backend], parameters="1B")
    body["spec"]["metrics"] = {"prometheus": {"url": prometheus.url}, "interval": "1s"}
    body["spec"]["speculation"] = {
        "mode": "auto",
        "draftLength": {"initial": 4, "min": 1, "max": 8},
        "rollout": {"baseline": "4s", "soak": "2s"},
        "reconfigure": {"minInterval": "2s"},
    }
    return body


def stable_slots(serving: ServingController) -> list[PodSlot]:
    return serving.all_slots("stable")


def schedule_ks(revision: dict[str, Any]) -> list[int]:
    """The K a status revision's schedule gives at each of PROBES (all 0 for plain)."""
    bands = [(band.get("maxBatch"), int(band.get("k") or 0)) for band in revision.get("schedule") or []]
    if revision.get("mode") != "spec" or not bands:
        return [0] * len(PROBES)
    return [next((k for edge, k in bands if edge is None or b <= edge), bands[-1][1]) for b in PROBES]


def speculation_of(body: dict[str, Any] | None) -> dict[str, Any]:
    return dict(((body or {}).get("status") or {}).get("speculation") or {})


async def settled_on(
    kube: KubeClient, serving: ServingController, replicas: int, what: str, timeout_s: float, predicate: Any
) -> dict[str, Any]:
    """Until status names a revision matching ``predicate``, no rollout runs, and exactly
    ``replicas`` ready stable pods carry it (and only them); the resource then."""

    async def probe() -> dict[str, Any] | None:
        body = await resource(kube, NAME)
        speculation = speculation_of(body)
        revision = speculation.get("revision") or {}
        slots = stable_slots(serving)
        if (
            predicate(speculation)
            and not speculation.get("rollout")
            and len(slots) == replicas
            and all(s.revision == revision.get("digest") and s.ready for s in slots)
        ):
            return body
        return None

    try:
        return await eventually(probe, timeout_s=timeout_s, interval_s=0.1, what=what)
    except AssertionError as error:
        body = await resource(kube, NAME)
        seen = [(s.name, s.revision, s.ready, s.error) for s in stable_slots(serving)]
        events = [(e["reason"], e["message"]) for e in await events_for(kube, NAME)]
        raise AssertionError(
            f"{error}\npods: {seen}\nspeculation: {speculation_of(body)}\nevents: {events}"
        ) from None


class Truthfulness:
    """Samples status and pods all along: whenever status says a revision is settled on every pod
    (no rollout, SpeculationApplied=True), every ready stable pod runs it, with its schedule."""

    def __init__(self, kube: KubeClient, serving: ServingController) -> None:
        self.kube, self.serving = kube, serving
        self.checked = 0
        self.lies: list[str] = []
        self.rollouts_seen: list[dict[str, Any]] = []
        self.speculating: dict[str, str] = {}
        """Every speculating revision status named: digest -> schedule."""

    async def run(self) -> None:
        while True:
            body = await resource(self.kube, NAME)
            speculation = speculation_of(body)
            revision = speculation.get("revision") or {}
            applied = condition(body, "SpeculationApplied") or {}
            if revision.get("mode") == "spec":
                self.speculating.setdefault(revision["digest"], str(speculation.get("schedule")))
            if speculation.get("rollout"):
                self.rollouts_seen.append(dict(speculation["rollout"]))
            elif revision.get("digest") and applied.get("status") == "True":
                self.checked += 1
                wanted = schedule_ks(revision)
                for slot in stable_slots(self.serving):
                    if not slot.ready or slot.engine is None:
                        continue
                    running = [slot.engine.k_at(b) for b in PROBES]
                    if slot.revision != revision["digest"] or running != wanted:
                        self.lies.append(
                            f"status settled on {revision['digest']} ({speculation.get('schedule')}), but "
                            f"{slot.name} runs {slot.revision} drafting K {running} at {list(PROBES)}"
                        )
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def watching(kube: KubeClient, serving: ServingController) -> AsyncIterator[Truthfulness]:
    truth = Truthfulness(kube, serving)
    task = asyncio.get_running_loop().create_task(truth.run(), name="status truthfulness")
    try:
        yield truth
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("backend", BACKENDS)
async def test_each_backend_serves_measures_and_rolls_out_a_new_schedule(
    backend: str,
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    async with watching(kube, serving) as truth:
        # Given a user applies a resource on this backend
        await kube.create(fast_resource(prometheus, backend))

        # Then its pods run this backend's engine, started plain while the first draft is checked:
        # the engine parsed the rendered command, args and config files and found no speculative config
        body = await settled_on(
            kube,
            serving,
            2,
            "plain pods while the first draft is checked",
            20,
            lambda s: (s.get("revision") or {}).get("mode") == "plain",
        )
        engines = [slot.engine for slot in stable_slots(serving)]
        assert all(e is not None and e.backend == backend and e.spec is None for e in engines), engines
        pods = cluster.objects("pods", "default")
        assert {p["metadata"]["labels"]["specops.dev/backend"] for p in pods} >= {backend}
        container = pods[0]["spec"]["containers"][0]
        assert container["command"] and "image" in container

        # And measurements come from the engine's own metric names, per resource and revision
        gauge = PROFILES[backend].batch_gauge.split("{")[0]
        series = await eventually(
            lambda: prometheus.query(f'{gauge}{{specops_deployment="{NAME}", variant="stable"}}'),
            timeout_s=10,
            what=f"{gauge} scraped",
        )
        assert {s["metric"]["specops_revision"] for s in series} == {
            body["status"]["speculation"]["revision"]["digest"]
        }

        async def measured() -> dict[str, Any] | None:
            found = await resource(kube, NAME)
            observed = ((found or {}).get("status") or {}).get("observed") or {}
            return found if observed.get("batch") == pytest.approx(LOW.batch, abs=1.0) else None

        await eventually(measured, timeout_s=15, what="status.observed.batch from the engines")

        # When the draft passed its check, the baseline runs one pod speculating beside a plain
        # holdback pod, which shares the traffic and measures plain speed
        held = await settled_on(
            kube,
            serving,
            1,
            "one speculating pod beside a plain holdback pod",
            40,
            lambda s: (s.get("revision") or {}).get("mode") == "spec" and s.get("holdback") is not None,
        )
        assert held["status"]["speculation"]["holdback"]["pods"] == 1
        holdback = [
            p
            for p in cluster.objects("pods", "default")
            if p["metadata"]["labels"]["specops.dev/variant"] == "holdback"
        ]
        assert len(holdback) == 1 and holdback[0]["metadata"]["labels"]["specops.dev/mode"] == "plain"
        assert holdback[0]["metadata"]["labels"]["specops.dev/traffic"] == "serve"

        # When the baseline ends, every pod runs a speculating revision, visible in status
        first = await settled_on(
            kube,
            serving,
            2,
            "the first speculating revision on every pod",
            40,
            lambda s: (s.get("revision") or {}).get("mode") == "spec" and s.get("holdback") is None,
        )
        first_revision = first["status"]["speculation"]["revision"]
        assert first["status"]["baseline"]["samples"] > 0  # the holdback pod's plain latency
        assert not [
            d
            for d in cluster.objects("deployments", "default")
            if d["metadata"]["name"].endswith("-holdback")
        ]
        assert any(r["target"] == first_revision["digest"] for r in truth.rollouts_seen), truth.rollouts_seen
        assert all(r["replicas"] == 2 and r["updated"] <= 2 for r in truth.rollouts_seen)
        engines = [slot.engine for slot in stable_slots(serving)]
        assert all(e is not None and e.spec is not None and e.backend == backend for e in engines)
        assert [e.k_at(b) for b in PROBES for e in engines[:1] if e] == schedule_ks(first_revision)

        # And the speculating engines' own counters give acceptance in status
        async def alpha_measured() -> dict[str, Any] | None:
            found = await resource(kube, NAME)
            alpha = (((found or {}).get("status") or {}).get("observed") or {}).get("alpha")
            return found if alpha is not None and abs(alpha - LOW.alpha) < 0.1 else None

        await eventually(alpha_measured, timeout_s=20, what="alpha from the engines' counters")

        # And then, learning the draft accepts more than the prior assumed, the loop rolls out a
        # new schedule: a second speculating revision, with the evidence in an Event
        tuned = await settled_on(
            kube,
            serving,
            2,
            "a tuned schedule on every pod",
            60,
            lambda s: (s.get("revision") or {}).get("mode") == "spec" and len(truth.speculating) >= 2,
        )
        speculation = tuned["status"]["speculation"]
        assert speculation["controlPhase"] == "Dynamic"
        assert (
            speculation["revision"]["digest"] in truth.speculating
            and len(set(truth.speculating.values())) >= 2
        )
        events = await events_for(kube, NAME)
        assert "BaselineRecorded" in [e["reason"] for e in events]
        # an Event names the tuned schedule and its evidence (the baseline's end, or a later proposal)
        assert any(
            e["reason"] in ("BaselineRecorded", "RevisionProposed", "MeasuredSlowdown")
            and str(speculation["schedule"]) in e["message"]
            for e in events
        ), [(e["reason"], e["message"]) for e in events]
        assert any(r["target"] == speculation["revision"]["digest"] for r in truth.rollouts_seen)
        for slot in stable_slots(serving):
            assert slot.engine is not None
            assert [slot.engine.k_at(b) for b in PROBES] == schedule_ks(speculation["revision"])

    # And status never claimed a revision the pods did not run
    assert truth.checked > 10 and not truth.lies, truth.lies[:3]


async def test_the_engines_schedule_gives_k0_past_break_even_without_a_restart(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    # Given a resource whose pods run a speculating revision at low load (the prior's first one:
    # no gain is large enough to tune it here)
    body = fast_resource(prometheus)
    body["spec"]["speculation"]["reconfigure"] = {"minInterval": "1h", "minGain": 0.9}
    await kube.create(body)
    settled = await settled_on(
        kube,
        serving,
        2,
        "a speculating revision on every pod",
        40,
        lambda s: (s.get("revision") or {}).get("mode") == "spec" and s.get("holdback") is None,
    )
    schedule = settled["status"]["speculation"]["schedule"]
    names = sorted(slot.name for slot in stable_slots(serving))

    def ks() -> list[int]:
        return [s.engine.k for s in stable_slots(serving) if s.engine is not None and s.ready]

    assert ks() and all(k > 0 for k in ks())

    # When the load rises far past break-even, then every engine drafts K=0 at once, from its
    # own schedule: the same pods, no restart
    serving.set_load(HIGH)
    await eventually(
        lambda: _all(ks(), lambda k: k == 0),
        timeout_s=2,
        interval_s=0.05,
        what=f"K=0 on every engine ({schedule})",
    )
    assert sorted(slot.name for slot in stable_slots(serving)) == names

    # And status sees the heavy batch the engines carry (their own running-requests gauge)
    async def heavy() -> bool:
        observed = (((await resource(kube, NAME)) or {}).get("status") or {}).get("observed") or {}
        return (observed.get("batch") or 0) > 200

    await eventually(heavy, timeout_s=15, what="status.observed.batch past break-even")

    # When the load falls again, the engines draft again
    serving.set_load(LOW)
    await eventually(lambda: _all(ks(), lambda k: k > 0), timeout_s=2, interval_s=0.05, what="drafting again")


async def _all(values: list[int], predicate: Any) -> bool:
    return bool(values) and all(predicate(v) for v in values)


async def test_prometheus_outage_holds_the_revision_and_recovers(
    cluster: Any,
    kube: KubeClient,
    operator: Operator,
    serving: ServingController,
    prometheus: PrometheusProcess,
) -> None:
    # Given a resource settled on a speculating revision
    await kube.create(fast_resource(prometheus))
    body = await settled_on(
        kube,
        serving,
        2,
        "a speculating revision",
        40,
        lambda s: (s.get("revision") or {}).get("mode") == "spec",
    )
    digest = body["status"]["speculation"]["revision"]["digest"]

    # When Prometheus goes away, then MetricsUnavailable=True says the revision is held
    await prometheus.stop()
    try:

        async def unavailable() -> dict[str, Any] | None:
            found = await resource(kube, NAME)
            metrics = condition(found, "MetricsUnavailable") or {}
            return found if metrics.get("status") == "True" else None

        found = await eventually(unavailable, timeout_s=20, what="MetricsUnavailable=True")
        assert "holding revision" in condition(found, "MetricsUnavailable")["message"]
        # And nothing rolls meanwhile: every pod still runs the revision
        await asyncio.sleep(2)
        assert {slot.revision for slot in stable_slots(serving)} == {
            speculation_of(found)["revision"]["digest"]
        }
    finally:
        await prometheus.start()

    # When it is back, the condition clears
    async def available() -> bool:
        metrics = condition(await resource(kube, NAME), "MetricsUnavailable") or {}
        return metrics.get("status") == "False"

    await eventually(available, timeout_s=30, what="MetricsUnavailable=False")
    assert digest  # the revision settled before the outage was the one held (or a later, decided one)


# ---------------------------------------------------------------- helpers other modules use


def pod_lengths(serving: ServingController) -> list[int]:
    """The K each ready stable engine drafted at its last iteration (0: plain, or K=0 at its batch)."""
    return [s.engine.k for s in stable_slots(serving) if s.engine is not None and s.ready]


async def all_pods_at(serving: ServingController, predicate: Any, timeout_s: float, what: str) -> list[int]:
    async def probe() -> list[int] | None:
        lengths = pod_lengths(serving)
        return lengths if lengths and all(predicate(n) for n in lengths) else None

    return await eventually(probe, timeout_s=timeout_s, interval_s=0.1, what=what)


async def in_dynamic(kube: KubeClient) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        body = await resource(kube, NAME)
        return body if speculation_of(body).get("controlPhase") == "Dynamic" else None

    return await eventually(probe, timeout_s=45, interval_s=0.25, what="control phase Dynamic")
