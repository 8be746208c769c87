"""Acceptance collapse: a speculating pod whose draft stopped being accepted while its neighbours'
was not.

An engine can lose its draft weights on a resume or a weight sync and go on serving with no error:
every draft is rejected, each round yields one token at the cost of a speculative round, and the
pod runs slower than plain. Its neighbours on the same draft, fed the same traffic, still accept
normally, which tells a broken pod apart from a draft that no longer fits the traffic (that lowers
every pod's acceptance: the AcceptanceBelowSLO condition and the schedule's own response).

`detect` is one step per tick: each speculating stable pod's own acceptance (accepted / drafted
over the rate window, read only while drafts flow) against the median of the other pods serving
the same draft. A pod below ``collapsed_below`` while that median is above ``healthy_above``, for
``intervals`` new measurements in a row, has collapsed; it is reported once per incarnation (a
restarted engine is a new incarnation and starts afresh). Pure: the caller acts.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from specops.domain.metrics import PodMeasurement

COLLAPSED_BELOW = 0.05
"""Accepted / drafted below this is a pod accepting nothing: even a poor draft at its longest K
(alpha 0.3 at K=8: a rate of about 0.14) keeps above it, and the rate window holds hundreds of
drafted tokens, so a healthy pod does not read this low by chance."""
HEALTHY_ABOVE = 0.3
"""The neighbours' median must be above this: the draft works on this traffic (alpha 0.5 at K=4
reads about 0.39; alpha 0.6 at K=8 about 0.31), so the low pod is the odd one out."""
INTERVALS = 2
MIN_DRAFTED_PER_S = 1.0
"""Drafts flow: at least this many draft tokens a second over the rate window (60 in a minute's
window), so an acceptance of 0 is a measurement, not a pod that drafted a handful of tokens."""
"""New measurements in a row below ``collapsed_below``: one low window can be a window that
straddled a restart or a load swing; two are not."""


@dataclass(frozen=True)
class CollapseConfig:
    collapsed_below: float = COLLAPSED_BELOW
    healthy_above: float = HEALTHY_ABOVE
    intervals: int = INTERVALS


@dataclass(frozen=True)
class PodAcceptance:
    """One speculating stable pod's own acceptance this tick (read only while its drafts flow)."""

    pod: str
    incarnation: str
    """The pod's uid and container restart count (discovery.PodEndpoint.incarnation)."""
    draft: str
    """The draft identity it serves (its specops.dev/draft label): its neighbours share it."""
    acceptance_rate: float
    """Accepted / drafted over the rate window (the engine's acceptance gauge where it has no counts)."""


@dataclass(frozen=True)
class Streak:
    incarnation: str
    low: int = 0
    """New measurements in a row below ``collapsed_below`` while the neighbours accept normally."""
    measured_at: datetime | None = None
    """The measurement last counted: a tick reading the same window again counts nothing."""
    reported: bool = False
    """This incarnation's collapse was reported (at most once an incarnation)."""


@dataclass(frozen=True)
class CollapseState:
    """Per pod, its streak (in memory: an operator restart waits ``intervals`` measurements again)."""

    pods: Mapping[str, Streak] = field(default_factory=dict)

    def suspect(self, pod: str) -> bool:
        """The pod read low against healthy neighbours at least once in a row (its windows should not
        teach the speedup curve: they measure a broken engine, not the deployment)."""
        streak = self.pods.get(pod)
        return streak is not None and streak.low > 0


@dataclass(frozen=True)
class Collapse:
    """A pod reported collapsed, with the numbers that say so."""

    pod: str
    incarnation: str
    draft: str
    acceptance_rate: float
    neighbours_median: float
    neighbours: int
    intervals: int

    def describe(self) -> str:
        return (
            f"pod {self.pod} accepted {self.acceptance_rate:.3f} of its drafted tokens for {self.intervals} "
            f"intervals in a row while its {self.neighbours} neighbour(s) on the same draft accepted "
            f"{self.neighbours_median:.2f} (median)"
        )


def reading(pod: str, incarnation: str, draft: str, own: PodMeasurement, k: int) -> PodAcceptance | None:
    """A speculating pod's acceptance, when its drafts flow: its schedule gives ``k`` > 0 at its
    batch, and it drafted at least MIN_DRAFTED_PER_S (an engine that publishes an acceptance gauge
    and no counts, SGLang, at least one running request). None otherwise."""
    if k <= 0 or own.acceptance_rate is None or own.batch is None:
        return None
    flowing = own.batch >= 1.0 if own.drafted_per_s is None else own.drafted_per_s >= MIN_DRAFTED_PER_S
    return PodAcceptance(pod, incarnation, draft, own.acceptance_rate) if flowing else None


def neighbours_median(readings: Sequence[PodAcceptance], pod: str, draft: str) -> tuple[float | None, int]:
    """The median acceptance of the other pods serving ``draft``, and how many there are."""
    others = [r.acceptance_rate for r in readings if r.draft == draft and r.pod != pod]
    return (statistics.median(others) if others else None), len(others)


def detect(
    state: CollapseState,
    readings: Sequence[PodAcceptance],
    present: Collection[str],
    measured_at: datetime,
    config: CollapseConfig = CollapseConfig(),
) -> tuple[CollapseState, list[Collapse]]:
    """One tick: the next state and the pods that collapsed now (each reported once an incarnation).

    ``readings`` are this tick's speculating stable pods with drafts flowing; ``present`` names every
    stable pod serving now. A present pod without a reading (not speculating at its batch, no
    traffic) starts its row again but stays reported; a pod no longer present is forgotten.
    ``measured_at`` is when the measurement was taken: a tick that reads the same measurement again
    counts nothing new."""
    kept: dict[str, Streak] = {
        pod: Streak(streak.incarnation, reported=streak.reported)
        for pod, streak in state.pods.items()
        if pod in present and streak.reported
    }
    collapsed: list[Collapse] = []
    for reading in readings:
        before = state.pods.get(reading.pod)
        if before is None or before.incarnation != reading.incarnation:
            before = Streak(reading.incarnation)
        median, count = neighbours_median(readings, reading.pod, reading.draft)
        if median is None or not (
            reading.acceptance_rate < config.collapsed_below and median > config.healthy_above
        ):
            kept[reading.pod] = Streak(reading.incarnation, 0, measured_at, before.reported)
            continue
        if before.measured_at == measured_at:  # the same window read again
            kept[reading.pod] = before
            continue
        streak = Streak(reading.incarnation, before.low + 1, measured_at, before.reported)
        if streak.low >= config.intervals and not streak.reported:
            collapsed.append(
                Collapse(
                    reading.pod,
                    reading.incarnation,
                    reading.draft,
                    reading.acceptance_rate,
                    median,
                    count,
                    streak.low,
                )
            )
            streak = replace(streak, reported=True)
        kept[reading.pod] = streak
    return CollapseState(kept), collapsed
