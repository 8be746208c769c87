"""The canonical schedule and the revision digest."""

from __future__ import annotations

import pytest

from specops.domain.engines.schedule import PLAIN, Revision, Schedule, ScheduleError


@pytest.mark.parametrize(
    ("bands", "problem"),
    [
        ([], "at least one band"),
        ([[4, 2], [8, 3], [None, 0]], "must not grow"),
        ([[8, 2], [4, 1], [None, 0]], "ascend"),
        ([[None, 2], [8, 1]], "only the last band"),
        ([[8, 2], [16, 1]], "only the last band"),
        ([[None, 0]], "run plain"),
        ([[4, -1], [None, 0]], ">= 0"),
    ],
)
def test_schedules_no_engine_could_start_with_are_refused(
    bands: list[list[int | None]], problem: str
) -> None:
    with pytest.raises(ScheduleError, match=problem):
        Schedule(tuple((edge, k) for edge, k in bands))  # type: ignore[misc]


def test_k_at_follows_upper_edges_and_merges_equal_neighbours() -> None:
    schedule = Schedule.of([[4, 4], [8, 4], [32, 1], [None, 0]])
    assert schedule.bands == ((8, 4), (32, 1), (None, 0))
    assert [schedule.k_at(b) for b in (1, 8, 9, 32, 33, 4096)] == [4, 4, 1, 1, 0, 0]
    assert schedule.describe() == "K=4 to batch 8, K=1 to batch 32, K=0 above 32"
    assert Schedule.constant(3).describe() == "K=3 at every batch"


def test_the_digest_names_what_the_pod_runs() -> None:
    a = Revision(mode="spec", method="eagle3", draft="v3", schedule=Schedule.of([[8, 4], [None, 0]]))
    same = Revision(mode="spec", method="eagle3", draft="v3", schedule=Schedule.of([[8, 4], [None, 0]]))
    other = Revision(mode="spec", method="eagle3", draft="v3", schedule=Schedule.of([[16, 4], [None, 0]]))
    assert a.digest == same.digest and len(a.digest) == 10
    assert a.digest != other.digest != PLAIN.digest
    assert PLAIN.describe() == "plain"
    with pytest.raises(ScheduleError):
        Revision(mode="plain", schedule=Schedule.constant(2))
    with pytest.raises(ScheduleError):
        Revision(mode="spec", method="eagle3")
