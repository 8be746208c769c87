"""The traffic lever: the holdback's route weight, from the split's arithmetic to the control step."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from specops.domain import traffic
from specops.domain.control_step import step
from specops.domain.metrics import Measurement, PodMeasurement
from tests.unit.test_control_step import (
    BASELINE,
    DYNAMIC,
    SPECULATING,
    T0,
    held_back,
    measured,
    record,
    snapshot,
)


def flat(batch: float) -> float:
    """A plain step that barely grows with the batch (memory-bound decoding)."""
    return 0.010 * (1 + batch / 400)


def linear(batch: float) -> float:
    """A plain step proportional to the batch (compute-bound decoding)."""
    return 0.001 * batch


def split(stable_tpot_s: float, shape=flat, **changes: float) -> traffic.Split:  # type: ignore[no-untyped-def]
    args = {
        "stable_pods": 3,
        "held_pods": 1,
        "stable_batch": 16.0,
        "plain_batch": 16.0,
        "plain_tpot_s": 0.010,
    }
    args.update(changes)
    return traffic.holdback_weight(
        stable_tpot_s=stable_tpot_s,
        plain_step_s=lambda b: shape(b) / shape(16.0) * 0.010,
        margin=0.02,
        **args,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("name", "stable_tpot_s", "shape", "weight"),
    [
        ("speculation pays: the split stays even, the holdback measures where the load is", 0.007, flat, 25),
        ("within the noise of one interval: even", 0.0104, flat, 25),
        (
            "a slowdown, plain steps flat in the batch: as far toward plain as the reach allows",
            0.013,
            flat,
            35,
        ),
        ("a slowdown, plain steps proportional to the batch: a little toward plain", 0.013, linear, 30),
    ],
)
def test_the_holdback_weight(name: str, stable_tpot_s: float, shape, weight: int) -> None:  # type: ignore[no-untyped-def]
    assert split(stable_tpot_s, shape).weight == weight


def test_the_measured_speedup_compares_at_the_stable_pods_batch() -> None:
    # the holdback carries twice the stable pods' batch: its latency is carried down its own shape
    found = split(0.010, linear, plain_batch=32.0, plain_tpot_s=0.020)
    assert found.speedup == pytest.approx(1.0)
    assert found.weight == 25


def test_even_shares() -> None:
    assert traffic.even_weight(3, 1) == 25
    assert traffic.even_weight(1, 1) == 50
    assert traffic.even_weight(7, 1) == 10  # 12.5 % in 5 % steps


def plain_poll(at, *, batch: float = 8.0, tpot_s: float = 0.010) -> Measurement:  # type: ignore[no-untyped-def]
    return Measurement(
        phase="Ok",
        at=at,
        batch=batch,
        tpot_p50_s=tpot_s,
        tpot_mean_s=tpot_s,
        per_pod={"chat-held": PodMeasurement(batch, tpot_s, 50.0)},
    )


NOW = T0 + timedelta(seconds=30)


def routed(stable_tpot_s: float, *, weighted: bool = True):  # type: ignore[no-untyped-def]
    return snapshot(
        BASELINE,
        measured(NOW, tpot_s=stable_tpot_s),
        weighted=weighted,
        plain=plain_poll(NOW),
        **held_back(SPECULATING),
    )


def test_a_slowdown_measured_on_the_route_moves_the_weight_at_once_with_its_evidence() -> None:
    after, actions = step(record(BASELINE, weight=25, wanted_weight=25), routed(0.015), NOW)
    assert actions.weight is not None and actions.weight > 25
    assert actions.roll_to is None  # no restart: the baseline goes on
    moved = [e for e in actions.events if e.reason == "TrafficMoved"]
    assert len(moved) == 1 and moved[0].type == "Warning"
    assert "from 25% to" in moved[0].message and "against plain" in moved[0].message
    assert actions.status is not None and actions.status.speculation.holdback is not None
    assert actions.status.speculation.holdback.weight == actions.weight
    assert after.wanted_weight == actions.weight and after.weight == 25  # not confirmed yet


def test_a_pod_set_that_pays_keeps_the_even_share_and_writes_nothing_new() -> None:
    _, actions = step(record(BASELINE, weight=25, wanted_weight=25), routed(0.007), NOW)
    assert actions.weight is None and not [e for e in actions.events if e.reason == "TrafficMoved"]


def test_a_weight_write_that_failed_is_set_again_on_the_same_poll() -> None:
    poll = routed(0.015)
    after, actions = step(record(BASELINE, weight=25, wanted_weight=25), poll, NOW)
    assert actions.weight is not None
    failed = after.weighted(25, "503")  # the route did not take it
    again, retried = step(failed, replace(poll, status=actions.status), NOW + timedelta(seconds=5))
    assert retried.weight == actions.weight and retried.status is None  # the fast path, the write again
    done = again.weighted(actions.weight)
    _, quiet = step(done, replace(poll, status=actions.status), NOW + timedelta(seconds=10))
    assert quiet.weight is None


def test_no_holdback_takes_it_out_of_the_route_once_and_unrouted_resources_write_nothing() -> None:
    poll = snapshot(DYNAMIC, measured(NOW), weighted=True, **held_back(SPECULATING))
    _, actions = step(record(DYNAMIC), poll, NOW)
    assert actions.weight == 0
    _, confirmed = step(record(DYNAMIC, weight=0, wanted_weight=0), poll, NOW)
    assert confirmed.weight is None
    _, unrouted = step(record(BASELINE), routed(0.015, weighted=False), NOW)
    assert unrouted.weight is None
    assert unrouted.status is not None and unrouted.status.speculation.holdback is not None
    assert unrouted.status.speculation.holdback.weight == 25  # the even share behind the Service


def test_a_draft_canary_on_the_same_route_freezes_the_holdback_weight() -> None:
    # the canary's weights and the holdback's share the stable backend: one writer at a time
    poll = replace(routed(0.015), canary_running=True)
    after, actions = step(record(BASELINE, weight=30, wanted_weight=35), poll, NOW)
    assert actions.weight is None and after.wanted_weight == 35
    assert actions.status is not None and actions.status.speculation.holdback is not None
    assert actions.status.speculation.holdback.weight == 30  # what the route carries
    _, again = step(after, replace(poll, status=actions.status), NOW + timedelta(seconds=5))
    assert again.weight is None  # the failed write is not retried either while the canary runs


def test_a_holdback_pod_not_ready_gets_no_route_weight() -> None:
    # a route naming a Service with no Ready pod fails that share of requests
    starting = replace(routed(0.015), held=())
    _, actions = step(record(BASELINE, weight=25, wanted_weight=25), starting, NOW)
    assert actions.weight == 0
    _, fresh = step(record(BASELINE), starting, NOW)
    assert fresh.weight == 0
    _, serving = step(record(BASELINE, weight=0, wanted_weight=0), routed(0.007), NOW)
    assert serving.weight == 25  # Ready: its even share
