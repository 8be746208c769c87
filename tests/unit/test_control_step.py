"""The control decision as one pure step: given a record, a snapshot and the time, the exact next record
and actions (table-style, as the canary step is tested)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specops.api.status import HoldbackStatus, SpeculationStatus, SpeculativeDeploymentStatus
from specops.domain import control_status as cs
from specops.domain import learning
from specops.domain.acceptance import acceptance_rate_from_alpha
from specops.domain.control_step import NOTHING, ControlState, Snapshot, restart_event, step
from specops.domain.discovery import PodEndpoint
from specops.domain.engines.schedule import PLAIN, Revision, Schedule
from specops.domain.metrics import REASON_NO_METRICS, Measurement, PodMeasurement
from specops.domain.revision_policy import BAND_EDGES
from specops.domain.revision_step import StepState, config_from_spec
from tests.unit.test_control_loop import resource

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PODS = 4
ALPHA = 0.8


SPEC = resource(PODS, rollout={"baseline": "60s", "soak": "60s"}, reconfigure={"minInterval": "300s"}).spec
CONFIG = config_from_spec(SPEC, SPEC.draft)
LEARN = cs.learning_config(SPEC, 60.0)
SPECULATING = Revision("spec", CONFIG.method, CONFIG.draft, Schedule.constant(3))  # type: ignore[arg-type]


def pods(revision: Revision, *, stale: int = 0) -> tuple[PodEndpoint, ...]:
    """PODS ready stable pods on ``revision`` (the first ``stale`` still on plain)."""
    return tuple(
        PodEndpoint(
            f"chat-{i}",
            "default",
            "127.0.0.1",
            8000 + i,
            "stable",
            draft="d",
            incarnation=f"uid-{i}/0",
            revision=(PLAIN if i < stale else revision).digest,
        )
        for i in range(PODS)
    )


def measured(
    at: datetime, *, batch: float = 8.0, tpot_s: float = 0.012, rates: dict[str, float] | None = None
) -> Measurement:
    """One poll: every pod at ``batch`` and ``tpot_s``; ``rates``: a pod's own acceptance rate."""
    rate = acceptance_rate_from_alpha(ALPHA, 3)
    per_pod = {
        f"chat-{i}": PodMeasurement(batch, tpot_s, 50.0, (rates or {}).get(f"chat-{i}", rate))
        for i in range(PODS)
    }
    return Measurement(
        phase="Ok", at=at, alpha=ALPHA, batch=batch, tpot_p50_s=tpot_s, tpot_mean_s=tpot_s, per_pod=per_pod
    )


def held_back(revision: Revision) -> dict[str, Any]:
    """A baseline's pods: all stable pods but one on ``revision``, one plain holdback pod."""
    holdback = PodEndpoint("chat-held", "default", "127.0.0.1", 8100, "holdback", revision=PLAIN.digest)
    return {"pods": pods(revision)[: PODS - 1], "held": (holdback,)}


def shown(decision: StepState) -> SpeculativeDeploymentStatus:
    """A status that shows ``decision`` (as the last step wrote it)."""
    speculation = SpeculationStatus(
        control_phase=decision.phase,
        phase_since=decision.phase_since,
        revision=cs.revision_to_status(decision.revision),
        last_change_time=decision.last_change,
        holdback=HoldbackStatus(since=decision.phase_since) if decision.holdback else None,
    )
    return SpeculativeDeploymentStatus(phase="Dynamic", speculation=speculation)


def snapshot(
    decision: StepState, poll: Measurement, serving: tuple[PodEndpoint, ...] = (), **changes: Any
) -> Snapshot:
    base = Snapshot(
        "u-1",
        CONFIG,
        LEARN,
        shown(decision),
        poll,
        serving,
        PODS,
        min_acceptance=0.3,
    )
    return replace(base, **changes)


def record(decision: StepState, **changes: Any) -> ControlState:
    return replace(ControlState("u-1", decision, learning.LearningState()), **changes)


def seconds_at(batch: float) -> tuple[float, ...]:
    """The load seen: an hour at ``batch``'s band."""
    return tuple(3600.0 if edge == min(e for e in BAND_EDGES if e >= batch) else 0.0 for edge in BAND_EDGES)


BASELINE = StepState(
    phase="Baseline", phase_since=T0, revision=SPECULATING, last_change=T0, decided_at=T0, holdback=True
)
"""All pods but one speculate, one is held back plain, since T0."""
DYNAMIC = StepState("Dynamic", T0, SPECULATING, T0, ALPHA, seconds_at(8.0), T0 + timedelta(hours=1))
"""Speculating for an hour at batch 8, the last change an hour ago."""
LATER = T0 + timedelta(hours=1, seconds=15)
POLL = measured(LATER)


@dataclass(frozen=True)
class Case:
    name: str
    state: ControlState | None
    snapshot: Snapshot
    now: datetime
    reason: str | None
    """status.speculation.reason after the step (None: nothing decided, no status)."""
    roll_to: str | None = None
    """The mode of the revision to render (None: none)."""
    event_reasons: tuple[str, ...] = ()
    conditions: dict[str, str] = field(default_factory=dict)
    """Condition type -> status among the actions' condition updates."""


def decided_on(state: ControlState, poll: Snapshot, now: datetime) -> ControlState:
    """``state`` as the step leaves it after deciding on ``poll`` at ``now``."""
    after, _ = step(state, poll, now)
    return after


SLOW = measured(LATER, tpot_s=0.02)  # slower than plain at batch 8, where plain measured 10 ms
SLOW_ANCHORS = {8.0: learning.Anchor(plain_s=0.010, k=3, round_s=0.02 * 2.952)}
COLLAPSING = {"chat-0": 0.0}


CASES = [
    Case(
        "a new resource starts from status: the prior's schedule beside a plain holdback pod, rendered",
        None,
        snapshot(BASELINE, measured(T0), pods(PLAIN), status=SpeculativeDeploymentStatus()),
        T0,
        "Baseline",
        roll_to="spec",
        conditions={"MetricsUnavailable": "False", "SpeculationApplied": "False"},
    ),
    Case(
        "the same poll again with no timer due: the fast path, nothing decided",
        decided_on(
            record(BASELINE),
            snapshot(BASELINE, measured(T0), **held_back(SPECULATING)),
            T0 + timedelta(seconds=15),
        ),
        snapshot(BASELINE, measured(T0), **held_back(SPECULATING)),
        T0 + timedelta(seconds=30),
        None,
    ),
    Case(
        "the same poll once the baseline's time is up: decided in full, the holdback pod speculates too",
        decided_on(
            record(replace(BASELINE, baseline=replace(BASELINE.baseline, samples=5))),
            snapshot(BASELINE, measured(T0), **held_back(SPECULATING)),
            T0 + timedelta(seconds=15),
        ),
        snapshot(BASELINE, measured(T0), **held_back(SPECULATING)),
        T0 + timedelta(seconds=61),
        "BaselineRecorded",
        roll_to="spec",
        event_reasons=("BaselineRecorded",),
    ),
    Case(
        "a rollout waiting: one pod still plain, nothing else rolls",
        record(replace(DYNAMIC, revision=PLAIN)),
        snapshot(replace(DYNAMIC, revision=PLAIN), POLL, pods(SPECULATING, stale=1)),
        LATER,
        "RolloutRunning",
        conditions={"SpeculationApplied": "False"},
    ),
    Case(
        "a measured slowdown: speculation slower than plain where the load is, replaced at once",
        record(DYNAMIC, anchors=SLOW_ANCHORS, knowledge=learning.LearningState()),
        snapshot(DYNAMIC, SLOW, pods(SPECULATING)),
        LATER,
        "MeasuredSlowdown",
        roll_to="plain",
        event_reasons=("MeasuredSlowdown",),
    ),
    Case(
        "a metrics outage: the revision holds and the condition says why",
        record(DYNAMIC),
        snapshot(DYNAMIC, Measurement.failed(LATER, REASON_NO_METRICS, "no metrics"), pods(SPECULATING)),
        LATER,
        None,
        conditions={"MetricsUnavailable": "True", "SpeculationApplied": "True"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_one_step(case: Case) -> None:
    after, actions = step(case.state, case.snapshot, case.now)
    assert (actions.roll_to.mode if actions.roll_to else None) == case.roll_to
    # the decision's Events (a first break-even announcement may come with them)
    assert {e.reason for e in actions.events} - {"CalibrationMovedBreakEven"} == set(case.event_reasons)
    got = {c.type: c.status for c in actions.conditions}
    assert {k: got.get(k) for k in case.conditions} == case.conditions
    if case.reason is None and not case.conditions:
        assert actions == NOTHING and after is case.state
    elif case.reason is not None:
        assert actions.status is not None and actions.status.speculation.reason == case.reason
    if actions.roll_to is not None:  # the status names the revision rendered, and the record follows
        assert actions.status is not None and actions.status.speculation.revision is not None
        assert actions.status.speculation.revision.digest == actions.roll_to.digest
        assert after.decision.revision == actions.roll_to and after.shown_by(actions.status)
    if case.roll_to == "spec" and case.state is None:  # the first: the prior's at draftLength.initial
        assert actions.roll_to is not None and actions.roll_to.schedule is not None
        assert actions.roll_to.schedule.k_at(1) == CONFIG.initial_k


def following(
    poll: Snapshot, status: SpeculativeDeploymentStatus | None, at: datetime, **measure: Any
) -> Snapshot:
    """The next tick's snapshot: the status the last step wrote, a new poll at ``at``."""
    return replace(poll, status=status or poll.status, measurement=measured(at, **measure))


def test_a_collapsed_pod_is_restarted_once_with_its_evidence_and_counted() -> None:
    state: ControlState | None = record(DYNAMIC)
    poll = snapshot(DYNAMIC, POLL, pods(SPECULATING))
    restarted = []
    for second in (15, 30, 45, 60):
        now = LATER + timedelta(seconds=second)
        poll = following(poll, None, now, rates=COLLAPSING)
        state, actions = step(state, poll, now)
        state = state.retrying({})  # every delete succeeded
        poll = replace(poll, status=actions.status or poll.status)
        restarted += [(second, r.pod, r.collapse is not None) for r in actions.restarts]
        if actions.restarts:
            assert actions.status is not None and actions.status.speculation.acceptance_collapses == 1
            event = restart_event(actions.restarts[0], "default", None)
            assert event is not None and event.type == "Warning" and "accepted 0.000" in event.message
            assert "deleted the pod" in event.message
    # two low intervals in a row against neighbours that accept: restarted at the second, and once
    # an incarnation (the same engine reading low again is not restarted again)
    assert restarted == [(30, "chat-0", True)]


def test_a_restart_that_failed_is_tried_again_until_the_pod_is_gone() -> None:
    state = record(DYNAMIC, restarts={"chat-0": "uid-0/0"})
    poll = snapshot(DYNAMIC, POLL, pods(SPECULATING))
    state, actions = step(state, poll, LATER)
    assert [(r.pod, r.collapse) for r in actions.restarts] == [("chat-0", None)]
    poll = replace(poll, status=actions.status or poll.status)
    state = state.retrying({"chat-0": "uid-0/0"})  # the delete failed
    # the same poll again: no fast path while a restart is owed
    state, again = step(state, poll, LATER + timedelta(seconds=15))
    assert [r.pod for r in again.restarts] == ["chat-0"]
    # once the pod runs a new incarnation, nothing is owed
    fresh = tuple(replace(p, incarnation="uid-0/1") if p.name == "chat-0" else p for p in poll.pods)
    later = LATER + timedelta(seconds=30)
    _, done = step(state, replace(following(poll, again.status, later), pods=fresh), later)
    assert done.restarts == ()


def test_a_record_that_status_no_longer_shows_takes_the_decision_from_status() -> None:
    # Given status showing a revision changed a minute ago, and a record ahead of it (its own
    # change's status write never landed)
    written = replace(DYNAMIC, last_change=LATER - timedelta(seconds=60))
    ahead = record(replace(written, revision=PLAIN, last_change=LATER - timedelta(seconds=30)))
    poll = snapshot(written, POLL, pods(SPECULATING))
    assert not ahead.shown_by(poll.status)
    after, actions = step(ahead, poll, LATER)
    # Then the step decides from what status shows: the revision in status holds (too soon to change)
    assert actions.roll_to is None and after.decision.revision == SPECULATING
    assert after.decision.last_change == written.last_change and after.shown_by(poll.status)


def test_the_break_even_shown_is_worked_out_again_once_a_minute_and_at_a_change() -> None:
    # Given a speculating fleet whose polls move the fit a little every 15 s
    state: ControlState | None = record(DYNAMIC)
    poll = snapshot(DYNAMIC, POLL, pods(SPECULATING))
    worked_out = []
    for second in range(0, 136, 15):
        now = LATER + timedelta(seconds=second)
        poll = following(poll, None, now, batch=8.0 + second / 15.0, tpot_s=0.012 + second / 1e5)
        state, actions = step(state, poll, now)
        assert state.curve is not None and actions.status is not None
        calibration = actions.status.speculation.calibration
        # status shows the break-even last worked out, never a stale mix
        assert calibration.break_even_batch == state.curve.break_even
        assert calibration.break_even_band == list(state.curve.band)
        worked_out.append((state.curve.at - LATER).total_seconds())
        poll = replace(poll, status=actions.status)
    # Then it is worked out at the first step and again once CURVE_REFRESH_S has passed
    assert sorted(set(worked_out)) == [0.0, 60.0, 120.0]
    # And a decision that changes the revision works it out at once for the new one
    changed = replace(DYNAMIC, revision=PLAIN)
    assert state is not None
    moved, _ = step(
        replace(state, decision=changed, digest=None), snapshot(changed, POLL), LATER + timedelta(seconds=140)
    )
    assert moved.curve is not None and moved.curve.revision == moved.decision.revision.digest
