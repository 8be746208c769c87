"""Acceptance collapse, the pure detector (domain/collapse.py): tables of ticks, each a fleet's per-pod
acceptance, and the pods reported collapsed at each tick."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from specops.domain.collapse import (
    COLLAPSED_BELOW,
    HEALTHY_ABOVE,
    CollapseState,
    PodAcceptance,
    detect,
    neighbours_median,
    reading,
)
from specops.domain.metrics import PodMeasurement

T0 = datetime(2026, 1, 1, tzinfo=UTC)

Tick = dict[str, float]
"""pod -> its acceptance rate this tick (a pod missing has no reading: no drafts flowing)."""


def run(ticks: Sequence[Tick], *, drafts: dict[str, str] | None = None, present: set[str] | None = None,
        incarnations: Sequence[dict[str, str]] | None = None) -> list[list[str]]:  # fmt: skip
    """The pods reported at each tick (each tick a new measurement unless its rates repeat a window)."""
    state = CollapseState()
    reported = []
    for index, tick in enumerate(ticks):
        incarnation = (incarnations[index] if incarnations else {}) or {}
        readings = [
            PodAcceptance(pod, incarnation.get(pod, "uid-" + pod), (drafts or {}).get(pod, "d1"), rate)
            for pod, rate in tick.items()
        ]
        serving = present if present is not None else {"a", "b", "c", "d"}
        state, collapsed = detect(state, readings, serving, T0 + timedelta(seconds=15 * index))
        reported.append([c.pod for c in collapsed])
    return reported


HEALTHY = {"a": 0.62, "b": 0.58, "c": 0.65, "d": 0.6}


@pytest.mark.parametrize(
    ("ticks", "expected"),
    [
        # one pod drops to nothing and stays there: reported at its second low interval, once
        (
            [
                HEALTHY,
                {**HEALTHY, "a": 0.0},
                {**HEALTHY, "a": 0.0},
                {**HEALTHY, "a": 0.0},
                {**HEALTHY, "a": 0.01},
            ],
            [[], [], ["a"], [], []],
        ),
        # one low interval, then back: a window straddling a restart or a swing is not a collapse
        ([{**HEALTHY, "a": 0.0}, HEALTHY, {**HEALTHY, "a": 0.0}, HEALTHY], [[], [], [], []]),
        # just at the floor is not below it
        ([{**HEALTHY, "a": COLLAPSED_BELOW}] * 3, [[], [], []]),
        # every pod low at once: no healthy neighbour, so not this pod's fault (AcceptanceBelowSLO's case)
        ([{"a": 0.0, "b": 0.01, "c": 0.02, "d": 0.0}] * 3, [[], [], []]),
        # neighbours weak (a poor draft on this traffic, median not above 0.3): not a collapse
        ([{"a": 0.0, "b": 0.25, "c": HEALTHY_ABOVE, "d": 0.28}] * 3, [[], [], []]),
        # two of four collapse together: each still has healthy neighbours by the median (a's: 0, 0.62, 0.64)
        ([{"a": 0.0, "b": 0.0, "c": 0.62, "d": 0.64}] * 3, [[], ["a", "b"], []]),
        # three of four: the median of each one's neighbours is a collapsed pod's (fleet-wide, in effect)
        ([{"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.64}] * 3, [[], [], []]),
        # a lone pod: no neighbour to compare with, never reported
        ([{"a": 0.0}] * 3, [[], [], []]),
        # two pods, one collapsed: its one neighbour is the median
        ([{"a": 0.0, "b": 0.55}] * 3, [[], ["a"], []]),
    ],
    ids=[
        "collapsed-once",
        "one-low-interval",
        "at-the-floor",
        "fleet-wide-drop",
        "weak-neighbours",
        "two-of-four",
        "three-of-four",
        "alone",
        "pair",
    ],
)
def test_a_pod_collapses_after_two_low_intervals_against_healthy_neighbours(
    ticks: list[Tick], expected: list[list[str]]
) -> None:
    assert run(ticks) == expected


def test_only_neighbours_on_the_same_draft_count() -> None:
    # Given a pod of draft d2 at 0 whose only d2 neighbour is also weak, beside healthy d1 pods
    drafts = {"a": "d2", "b": "d2", "c": "d1", "d": "d1"}
    ticks = [{"a": 0.0, "b": 0.1, "c": 0.7, "d": 0.7}] * 3
    # Then the d1 pods do not vouch for d2: nothing collapsed
    assert run(ticks, drafts=drafts) == [[], [], []]
    # and a healthy d2 neighbour does
    assert run([{"a": 0.0, "b": 0.5, "c": 0.7, "d": 0.7}] * 3, drafts=drafts) == [[], ["a"], []]


def test_the_same_window_read_twice_counts_once() -> None:
    state = CollapseState()
    low = [PodAcceptance("a", "u-a", "d1", 0.0), PodAcceptance("b", "u-b", "d1", 0.6)]
    state, first = detect(state, low, {"a", "b"}, T0)
    state, again = detect(state, low, {"a", "b"}, T0)  # a tick between two polls
    assert first == again == []
    state, second = detect(state, low, {"a", "b"}, T0 + timedelta(seconds=15))
    assert [c.pod for c in second] == ["a"]


def test_a_new_incarnation_starts_afresh_and_may_be_reported_again() -> None:
    # Given pod a collapsed and was reported; its engine restarted in place (a new incarnation)
    ticks = [{"a": 0.0, "b": 0.6}] * 5
    incarnations = [{"a": "u-a/0"}] * 2 + [{"a": "u-a/1"}] * 3
    # Then the new incarnation needs its own two low intervals, and is reported once more
    assert run(ticks, present={"a", "b"}, incarnations=incarnations) == [[], ["a"], [], ["a"], []]


def test_a_reported_pod_without_a_reading_is_not_reported_again_while_it_serves() -> None:
    # Given pod a reported, then a tick with no reading for it (K=0 at its batch), then low again
    ticks = [
        {"a": 0.0, "b": 0.6},
        {"a": 0.0, "b": 0.6},
        {"b": 0.6},
        {"a": 0.0, "b": 0.6},
        {"a": 0.0, "b": 0.6},
    ]
    # Then it is not reported twice in one incarnation
    assert run(ticks, present={"a", "b"}) == [[], ["a"], [], [], []]


def test_a_gap_in_the_readings_starts_the_row_again() -> None:
    ticks = [{"a": 0.0, "b": 0.6}, {"b": 0.6}, {"a": 0.0, "b": 0.6}, {"a": 0.0, "b": 0.6}]
    assert run(ticks, present={"a", "b"}) == [[], [], [], ["a"]]


def test_pods_no_longer_serving_are_forgotten() -> None:
    state = CollapseState()
    low = [PodAcceptance("a", "u-a", "d1", 0.0), PodAcceptance("b", "u-b", "d1", 0.6)]
    for second in (0, 15):
        state, _ = detect(state, low, {"a", "b"}, T0 + timedelta(seconds=second))
    assert state.pods["a"].reported
    state, _ = detect(state, low[1:], {"b"}, T0 + timedelta(seconds=30))
    assert set(state.pods) == {"b"}


def test_a_report_carries_the_numbers() -> None:
    readings = [
        PodAcceptance("a", "u-a", "d1", 0.01),
        PodAcceptance("b", "u-b", "d1", 0.5),
        PodAcceptance("c", "u-c", "d1", 0.7),
        PodAcceptance("d", "u-d", "d1", 0.6),
    ]
    state, _ = detect(CollapseState(), readings, {"a", "b", "c", "d"}, T0)
    assert state.suspect("a") and not state.suspect("b")
    _, (found,) = detect(state, readings, {"a", "b", "c", "d"}, T0 + timedelta(seconds=15))
    assert (found.pod, found.incarnation, found.draft) == ("a", "u-a", "d1")
    assert found.acceptance_rate == 0.01 and found.neighbours_median == 0.6 and found.neighbours == 3
    assert found.intervals == 2
    assert "pod a accepted 0.010" in found.describe() and "3 neighbour(s)" in found.describe()
    assert "0.60 (median)" in found.describe()


def test_neighbours_median_leaves_the_pod_out() -> None:
    readings = [PodAcceptance(p, "", "d1", r) for p, r in (("a", 0.0), ("b", 0.2), ("c", 0.8))]
    assert neighbours_median(readings, "a", "d1") == (0.5, 2)
    assert neighbours_median(readings, "a", "d9") == (None, 0)


@pytest.mark.parametrize(
    ("own", "k", "expected"),
    [
        (PodMeasurement(batch=8, drafted_per_s=120.0, acceptance_rate=0.0), 3, 0.0),  # drafts flow
        (PodMeasurement(batch=8, drafted_per_s=0.5, acceptance_rate=0.0), 3, None),  # a trickle
        (PodMeasurement(batch=8, drafted_per_s=120.0, acceptance_rate=0.0), 0, None),  # K=0 at its batch
        (PodMeasurement(batch=8, drafted_per_s=None, acceptance_rate=None), 3, None),  # nothing drafted
        (PodMeasurement(batch=None, drafted_per_s=120.0, acceptance_rate=0.6), 3, None),  # no batch
        (PodMeasurement(batch=4, drafted_per_s=None, acceptance_rate=0.0), 3, 0.0),  # gauge, requests run
        (PodMeasurement(batch=0, drafted_per_s=None, acceptance_rate=0.0), 3, None),  # gauge, idle
    ],
)
def test_a_reading_needs_drafts_flowing(own: PodMeasurement, k: int, expected: float | None) -> None:
    found = reading("a", "u-a", "d1", own, k)
    assert (found.acceptance_rate if found is not None else None) == expected
