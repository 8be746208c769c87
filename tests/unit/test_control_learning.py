"""The control loop's learning through ControlLoop itself: a world it measures, a restart that resumes.

The metrics source answers from a serving profile at the setting the pods were last given
(no Prometheus, no HTTP), so the loop is closed in-process on a simulated clock.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from specops.api.models import SpeculativeDeployment
from specops.api.status import SpeculationStatus, SpeculativeDeploymentStatus
from specops.domain.control_status import policy_config
from specops.domain.discovery import PodEndpoint
from specops.domain.metrics import Measurement
from specops.domain.perf import expected_tokens
from specops.domain.profile import ServingProfile, profile_from_setup
from specops.ports import ApplyResult, FleetResult
from specops.services.control import ControlLoop
from tests.conftest import EXAMPLES

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ALPHA = 0.8


def resource(**speculation: Any) -> SpeculativeDeployment:
    body = yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())
    body["metadata"].update({"namespace": "default", "uid": "u-1"})
    body["spec"]["serving"] = {"replicas": 1, "gpu": {"type": "H100", "count": 1}, "tensorParallel": 1}
    body["spec"]["metrics"] = {"interval": "1s"}
    body["spec"]["speculation"] = {
        "draftLength": {"initial": 3, "min": 1, "max": 8},
        "rollout": {"baseline": "6s", "soak": "6s"},
        "batchGuard": {"minDwell": "2s"},
        **speculation,
    }
    return SpeculativeDeployment.model_validate(body)


def slow_world() -> ServingProfile:
    """The roofline plus a large verification cost: speculation loses from batch ~10 on."""
    base = profile_from_setup("slow", policy_config(resource().spec).setup).to_dict()
    base["round_ms"] = {
        g: [ms + int(g) * b * 2.0 for ms, b in zip(row, base["batches"], strict=True)]
        for g, row in base["round_ms"].items()
    }
    return ServingProfile.from_dict(base)


class World:
    """Metrics and model control of one pod serving `profile` at `batch`."""

    def __init__(self, profile: ServingProfile, batch: float) -> None:
        self.profile = profile
        self.batch = batch
        self.length = 3  # what the pod runs

    # MetricsSource
    def register(self, key: Hashable, url: str, backend: str, interval_s: float) -> None:
        pass

    def unregister(self, key: Hashable) -> None:
        pass

    def lookup(self, url: str, backend: str, namespace: str, name: str, variant: str, now: datetime,
               draft_length: int | None = None) -> Measurement:  # fmt: skip
        g = self.length
        tpot = self.profile.round_ms_at(g, self.batch) / 1e3 / expected_tokens(ALPHA, g)
        return Measurement(
            phase="Ok",
            at=now,
            alpha=ALPHA if g else None,
            batch=self.batch,
            tpot_p50_s=tpot,
            tpot_mean_s=tpot,
            pods_reporting=1,
        )

    async def close(self) -> None:
        pass

    # ModelControl (only what the control loop calls)
    async def apply_to_all(self, endpoints: Sequence[PodEndpoint], *, num_draft_tokens: int | None = None,
                           draft_model_name: str | None = None, retries: int = 2,
                           backoff_s: float = 0.2) -> FleetResult:  # fmt: skip
        assert num_draft_tokens is not None
        self.length = num_draft_tokens
        results = [ApplyResult(pod=e.name, ok=True) for e in endpoints]
        return FleetResult(desired=len(endpoints), applied=len(endpoints), changed=0, results=results)


POD = PodEndpoint("pod-0", "default", "127.0.0.1", 8000, "stable")


async def run(loop: ControlLoop, world: World, status: SpeculativeDeploymentStatus, start: int, seconds: int,
              events: list[Any]) -> SpeculativeDeploymentStatus:  # fmt: skip
    sdep = resource()
    for second in range(start, start + seconds):
        result = await loop.tick(sdep, status, [POD], T0 + timedelta(seconds=second), draft_stale=False)
        events.extend(result.events)
        status = result.status
    return status


def fresh() -> SpeculativeDeploymentStatus:
    return SpeculativeDeploymentStatus(phase="Baseline", speculation=SpeculationStatus())


async def test_where_speculation_loses_the_loop_learns_it_and_switches_off() -> None:
    world = World(slow_world(), batch=32)
    assert world.profile.best_length(ALPHA, 32)[0] == 0  # nothing pays at 32 here
    loop = ControlLoop(world, world, rate_window_s=2.0)  # type: ignore[arg-type]
    events: list[Any] = []
    status = await run(loop, world, fresh(), 0, 60, events)
    assert status.speculation.control_phase == "Dynamic"
    assert status.speculation.state == "off" and world.length == 0
    learned = status.speculation.calibration
    assert learned.model_source == "calibrated" and learned.samples > 5
    assert learned.break_even_batch is not None and learned.break_even_batch <= 32
    assert learned.prior_break_even_batch is None or learned.prior_break_even_batch > 100
    reasons = [e.reason for e in events]
    assert "CalibrationMovedBreakEven" in reasons
    assert reasons.count("SpeculationEnabledLowBatch") == 0
    # only batch 32 was measured, and it loses there; the acceptance itself is fine
    assert "SpeculationDisabledLowAcceptance" not in reasons, reasons
    assert reasons[-1] in ("SpeculationDisabledNoMeasuredGain", "SpeculationDisabledHighBatch"), reasons


async def test_a_restart_resumes_the_fit_from_status() -> None:
    world = World(slow_world(), batch=32)
    first = ControlLoop(world, world, rate_window_s=2.0)  # type: ignore[arg-type]
    status = await run(first, world, fresh(), 0, 40, [])
    before = status.speculation.calibration
    # a new operator process: nothing in memory, status as written (through the wire format)
    restarted = ControlLoop(world, world, rate_window_s=2.0)  # type: ignore[arg-type]
    status = SpeculativeDeploymentStatus.from_wire(status.to_wire())
    after = (await run(restarted, world, status, 40, 1, [])).speculation.calibration
    assert after.model_source == "calibrated"
    assert after.samples >= before.samples > 0
    assert after.break_even_batch == before.break_even_batch
    assert after.ledger.elapsed_seconds >= before.ledger.elapsed_seconds
