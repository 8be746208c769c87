"""Acceptance collapse through ControlLoop itself: a fleet whose pods report their own acceptance, one
pod that stops accepting, and what the tick does about it (an Event, the pod deleted, a count in
status); and noisy healthy fleets in which it does nothing.

The world is test_control_loop's World with per-pod measurements: four pods on one draft, each
with its own acceptance; a pod the loop deletes comes back under a new name and incarnation (its
Deployment's doing), with its draft weights loaded again.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime
from typing import Any

from specops.api.status import SpeculativeDeploymentStatus
from specops.domain.acceptance import acceptance_rate_from_alpha
from specops.domain.discovery import PodEndpoint
from specops.domain.metrics import Measurement, PodMeasurement
from specops.domain.perf import expected_tokens
from specops.domain.profile import profile_from_setup
from specops.ports import KubeApiError
from specops.services.control import ControlLoop
from tests.unit.test_control_loop import ALPHA, World, fresh, setup
from tests.unit.test_control_loop import resource as one_resource
from tests.unit.test_control_loop import run as run_world

PODS = 4
COLLAPSE_AT = 60  # seconds: the prior's schedule has rolled out well before


Acceptance = Callable[[str, float], float | None]
"""(pod name, second) -> that pod's per-token alpha (None: it accepts normally, at ALPHA)."""


class Fleet(World):
    """World, pod by pod: each pod's own batch, latency and acceptance."""

    def __init__(self, acceptance: Acceptance, batch: float | Callable[[float], float] = 8.0) -> None:
        super().__init__(profile_from_setup("roofline", setup()), batch)
        self.acceptance = acceptance
        self.names = [f"chat-stable-7d9f-{i}" for i in range(PODS)]
        self.incarnations = {name: f"uid-{name}/0" for name in self.names}
        self.replaced = 0

    def alpha_of(self, pod: str) -> float:
        own = self.acceptance(pod, self.second)
        return ALPHA if own is None else own

    def lookup(self, url: str, backend: str, namespace: str, name: str, variant: str, now: datetime,
               draft_length: int | None = None, draft: str | None = None) -> Measurement:  # fmt: skip
        whole = super().lookup(url, backend, namespace, name, variant, now, draft_length, draft)
        schedule = self.revision.schedule
        per_pod = {}
        for pod in self.names:
            batch = self.batch
            k = schedule.k_at(batch) if schedule is not None else 0
            alpha = self.alpha_of(pod)
            if k > 0:
                rate = acceptance_rate_from_alpha(alpha, k) if alpha > 0 else 0.0
                tpot = self.profile.round_ms_at(k, batch) / 1e3 / expected_tokens(alpha, k)
                per_pod[pod] = PodMeasurement(
                    batch, tpot, drafted_per_s=40.0 * k * batch, acceptance_rate=rate
                )
            else:
                per_pod[pod] = PodMeasurement(batch, whole.tpot_mean_s, drafted_per_s=0.0)
        return Measurement(
            phase="Ok",
            at=now,
            alpha=whole.alpha,
            batch=whole.batch,
            tpot_p50_s=whole.tpot_p50_s,
            tpot_mean_s=whole.tpot_mean_s,
            pods_reporting=PODS,
            per_pod=per_pod,
        )

    def pods(self) -> list[PodEndpoint]:
        return [
            PodEndpoint(
                pod,
                "default",
                "127.0.0.1",
                8000 + i,
                "stable",
                draft="llama-7b-v1",
                incarnation=self.incarnations[pod],
                revision=self.revision.digest,
            )
            for i, pod in enumerate(self.names)
        ]

    def replace_pod(self, pod: str) -> str:
        """The Deployment's answer to a deleted pod: a new one, same revision, a fresh engine."""
        self.replaced += 1
        new = f"chat-stable-7d9f-r{self.replaced}"
        self.names[self.names.index(pod)] = new
        self.incarnations.pop(pod)
        self.incarnations[new] = f"uid-{new}/0"
        return new


class Kube:
    """The KubePort as far as the control loop uses it here: deleting pods (and failing to, if told)."""

    def __init__(self, fleet: Fleet, fail: int = 0) -> None:
        self.fleet = fleet
        self.fail = fail
        self.deleted: list[tuple[str, str, str, str | None]] = []
        self.attempts = 0

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        self.attempts += 1
        if self.fail > 0:
            self.fail -= 1
            raise KubeApiError(403, "Forbidden", f'pods "{name}" is forbidden')
        self.deleted.append((api_version, kind, name, namespace))
        self.fleet.replace_pod(name)
        return True

    async def get(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        return None


async def run(loop: ControlLoop, fleet: Fleet, seconds: int, events: list[Any],
              status: SpeculativeDeploymentStatus | None = None, start: int = 0) -> SpeculativeDeploymentStatus:  # fmt: skip
    sdep = one_resource(PODS, rollout={"baseline": "0s", "soak": "20s"})  # every pod speculates at once
    return await run_world(loop, fleet, status or fresh(), start, seconds, events, sdep)


def collapses(events: list[Any]) -> list[Any]:
    return [e for e in events if e.reason == "AcceptanceCollapsed"]


async def test_a_pod_whose_acceptance_collapses_is_deleted_once_and_counted() -> None:
    # Given four pods on one draft; from COLLAPSE_AT on, pod 1 accepts nothing (its draft weights lost)
    broken = "chat-stable-7d9f-1"
    fleet = Fleet(lambda pod, second: 0.0 if pod == broken and second >= COLLAPSE_AT else None)
    kube = Kube(fleet)
    loop = ControlLoop(fleet, rate_window_s=2.0, kube=kube)  # type: ignore[arg-type]
    events: list[Any] = []
    status = await run(loop, fleet, COLLAPSE_AT, events)
    assert status.speculation.state == "on"  # the pods speculate before the collapse
    assert not collapses(events) and status.speculation.acceptance_collapses == 0

    # When two intervals pass with pod 1 at 0 while its neighbours accept normally
    status = await run(loop, fleet, 1, events, status, start=COLLAPSE_AT)
    assert not collapses(events) and not kube.deleted  # one low interval is not enough
    status = await run(loop, fleet, 1, events, status, start=COLLAPSE_AT + 1)

    # Then a Warning Event names the pod and the numbers, the pod is deleted, and status counts it
    (event,) = collapses(events)
    assert event.type == "Warning"
    assert broken in event.message and "accepted 0.000" in event.message
    schedule = fleet.revision.schedule
    assert schedule is not None
    healthy = acceptance_rate_from_alpha(ALPHA, schedule.k_at(fleet.batch))
    assert "3 neighbour(s)" in event.message and f"{healthy:.2f} (median)" in event.message
    assert "deleted the pod" in event.message and fleet.revision.digest in event.message
    assert kube.deleted == [("v1", "Pod", broken, "default")]
    assert status.speculation.acceptance_collapses == 1
    assert status.to_wire()["speculation"]["acceptanceCollapses"] == 1

    # And the fresh pod that replaced it accepts again: nothing more happens, the count holds
    assert broken not in fleet.names
    status = await run(loop, fleet, 60, events, status, start=COLLAPSE_AT + 2)
    assert len(collapses(events)) == 1 and len(kube.deleted) == 1
    assert status.speculation.acceptance_collapses == 1


async def test_a_pod_that_cannot_be_deleted_is_reported_once_and_retried() -> None:
    # Given the collapse, and an API server that refuses the first two deletions
    broken = "chat-stable-7d9f-2"
    fleet = Fleet(lambda pod, second: 0.0 if pod == broken and second >= COLLAPSE_AT else None)
    kube = Kube(fleet, fail=2)
    loop = ControlLoop(fleet, rate_window_s=2.0, kube=kube)  # type: ignore[arg-type]
    events: list[Any] = []
    status = await run(loop, fleet, COLLAPSE_AT + 2, events)
    (event,) = collapses(events)
    assert "deleting the pod failed (403 Forbidden" in event.message
    assert f"kubectl -n default delete pod {broken}" in event.message
    # Then the deletion is tried again each tick, with no second Event nor count
    status = await run(loop, fleet, 5, events, status, start=COLLAPSE_AT + 2)
    assert kube.attempts == 3 and kube.deleted == [("v1", "Pod", broken, "default")]
    assert len(collapses(events)) == 1 and status.speculation.acceptance_collapses == 1


async def test_a_plain_fleet_and_a_fleet_wide_drop_are_not_collapses() -> None:
    # Given every pod's acceptance dropping together (a draft that no longer fits the traffic)
    fleet = Fleet(lambda pod, second: 0.01 if second >= COLLAPSE_AT else None)
    kube = Kube(fleet)
    loop = ControlLoop(fleet, rate_window_s=2.0, kube=kube)  # type: ignore[arg-type]
    events: list[Any] = []
    status = await run(loop, fleet, COLLAPSE_AT + 30, events)
    # Then no pod is singled out: that is the AcceptanceBelowSLO condition's business
    assert not collapses(events) and not kube.deleted and status.speculation.acceptance_collapses == 0


async def test_a_healthy_noisy_fleet_raises_no_false_alarm() -> None:
    # Given four healthy pods whose acceptance is noisy, whose load swings across bands (K=0 at
    # heavy batches where the schedule says so, no drafts then), and one pod whose window dips once
    # (a window straddling a short stall)
    rng = random.Random(7)
    noise = {}

    def acceptance(pod: str, second: float) -> float | None:
        key = (pod, second)
        if key not in noise:
            noise[key] = min(0.95, max(0.3, ALPHA + rng.gauss(0.0, 0.08)))
        if pod.endswith("-3") and second == 102:  # at batch 4, where the schedule drafts
            return 0.0  # one low window only
        return noise[key]

    fleet = Fleet(acceptance, batch=lambda second: (4.0, 12.0, 48.0, 160.0, 600.0)[int(second // 10) % 5])
    kube = Kube(fleet)
    loop = ControlLoop(fleet, rate_window_s=2.0, kube=kube)  # type: ignore[arg-type]
    events: list[Any] = []
    status = await run(loop, fleet, 400, events)
    assert status.speculation.state == "on"
    assert not collapses(events) and not kube.deleted and status.speculation.acceptance_collapses == 0
