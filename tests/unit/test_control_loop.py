"""The control loop through ControlLoop itself: a world it measures, revisions it rolls, a restart.

The metrics source answers from a serving profile at the revision the pods run (no Prometheus,
no HTTP): plain pods at the plain step, speculating pods at the round time of the K their
schedule gives at the batch (K=0 inside a speculating engine at the profile's k0 step). A
revision the loop rolls out reaches every pod by the next tick. The loop never sees the world.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from specops.api.models import SpeculativeDeployment
from specops.api.status import SpeculationStatus, SpeculativeDeploymentStatus
from specops.domain.discovery import PodEndpoint
from specops.domain.engines.schedule import PLAIN, Revision
from specops.domain.metrics import Measurement
from specops.domain.perf import expected_tokens
from specops.domain.profile import ServingProfile, profile_from_setup
from specops.domain.revision_step import config_from_spec
from specops.services.control import ControlLoop
from specops.services.reconciler import stable_plan
from tests.conftest import EXAMPLES

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ALPHA = 0.8
REPLICAS = 2


def resource(replicas: int = REPLICAS, **speculation: Any) -> SpeculativeDeployment:
    body = yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())
    body["metadata"].update({"namespace": "default", "uid": "u-1"})
    body["spec"]["serving"] = {"replicas": replicas, "gpu": {"type": "H100", "count": 1}, "tensorParallel": 1}
    body["spec"]["metrics"] = {"interval": "1s"}
    body["spec"]["speculation"] = {
        "draftLength": {"initial": 3, "min": 1, "max": 8},
        "rollout": {"baseline": "20s", "soak": "20s"},
        "reconfigure": {"minInterval": "30s"},
        "calibration": {"halfLife": "1h"},
        **speculation,
    }
    return SpeculativeDeployment.model_validate(body)


def setup() -> Any:
    spec = resource().spec
    return config_from_spec(spec, spec.draft).setup


def slow_world(per_token_ms: float = 2.0, fixed_ms: float = 0.0) -> ServingProfile:
    """The roofline plus a large verification cost per drafted token and sequence: speculation
    loses from a batch of about fifteen on, where the roofline says it pays up to ~250."""
    base = profile_from_setup("slow", setup()).to_dict()
    base["round_ms"] = {
        g: [ms + int(g) * (b * per_token_ms + fixed_ms) for ms, b in zip(row, base["batches"], strict=True)]
        for g, row in base["round_ms"].items()
    }
    return ServingProfile.from_dict(base)


class World:
    """The pods' metrics: the profile at the revision they run, at the batch of the moment."""

    def __init__(
        self, profile: ServingProfile, batch: float | Callable[[float], float], replicas: int = REPLICAS
    ) -> None:
        self.profile = profile
        self.replicas = replicas
        self.batch_at = batch if callable(batch) else (lambda _s: batch)
        self.revision: Revision = PLAIN
        self.holdback = False
        """One pod runs plain (variant holdback) beside the others."""
        self.second = 0.0

    @property
    def batch(self) -> float:
        return float(self.batch_at(self.second))

    def register(self, key: Hashable, url: str, backend: str, interval_s: float) -> None:
        pass

    def unregister(self, key: Hashable) -> None:
        pass

    def lookup(self, url: str, backend: str, namespace: str, name: str, variant: str, now: datetime,
               draft_length: int | None = None, draft: str | None = None) -> Measurement:  # fmt: skip
        batch = self.batch
        schedule = self.revision.schedule if variant == "stable" else None
        k = schedule.k_at(batch) if schedule is not None else 0
        if k > 0:
            tpot = self.profile.round_ms_at(k, batch) / 1e3 / expected_tokens(ALPHA, k)
        elif schedule is not None:
            tpot = self.profile.k0_ms_at(batch) / 1e3
        else:
            tpot = self.profile.plain_ms_at(batch) / 1e3
        return Measurement(
            phase="Ok",
            at=now,
            alpha=ALPHA if k else None,
            batch=batch,
            tpot_p50_s=tpot,
            tpot_mean_s=tpot,
            pods_reporting=REPLICAS,
        )

    async def close(self) -> None:
        pass

    def pods(self) -> list[PodEndpoint]:
        stable = self.replicas - 1 if self.holdback else self.replicas
        pods = [
            PodEndpoint(f"pod-{i}", "default", "127.0.0.1", 8000 + i, "stable", revision=self.revision.digest)
            for i in range(stable)
        ]
        if self.holdback:
            pods.append(PodEndpoint("held", "default", "127.0.0.1", 8100, "holdback", revision=PLAIN.digest))
        return pods


async def run(
    loop: ControlLoop,
    world: World,
    status: SpeculativeDeploymentStatus,
    start: int,
    seconds: int,
    events: list[Any],
    sdep: SpeculativeDeployment | None = None,
    rolled: list[Revision] | None = None,
) -> SpeculativeDeploymentStatus:
    sdep = sdep or resource()
    if status.speculation.revision is None:  # a new resource's pods, as the reconciler first renders them
        world.revision, world.holdback = stable_plan(sdep)
    for second in range(start, start + seconds):
        world.second = second
        result = await loop.tick(
            sdep, status, world.pods(), T0 + timedelta(seconds=second), draft_stale=False
        )
        events.extend(result.events)
        status = result.status
        if result.roll_to is not None:  # the rollout completes by the next tick
            world.revision = result.roll_to
            world.holdback = result.status.speculation.holdback is not None
            if rolled is not None:
                rolled.append(result.roll_to)
    return status


def fresh() -> SpeculativeDeploymentStatus:
    return SpeculativeDeploymentStatus(phase="Baseline", speculation=SpeculationStatus())


def cycling(second: float) -> float:
    """The load moves through light and heavy batches every 40 s."""
    return (4.0, 12.0, 48.0, 160.0)[int(second // 10) % 4]


async def test_the_baseline_holds_one_pod_plain_beside_the_prior_schedule_then_every_pod_speculates() -> None:
    world = World(profile_from_setup("roofline", setup()), batch=8)
    loop = ControlLoop(world)
    events: list[Any] = []
    rolled: list[Revision] = []
    status = await run(loop, world, fresh(), 0, 10, events, rolled=rolled)
    assert status.speculation.control_phase == "Baseline" and status.speculation.state == "on"
    assert world.revision.schedule is not None and world.revision.schedule.k_at(1) == 3  # draftLength.initial
    holdback = status.speculation.holdback
    assert world.holdback and holdback is not None and holdback.pods == 1
    assert holdback.cost is not None and holdback.cost > 0  # half the fleet's gain, with two replicas
    status = await run(loop, world, status, 10, 20, events, rolled=rolled)
    assert status.speculation.control_phase == "Dynamic" and status.speculation.state == "on"
    assert status.speculation.holdback is None and not world.holdback  # every pod speculates now
    assert status.baseline.samples >= 3  # plain speed measured on the holdback pod
    assert [e.reason for e in events].count("BaselineRecorded") == 1


async def test_one_replica_runs_plain_through_its_baseline() -> None:
    world = World(profile_from_setup("roofline", setup()), batch=8)
    loop = ControlLoop(world)
    status = await run(loop, world, fresh(), 0, 10, [], sdep=resource(replicas=1))
    assert status.speculation.control_phase == "Baseline" and status.speculation.schedule == "plain"
    assert status.speculation.holdback is None


async def test_where_speculation_loses_above_a_batch_the_schedule_turns_k_to_zero_there() -> None:
    profile = slow_world()
    truth = profile.break_even_batch(ALPHA)
    assert truth is not None and 5 <= truth <= 60  # the world's break-even, far below the prior's
    world = World(profile, batch=cycling)
    loop = ControlLoop(world, rate_window_s=2.0)
    events: list[Any] = []
    rolled: list[Revision] = []
    status = await run(loop, world, fresh(), 0, 400, events, rolled=rolled)
    learned = status.speculation.calibration
    assert learned.prior_break_even_batch is None or learned.prior_break_even_batch > 100
    assert learned.model_source == "calibrated" and learned.samples > 10
    assert learned.break_even_batch is not None and abs(learned.break_even_batch - truth) <= 0.5 * truth
    schedule = world.revision.schedule
    assert schedule is not None and schedule.k_at(1) > 0  # light batches still speculate
    assert schedule.k_at(4 * truth) == 0  # heavy ones do not
    # each change was a rollout the status explained, and few of them
    assert 2 <= len(rolled) <= 5, [r.describe() for r in rolled]
    assert status.speculation.revision is not None and status.speculation.reason
    assert all(e.message for e in events if e.reason in ("RevisionProposed", "MeasuredSlowdown"))


async def test_where_speculation_never_pays_the_pods_end_plain_within_three_rollouts() -> None:
    world = World(slow_world(fixed_ms=200.0), batch=cycling)
    assert world.profile.best_length(ALPHA, 1)[0] == 0  # no draft length pays even unbatched
    loop = ControlLoop(world, rate_window_s=2.0)
    rolled: list[Revision] = []
    status = await run(loop, world, fresh(), 0, 200, [], rolled=rolled)
    assert world.revision == PLAIN and status.speculation.state == "off"
    # after the prior's first schedule, at most three restarts (one measuring the light bands)
    assert len(rolled[1:]) <= 3, [r.describe() for r in rolled]
    settled = len(rolled)
    status = await run(loop, world, status, 200, 200, [], rolled=rolled)
    assert len(rolled) == settled and world.revision == PLAIN  # and it stays plain


async def test_mode_off_runs_plain_at_once_and_never_speculates() -> None:
    world = World(profile_from_setup("roofline", setup()), batch=4)
    loop = ControlLoop(world)
    status = await run(loop, world, fresh(), 0, 60, [], sdep=resource(mode="off"))
    assert world.revision == PLAIN and status.speculation.reason == "SpeculationOff"


async def test_a_restart_resumes_the_fit_and_the_revision_from_status() -> None:
    world = World(slow_world(), batch=cycling)
    first = ControlLoop(world, rate_window_s=2.0)
    status = await run(first, world, fresh(), 0, 200, [])
    before = status.speculation
    restarted = ControlLoop(world, rate_window_s=2.0)  # a new process: nothing in memory
    status = SpeculativeDeploymentStatus.from_wire(status.to_wire())
    rolled: list[Revision] = []
    after = (await run(restarted, world, status, 200, 1, [], rolled=rolled)).speculation
    assert rolled == []  # no rollout from a restart
    assert after.revision == before.revision and after.control_phase == before.control_phase
    assert after.calibration.samples >= before.calibration.samples > 0
    assert after.calibration.break_even_batch == before.calibration.break_even_batch
