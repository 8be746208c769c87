"""Resources at rest: in a large fleet a settled resource is not decided in full every interval.

A tick may rest (write nothing, solve nothing) only while the last decision was steady, the policy
decides the same on the measurement now, the slowdown guard counts no slow reading (where it is
blind, the token latency reads no slower), the same pods serve,
the resource is unchanged and its last status write landed; and only as many ticks in a row as
SETTLED_DECISIONS_PER_S allows for the fleet's size. Anything that would decide differently is
decided at once. Small fleets never rest: the operator then behaves as it always did.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from specops.domain import learning
from specops.domain.calibration import CalibratedModel
from specops.domain.discovery import PodEndpoint, ready_endpoints
from specops.domain.metrics import Measurement
from specops.ports import KubeApiError
from specops.services import tick as tick_module
from specops.services.control import ControlLoop
from specops_local.cluster import EmulatedCluster
from specops_local.model_control import AcceptingModelControl
from tests.component import test_tick_requests as tick_requests
from tests.component.test_tick_requests import (
    NAME,
    NAMESPACE,
    SteadyMetrics,
    _walk,
    counted_services,
    serve_into_dynamic,
)


class MovableMetrics(SteadyMetrics):
    """The steady measurement, whose batch the test can move."""

    def __init__(self) -> None:
        super().__init__()
        self.batch = 4.0
        self.tpot_s: float | None = 0.01
        self.tpot_mean_s: float | None = None
        self.outage = False

    def lookup(self, *args: Any, **kwargs: Any) -> Measurement:
        measured = super().lookup(*args, **kwargs)
        if self.outage:
            return Measurement.failed(measured.at, "PrometheusUnreachable", "connection refused")
        return replace(measured, batch=self.batch, tpot_p50_s=self.tpot_s, tpot_mean_s=self.tpot_mean_s)


def _serving(cluster: EmulatedCluster) -> list[PodEndpoint]:
    return ready_endpoints(cluster.objects("pods", NAMESPACE))


class Ticker:
    """Ticks the resource as the daemon does: from the body its last tick ended on, with its pods."""

    def __init__(self, services: Any, cluster: EmulatedCluster, now: datetime) -> None:
        self.services, self.cluster, self.now = services, cluster, now
        self.watched = cluster.get("speculativedeployments", NAME)
        self.serving = _serving(cluster)

    async def ticks(self, count: int) -> list[Any]:
        outcomes = []
        for _ in range(count):
            self.now += timedelta(seconds=1)
            outcome = await self.services.tick(
                NAMESPACE, NAME, lambda at=self.now: at, self.watched, self.serving
            )
            self.watched = outcome.body or self.watched
            outcomes.append(outcome)
        return outcomes

    async def until_rested(self, limit: int = 6) -> list[Any]:
        outcomes: list[Any] = []
        while not (outcomes and outcomes[-1].rested):
            assert len(outcomes) < limit, f"no tick rested: {_decided(outcomes)}"
            outcomes += await self.ticks(1)
        return outcomes


async def _settled(
    cluster: EmulatedCluster, tpot_mean_s: float | None = None
) -> tuple[Any, Any, MovableMetrics, Ticker]:
    """A serving resource in Dynamic on steady metrics, ticked until a tick rests (with the budget
    of `large_fleet`, two more may); ``tpot_mean_s``: the mean token latency its engine measures
    from the start (None: it measures none)."""
    services, counts = await counted_services(cluster)
    metrics = MovableMetrics()
    metrics.tpot_mean_s = tpot_mean_s
    for service in _walk(services):
        if hasattr(service, "metrics"):
            service.metrics = metrics
    now = await serve_into_dynamic(cluster, services)
    ticker = Ticker(services, cluster, now)
    await ticker.until_rested()
    return services, counts, metrics, ticker


@pytest.fixture
def large_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget one resource at 1 s intervals gets in a fleet of 3,500 at 1,000 decisions a
    second: at most 3 ticks at rest in a row (1 / (SETTLED_DECISIONS_PER_S x 1 s) = 3.5)."""
    monkeypatch.setattr(tick_module, "SETTLED_DECISIONS_PER_S", 1 / 3.5)


def _guard_blind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slowdown guard blind at every batch (plain speed never measured near it), counting nothing."""
    monkeypatch.setattr(
        learning,
        "guard",
        lambda state, *args: learning.GuardVerdict(replace(state, slowdown_streak=0), blind=True),
    )


def _decided(outcomes: list[Any]) -> list[bool]:
    return [not outcome.rested for outcome in outcomes]


def _full_decisions(monkeypatch: pytest.MonkeyPatch) -> list[datetime]:
    """The moments of every full decision (`ControlLoop.tick`) from now on, as they happen."""
    decisions: list[datetime] = []
    control_tick = ControlLoop.tick

    async def counting(self: ControlLoop, *args: Any, **kwargs: Any) -> Any:
        decisions.append(args[3])
        return await control_tick(self, *args, **kwargs)

    monkeypatch.setattr(ControlLoop, "tick", counting)
    return decisions


async def test_a_settled_resource_in_a_large_fleet_rests_between_decisions_and_writes_nothing(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a settled resource whose measurement does not move, in a fleet whose budget allows 3 rests
    services, counts, _, ticker = await _settled(cluster)
    decisions = _full_decisions(monkeypatch)
    before = cluster.get("speculativedeployments", NAME)
    try:
        # When it ticks 12 more times
        counts.clear()
        outcomes = await ticker.ticks(12)
    finally:
        await services.close()

    # Then it decides every fourth tick and rests between, with no API request while at rest
    decided = _decided(outcomes)
    print("decided:", decided, "requests:", dict(counts))
    assert decided.count(True) == 3 and len(decisions) == 3, decided
    assert all(decided[i] for i in range(len(decided)) if i >= 3 and not any(decided[i - 3 : i])), decided
    assert not any(outcome.events for outcome in outcomes)
    # and its decision stands as it was: speculation on at the same length
    after = cluster.get("speculativedeployments", NAME)
    assert before is not None and after is not None
    assert after["status"]["speculation"]["draftLength"] == before["status"]["speculation"]["draftLength"] > 0
    assert counts["PATCH status"] <= 1, dict(counts)  # a refresh of the measurements at most


async def test_a_measurement_that_moves_the_decision_is_decided_at_once(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None
) -> None:
    # Given a settled resource at rest, speculating at batch 4
    services, _, metrics, ticker = await _settled(cluster)
    try:
        # When its batch moves beyond its noise but not far enough to change the decision (4 to 6)
        metrics.batch = 6.0
        small_move = await ticker.ticks(1)
        # and then past break-even (400 running requests)
        metrics.batch = 400.0
        large_move = await ticker.ticks(1)
    finally:
        await services.close()

    # Then the first still rests (the policy decides the same on it), the second decides at once,
    # though the budget allowed another rest: off, held only by the minimum dwell since switching on
    assert _decided(small_move) == [False]
    assert _decided(large_move) == [True]
    speculation = large_move[0].status["speculation"]
    assert (
        speculation["reason"] == "HeldMinDwell" and "Would switch speculation off" in speculation["message"]
    )


async def test_a_decision_waiting_on_a_clock_rests_and_its_switch_is_decided_at_once(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a settled resource at rest, speculating, whose batch jumps past break-even: off is
    # held by the minimum dwell since speculation went on (a decision in full)
    services, _, metrics, ticker = await _settled(cluster)
    decisions = _full_decisions(monkeypatch)
    try:
        metrics.batch = 400.0
        held = await ticker.ticks(1)
        ended_by_the_jump = services.ticker.rest_ends["decision"]
        # When it ticks on while the dwell runs
        waiting = await ticker.ticks(2)
        decided_while_waiting, ended_while_waiting = len(decisions), services.ticker.rest_ends["decision"]
        # and once the dwell has run out
        ticker.now += timedelta(minutes=1)
        switched = await ticker.ticks(1)
    finally:
        await services.close()

    # Then the held decision rests while it waits (it would say the same every interval), looked
    # at every interval with its clock moved
    assert _decided(held) == [True] and held[0].status["speculation"]["reason"] == "HeldMinDwell"
    assert _decided(waiting) == [False, False] and decided_while_waiting == 1
    assert ended_while_waiting == ended_by_the_jump == 1
    # and the look that finds the wait over hands the switch to a full tick at once
    assert _decided(switched) == [True] and len(decisions) == 2
    assert services.ticker.rest_ends["decision"] == 2
    speculation = switched[0].status["speculation"]
    assert speculation["reason"] == "SpeculationDisabledHighBatch" and speculation["state"] == "off", (
        speculation
    )


@pytest.mark.parametrize(
    ("blind", "tpot_s", "decided"),
    [(True, 0.012, True), (False, 0.012, False), (True, None, False)],
    ids=["guard-blind", "guard-sees", "latency-gone"],
)
async def test_a_slower_token_latency_is_decided_at_once_only_where_the_slowdown_guard_is_blind(
    cluster: EmulatedCluster,
    operator_env: None,
    large_fleet: None,
    monkeypatch: pytest.MonkeyPatch,
    blind: bool,
    tpot_s: float | None,
    decided: bool,
) -> None:
    # Given a settled resource at rest, whose slowdown guard is blind at its batch (plain speed never
    # measured near it) or sees and finds speculation still faster than plain
    services, _, metrics, ticker = await _settled(cluster)
    verdicts: list[learning.GuardVerdict] = []

    def guard(state: learning.LearningState, *args: Any) -> learning.GuardVerdict:
        verdicts.append(learning.GuardVerdict(replace(state, slowdown_streak=0), blind=blind))
        return verdicts[-1]

    monkeypatch.setattr(learning, "guard", guard)
    try:
        # When its median token latency reads 20 % slower at the same batch (or is gone)
        metrics.tpot_s = tpot_s
        slower = await ticker.ticks(1)
        # and then the guard counts a reading toward a slowdown
        monkeypatch.setattr(
            learning, "guard", lambda state, *args: learning.GuardVerdict(replace(state, slowdown_streak=1))
        )
        counted = await ticker.ticks(1)
    finally:
        await services.close()

    # Then a blind guard's slower reading decides in full (a new solve of the model is what could see
    # it), though the policy alone would decide the same; a slower reading the guard judged keeps
    # the rest, as does a latency gone (nothing, a full tick included, could judge it)
    assert verdicts and _decided(slower) == [decided]
    # and a reading the guard counts toward a slowdown decides at once
    assert _decided(counted) == [True]


async def test_where_the_mean_token_latency_is_measured_a_blind_guards_tripwire_reads_the_mean(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a settled resource at rest whose engine measures the mean token latency (the histogram's
    # sum over its count), its slowdown guard blind at its batch
    _guard_blind(monkeypatch)
    services, _, metrics, ticker = await _settled(cluster, tpot_mean_s=0.01)
    try:
        # When the median reads 20 % slower while the mean holds (the median is interpolated within
        # a histogram bucket: a bucket's edges are further apart than the tolerance)
        metrics.tpot_s = 0.012
        median_only = await ticker.ticks(1)
        # and then the mean reads 20 % slower
        metrics.tpot_mean_s = 0.012
        mean_too = await ticker.ticks(1)
    finally:
        await services.close()

    # Then the median alone keeps the rest, and the mean ends it: a full tick solves the model on it
    assert _decided(median_only) == [False]
    assert _decided(mean_too) == [True]
    assert services.ticker.rest_ends["slower-unguarded"] == 1


async def test_a_latency_reading_gone_keeps_the_rest_and_one_come_back_slower_ends_it_where_the_guard_is_blind(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a settled resource at rest whose engine measures the mean token latency, speculating,
    # its slowdown guard blind at its batch, in a fleet that allows it 10 rests in a row
    _guard_blind(monkeypatch)
    monkeypatch.setattr(tick_module, "SETTLED_DECISIONS_PER_S", 1 / 10.5)
    services, _, metrics, ticker = await _settled(cluster, tpot_mean_s=0.01)
    try:
        # When a cycle's latency quantiles time out (at 2,000 pods the costliest queries; the
        # cycle stands without them) while the mean is read
        metrics.tpot_s = None
        quantiles_gone = await ticker.ticks(1)
        # and then the mean is gone too, for two cycles (no request finished in the window)
        metrics.tpot_mean_s = None
        mean_gone = await ticker.ticks(2)
        # and then it comes back as it was
        metrics.tpot_mean_s = 0.01
        back = await ticker.ticks(1)
        # and then 20 % slower
        metrics.tpot_mean_s = 0.012
        slower = await ticker.ticks(1)
    finally:
        await services.close()

    # Then the rest holds through both outages and the reading's return (a full tick would decide
    # the same and learn nothing meanwhile), and a slower reading after it still ends the rest: it
    # is compared with the decision's own reading
    assert _decided(quantiles_gone) == [False]
    assert _decided(mean_gone) == [False, False]
    assert _decided(back) == [False]
    assert _decided(slower) == [True]
    assert services.ticker.rest_ends["latency-reading"] == 0
    assert services.ticker.rest_ends["slower-unguarded"] == 1


async def test_a_blind_guards_tripwire_expects_the_latency_a_heavier_batch_brings(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a settled resource at rest, speculating, its slowdown guard blind at its batch, whose
    # model's round time here grows in proportion to the batch
    _guard_blind(monkeypatch)
    monkeypatch.setattr(CalibratedModel, "step_s", lambda self, length, batch, context=None: batch * 1e-3)
    services, _, metrics, ticker = await _settled(cluster)
    try:
        # When the batch moves from 4 to 6 (the decision stays) and the latency reads 20 % slower:
        # less than the 50 % the heavier batch brings
        metrics.batch, metrics.tpot_s = 6.0, 0.012
        explained = await ticker.ticks(1)
        # and then 80 % slower at the same batch: more than it brings
        metrics.tpot_s = 0.018
        unexplained = await ticker.ticks(1)
    finally:
        await services.close()

    # Then the first keeps the rest and the second ends it
    assert _decided(explained) == [False]
    assert _decided(unexplained) == [True]
    assert services.ticker.rest_ends["slower-unguarded"] == 1


async def test_a_pod_that_leaves_or_a_spec_that_changes_is_decided_at_once(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None
) -> None:
    # Given a settled resource at rest
    services, _, _, ticker = await _settled(cluster)
    try:
        # When one of its pods stops serving
        ticker.serving = ticker.serving[1:]
        after_pod = await ticker.ticks(1)
        # and, once at rest again, its resource changes (a new resourceVersion)
        await ticker.until_rested()
        ticker.watched = cluster.emulator.patch_object(
            cluster.resource("speculativedeployments"),
            NAMESPACE,
            NAME,
            {"metadata": {"labels": {"team": "serving"}}},
        )
        after_change = await ticker.ticks(1)
    finally:
        await services.close()

    # Then each is decided at the next tick
    assert _decided(after_pod) == [True]
    assert _decided(after_change) == [True]


async def test_a_pod_whose_serving_container_restarted_is_decided_and_set_again_at_once(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a settled resource at rest, whose pods' settings the model control records
    services, _, _, ticker = await _settled(cluster)
    applied: list[tuple[tuple[str, str], ...]] = []
    apply_to_all = AcceptingModelControl.apply_to_all

    async def recording(self: AcceptingModelControl, endpoints: Any, **kwargs: Any) -> Any:
        applied.append(tuple((e.name, e.incarnation) for e in endpoints))
        return await apply_to_all(self, endpoints, **kwargs)

    monkeypatch.setattr(AcceptingModelControl, "apply_to_all", recording)
    try:
        # When its first pod's serving container restarts between two ticks (same pod, same name:
        # it read its model configuration from the repository again)
        first = ticker.serving[0]
        restarted = replace(first, incarnation=f"{first.incarnation.split('/')[0]}/1")
        assert restarted.incarnation != first.incarnation
        ticker.serving = [restarted, *ticker.serving[1:]]
        after_restart = await ticker.ticks(1)
    finally:
        await services.close()

    # Then the next tick is decided in full and sets the restarted container again
    assert _decided(after_restart) == [True]
    assert applied and (restarted.name, restarted.incarnation) in applied[-1], applied


@pytest.mark.parametrize("routed", [False, True], ids=["replica-ratio", "gateway-api"])
async def test_a_resource_whose_route_is_checked_at_every_full_tick_is_decided_in_full_at_the_route_checks_pace(
    cluster: EmulatedCluster, operator_env: None, monkeypatch: pytest.MonkeyPatch, routed: bool
) -> None:
    # Given a settled resource in a fleet whose budget allows 7 rests in a row, and 3 to a resource
    # routed through Gateway API (its full tick checks the user's route points at no canary Service)
    monkeypatch.setattr(tick_module, "SETTLED_DECISIONS_PER_S", 1 / 7.5)
    monkeypatch.setattr(tick_module, "ROUTE_CHECKS_PER_S", 1 / 3.5)
    plain_resource = tick_requests._resource

    def resource() -> dict[str, Any]:
        body = plain_resource()
        if routed:
            body["spec"]["canary"] = {"trafficRouting": {"gatewayAPI": {"httpRoute": "chat"}}}
        return body

    monkeypatch.setattr(tick_requests, "_resource", resource)
    services, _, _, ticker = await _settled(cluster)
    try:
        # When it ticks 16 more times on a measurement that does not move
        decided = _decided(await ticker.ticks(16))
    finally:
        await services.close()

    # Then it rests at most 3 ticks in a row when routed, 7 otherwise, between full decisions
    longest = max(len(run) for run in "".join("d" if d else "r" for d in decided).split("d"))
    assert longest == (3 if routed else 7), decided


async def test_a_small_fleet_never_rests(
    cluster: EmulatedCluster, operator_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a resource that rests in a large fleet's budget, alone under the default budget (30
    # settled decisions a second: a fleet of one at 1 s intervals may not rest)
    default = tick_module.SETTLED_DECISIONS_PER_S
    monkeypatch.setattr(tick_module, "SETTLED_DECISIONS_PER_S", 1 / 3.5)
    services, _, _, ticker = await _settled(cluster)
    monkeypatch.setattr(tick_module, "SETTLED_DECISIONS_PER_S", default)
    try:
        # When it ticks 10 more times on a measurement that does not move
        outcomes = await ticker.ticks(10)
    finally:
        await services.close()

    # Then every tick decides, as before resting existed
    assert all(_decided(outcomes)), _decided(outcomes)


async def test_a_status_write_that_failed_never_leaves_a_resource_at_rest(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a settled resource whose metrics were out for one tick (MetricsUnavailable=True written)
    services, _, metrics, ticker = await _settled(cluster)
    try:
        metrics.outage = True
        assert _decided(await ticker.ticks(1)) == [True]
        metrics.outage = False
        # When they are back, but every status write of that tick fails (the API server answers 503)
        patch = type(services.kube).patch

        async def failing(self: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("subresource") == "status":
                raise KubeApiError(503, "ServiceUnavailable", "etcd leader changed")
            return await patch(self, *args, **kwargs)

        monkeypatch.setattr(type(services.kube), "patch", failing)
        unwritten = await ticker.ticks(1)
        monkeypatch.setattr(type(services.kube), "patch", patch)
        retried = await ticker.ticks(1)
    finally:
        await services.close()

    # Then the tick after the failed write decides in full, though its decision is steady, and
    # the condition reaches status at once, not after a rest
    assert _decided(unwritten) == [True] and _decided(retried) == [True]
    stored = cluster.get("speculativedeployments", NAME)
    assert stored is not None
    unavailable = next(c for c in stored["status"]["conditions"] if c["type"] == "MetricsUnavailable")
    assert unavailable["status"] == "False", unavailable


async def test_a_setting_that_has_not_settled_rests_and_its_first_settled_tick_decides_in_full(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a calibrating resource (no probes) whose soak length is the one the policy keeps, so
    # that it enters Dynamic steady while its setting is still within the settle window (a rate
    # window and two intervals: 12 s) and later steps its length once it learned from settled samples
    plain = tick_requests._resource

    def calibrating() -> dict[str, Any]:
        body = plain()
        body["spec"]["speculation"].update(
            {
                "calibration": {"enabled": True},
                "exploration": {"maxProbeFraction": 0},
                "draftLength": {"initial": 5, "min": 1, "max": 8},
            }
        )
        return body

    monkeypatch.setattr(tick_requests, "_resource", calibrating)
    services, _ = await counted_services(cluster)
    metrics = MovableMetrics()
    for service in _walk(services):
        if hasattr(service, "metrics"):
            service.metrics = metrics
    settle_s = services.control.rate_window_s + 2 * 1.0
    await tick_requests.serve(cluster, services)
    ticker = Ticker(services, cluster, tick_requests.T0)
    seen: list[tuple[datetime, bool, datetime | None, str | None]] = []
    try:
        # When it ticks 30 times, one interval apart
        for _ in range(30):
            outcome = (await ticker.ticks(1))[0]
            speculation = (outcome.body or {}).get("status", {}).get("speculation", {})
            applied = (speculation.get("calibration") or {}).get("appliedSince")
            since = datetime.fromisoformat(applied.replace("Z", "+00:00")) if applied else None
            seen.append((ticker.now, outcome.rested, since, speculation.get("controlPhase")))
    finally:
        await services.close()

    # Then ticks in Dynamic whose setting has not yet held the settle window rest too (within the
    # budget), and the first tick that finds a setting settled is decided in full
    unsettled = [
        rested
        for now, rested, since, phase in seen
        if phase == "Dynamic" and since and now - since < timedelta(seconds=settle_s)
    ]
    assert unsettled.count(True) >= 3, seen
    firsts = [
        rested for now, rested, since, _ in seen if since and now == since + timedelta(seconds=settle_s)
    ]
    assert len(firsts) >= 2 and not any(firsts), seen


async def test_a_look_from_the_rest_pass_rests_as_a_tick_would_and_hands_what_moved_to_one_full_tick(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a settled resource at rest, looked at by the daemons' rest pass instead of a tick
    services, counts, metrics, ticker = await _settled(cluster)
    looks: list[datetime] = []
    control_rest = ControlLoop.rest

    def counting(self: ControlLoop, resource: Any, endpoints: Any, now: datetime) -> Any:
        looks.append(now)
        return control_rest(self, resource, endpoints, now)

    monkeypatch.setattr(ControlLoop, "rest", counting)

    def look() -> Any:
        ticker.now += timedelta(seconds=1)
        return services.rest(NAMESPACE, NAME, lambda: ticker.now, ticker.watched, ticker.serving)

    try:
        counts.clear()
        # When a look finds the measurement as it was, and the next one finds it past break-even
        steady = look()
        metrics.batch = 400.0
        moved = look()
        requests_while_looking = dict(counts)
        # and the daemon, woken by that look, ticks
        after = await ticker.ticks(1)
    finally:
        await services.close()

    # Then the first look rests (on the measurement it read, for the operator's gauges) and the
    # second ends the rest, with no API request between them
    assert steady is not None and steady.batch == 4.0 and moved is None
    assert not requests_while_looking, requests_while_looking
    # and the tick it wakes decides in full at once (speculation held off only by the dwell), without
    # looking at the rest again: the look that ended it was the one
    assert _decided(after) == [True]
    assert after[0].status["speculation"]["reason"] == "HeldMinDwell"
    assert len(looks) == 2, looks


async def test_a_look_at_a_resource_being_deleted_ends_its_rest(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None
) -> None:
    # Given a settled resource at rest
    services, _, _, ticker = await _settled(cluster)
    try:
        # When the rest pass looks at it once its deletion began
        deleting = dict(ticker.watched)
        deleting["metadata"] = {**deleting["metadata"], "deletionTimestamp": "2026-12-01T00:00:00Z"}
        ticker.now += timedelta(seconds=1)
        looked = services.rest(NAMESPACE, NAME, lambda: ticker.now, deleting, ticker.serving)
        ticker.watched = deleting
        after = await ticker.ticks(1)
    finally:
        await services.close()

    # Then the look ends the rest, and the tick it wakes finds the resource gone: its daemon ends
    assert looked is None
    assert after[0].gone and not after[0].at_rest


async def test_a_reading_that_casts_a_length_vote_rests_and_the_confirming_reading_steps_at_once(
    cluster: EmulatedCluster, operator_env: None, large_fleet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a settled resource at rest, speculating at draft length 4 at batch 4
    services, _, metrics, ticker = await _settled(cluster)
    loop = next(service for service in _walk(services) if isinstance(service, ControlLoop))
    decisions = _full_decisions(monkeypatch)
    try:
        assert loop._memory[(NAMESPACE, NAME)].state.draft_length == 4
        # When its batch reads 70, where the modelled best is a shorter length by more than the
        # length margin but not by a clear gain: a step needs a second decision that wants it too
        metrics.batch = 70.0
        voted = await ticker.ticks(1)
        vote = loop._memory[(NAMESPACE, NAME)].state.length_vote
        decided_first = len(decisions)
        # and the next reading wants the same
        confirmed = await ticker.ticks(1)
    finally:
        await services.close()

    # Then the first reading costs no full decision: the rest keeps the vote it cast
    assert _decided(voted) == [False] and vote == -1 and decided_first == 0
    # and the second steps the length at once, with its Event, though the budget allowed a rest
    assert _decided(confirmed) == [True] and len(decisions) == 1
    speculation = confirmed[0].status["speculation"]
    assert (speculation["reason"], speculation["draftLength"]) == ("DraftLengthDecreased", 3)
    assert [event.reason for event in confirmed[0].events] == ["DraftLengthDecreased"]
