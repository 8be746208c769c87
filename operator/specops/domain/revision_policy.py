"""Which revision a deployment's pods should run: plain, or speculating with which schedule.

The engine applies its schedule at every iteration, so the operator never toggles; it picks
the schedule once from the learned speedup curve and rolls a new one out only when that pays
for the restarts. Pure: the model, the load the deployment saw and ``now`` come in; a
proposal and a verdict with its reason go out.

- :func:`best_schedule`: per batch band, the K with the best predicted speedup at the band's
  upper edge (its heaviest batch, so a band never promises what its top cannot keep), K = 0
  where even the best K gains less than ``margin``; K never grows with the batch. A schedule
  whose first band is K = 0 is no schedule: the pods should run plain.
- :func:`expected_speedup`: a revision's predicted speedup over plain, weighted by the batches
  the deployment actually carried. Inside a speculating engine K = 0 is not free: those batches
  count at ``1 / (1 + k0_cost)``.
- :func:`verdict`: roll the proposal out only when its predicted gain exceeds ``min_gain``, no
  sooner than ``min_interval`` after the last change, one rollout at a time, never during a
  draft canary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from specops.domain.engines.schedule import Schedule
from specops.domain.perf import expected_tokens

BAND_EDGES: tuple[int, ...] = (
    1,
    2,
    3,
    4,
    6,
    8,
    12,
    16,
    24,
    32,
    48,
    64,
    96,
    128,
    192,
    256,
    384,
    512,
    768,
    1024,
)
"""Upper edges of the bands a proposed schedule is made of: half octaves, so a band judged at its
heaviest batch is never more than 1.5x its lightest (engines capture CUDA graphs at such sizes)."""
DEFAULT_K0_COST = 0.05
"""The per-token cost of K = 0 inside a speculating engine assumed until measured (vLLM measured
+6.6 % at concurrency 2 and +21.6 % at 189)."""
K0_COST_HIGH = 0.22
"""K=0's cost at its highest measured (vLLM, +21.6 % at concurrency 189): a plain step derived from
a K=0 latency before the cost was measured assumes it, so the speculation it predicts errs low."""


class SpeedupModel(Protocol):
    """Predicted speedup over plain of draft length K at a batch (1.0 for K = 0)."""

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float: ...


def best_schedule(
    model: SpeedupModel,
    alpha: float,
    max_k: int,
    *,
    min_k: int = 1,
    margin: float = 0.02,
    edges: Sequence[int] = BAND_EDGES,
    load: Mapping[float, float] | None = None,
) -> Schedule | None:
    """The schedule the model favours at ``alpha``, or None when no band pays (run plain).

    Each band takes the K with the best predicted speedup at its upper edge, 0 unless some K beats
    1 + margin. K never grows with the batch: a band's K is capped by the lighter band's. With
    ``load`` (seconds per band edge), a band that carried none takes the K of the heavier band
    above it when that is larger (nothing runs there to lose, and the heavier band is not cut off)."""
    chosen: list[int] = []
    for edge in edges:
        best_k, best = 0, 1.0 + margin
        for k in range(max(1, min_k), max_k + 1):
            predicted = model.predict_speedup(alpha, k, float(edge))
            if predicted > best:
                best_k, best = k, predicted
        chosen.append(best_k)
    if load is not None:
        for index in range(len(edges) - 2, -1, -1):
            if load.get(float(edges[index]), 0.0) <= 0:
                chosen[index] = max(chosen[index], chosen[index + 1])
    for index in range(1, len(chosen)):
        chosen[index] = min(chosen[index], chosen[index - 1])
    if chosen[0] == 0:
        return None
    bands: list[list[int | None]] = [[edge, k] for edge, k in zip(edges, chosen, strict=True)]
    cut = next((i for i, (_, k) in enumerate(bands) if k == 0), len(bands))
    bands = bands[: cut + 1]
    bands[-1][0] = None
    return Schedule.of(bands)


def expected_speedup(
    model: SpeedupModel,
    alpha: float,
    schedule: Schedule | None,
    batches: Mapping[float, float],
    k0_cost: float = DEFAULT_K0_COST,
) -> float:
    """Predicted speedup over plain of running ``schedule`` (None: plain) on the load ``batches``
    (batch -> weight, e.g. seconds spent there). 1.0 for plain or when no load was seen."""
    total = sum(weight for weight in batches.values() if weight > 0)
    if schedule is None or total <= 0:
        return 1.0
    weighted = 0.0
    for batch, weight in batches.items():
        if weight <= 0:
            continue
        k = schedule.k_at(batch)
        speed = 1.0 / (1.0 + k0_cost) if k == 0 else model.predict_speedup(alpha, k, batch)
        weighted += weight * speed
    return weighted / total


MEASURED_NEAR = 1.0
"""Effective speculating samples near a batch (its octave, neighbours at half) from which the
fitted curve decides there; below it, the prior does."""


class Confident(Protocol):
    def confidence(self, batch: float) -> object: ...


class Stepped(Protocol):
    def step_s(self, draft_length: int, batch: float, context_tokens: float | None = None) -> float: ...


class BandAnchor(Protocol):
    @property
    def plain_s(self) -> float | None: ...
    @property
    def k(self) -> int: ...
    @property
    def round_s(self) -> float | None: ...
    @property
    def k0_s(self) -> float | None: ...


EXPLORE_SHARE = 0.05
"""A band carrying at least this share of the load seen, with no speculating measurement near it,
is measured at K=1 (see Evidence.explore)."""
SCALE_REACH = math.log(2.0)
"""A band measured within this distance in log batch (an octave) corrects the prior nearby."""
PRIOR_SCALE_MAX = 4.0
"""The prior is scaled by at most this factor either way (Evidence.prior_scale)."""
EXPLORE_TOLERANCE = 0.3
"""... when the prior puts K=1 there no lower than 1 - this: near or above break-even, not far below."""


@dataclass(frozen=True)
class Evidence:
    """The fitted curve where speculation was measured near the batch, the prior elsewhere.

    One global fit extrapolates: a slowdown measured at batch 48 alone moves its per-token cost,
    and with it the prediction at batch 1, which no speculating pod has shown. A band changes on
    what was measured near it; elsewhere the prior speaks until a revision measures it.

    ``explore``: bands with load and no measurement near them, where K=1 is credited with
    ``credit`` (just above paying) when the prior finds it within EXPLORE_TOLERANCE of paying:
    the prior is often wrong exactly there, K=0 inside a speculating engine costs anyway, and one
    revision measures it (then the fit decides)."""

    fitted: SpeedupModel
    prior: SpeedupModel
    confident: Confident
    explore: frozenset[float] = frozenset()
    credit: float = 1.0
    anchors: Mapping[float, BandAnchor] = field(default_factory=dict)
    """What each band (by its upper edge) measured directly: its plain step and its round at one K.
    Where a band has both, the fit only scales the round to other K; its level is the measurement."""
    steps: Stepped | None = None
    """The fitted model's step times (for scaling an anchor's round to another K)."""
    prior_steps: Stepped | None = None
    """The prior's step times: the plain step where plain was not measured in the band, at the level
    the nearest measured plain band shows (a fit that saw speculation only at a batch can blame
    plain decoding for what the draft cost there; the prior's shape cannot)."""
    k0_cost: float = K0_COST_HIGH
    """What K=0 inside a speculating engine costs, as measured (K0_COST_HIGH until it is): a band
    measured only at K=0 has its plain step at that latency over 1 + this."""
    _ratios: dict[float, tuple[tuple[float, float], ...]] = field(
        default_factory=dict, compare=False, repr=False
    )
    _memo: dict[tuple[object, ...], Any] = field(default_factory=dict, init=False, compare=False, repr=False)
    """What does not depend on K, per batch (a best schedule asks every K at every band edge): a
    model lives for one step."""

    def prior_scale(self, alpha: float, batch: float) -> float:
        """How far the prior sits from what the nearest measured band within an octave measured
        (measured over prior speedup at that band's K): applied to the prior where nothing was
        measured, so a prior that measurements found optimistic nearby is not trusted at face value
        (1 where no band within an octave was measured)."""
        key = ("scale", alpha, batch)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self._prior_scale(alpha, batch)
        return float(found)

    def _prior_scale(self, alpha: float, batch: float) -> float:
        key = round(alpha, 2)
        if key not in self._ratios:
            found: list[tuple[float, float]] = []
            for edge, anchor in self.anchors.items():
                if anchor.round_s and anchor.k > 0:
                    measured = self._anchored(alpha, anchor.k, edge, None)
                    prior = self.prior.predict_speedup(alpha, anchor.k, edge)
                    if measured and measured > 0 and prior > 0:
                        ratio = min(PRIOR_SCALE_MAX, max(1.0 / PRIOR_SCALE_MAX, measured / prior))
                        found.append((math.log(edge), ratio))
            self._ratios[key] = tuple(sorted(found))
        ratios = self._ratios[key]
        if not ratios:
            return 1.0
        where = math.log(max(1.0, batch))
        distance, ratio = min((abs(at - where), ratio) for at, ratio in ratios)
        return ratio if distance <= SCALE_REACH else 1.0

    def _anchored(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None
    ) -> float | None:
        anchor = self.anchors.get(batch)
        if draft_length <= 0 or anchor is None or not anchor.round_s or self.steps is None:
            return None
        key = ("anchored", batch, context_tokens)
        found = self._memo.get(key)
        if found is None:  # the band's plain step, and the fitted round at the anchor's K
            plain_s = self.plain_at(batch) or self._plain_s(batch, context_tokens)
            found = self._memo[key] = (plain_s, self.steps.step_s(anchor.k, batch, context_tokens))
        plain_s, anchor_step = found
        shape = self.steps.step_s(draft_length, batch, context_tokens) / anchor_step
        return expected_tokens(alpha, draft_length) * plain_s / (anchor.round_s * shape)

    def plain_at(self, batch: float) -> float | None:
        """The plain step measured in this band: a plain pod's, else a speculating pod's at K=0 less
        K=0's cost. None where neither ran."""
        anchor = self.anchors.get(batch)
        if anchor is None:
            return None
        if anchor.plain_s:
            return anchor.plain_s
        return anchor.k0_s / (1.0 + self.k0_cost) if anchor.k0_s else None

    def _plain_s(self, batch: float, context_tokens: float | None) -> float:
        """The plain step at ``batch`` where it was not measured in its band: the prior's shape at the
        level the measured bands show, interpolated in log batch between the nearest measured band
        below and above (the nearest one's level beyond them)."""
        assert self.steps is not None
        if self.prior_steps is None:
            return self.steps.step_s(0, batch, context_tokens)
        prior = self.prior_steps
        levels = sorted(
            (math.log(max(1.0, edge)), math.log(plain / prior.step_s(0, edge, context_tokens)))
            for edge in self.anchors
            if (plain := self.plain_at(edge))
        )
        if not levels:
            return self.steps.step_s(0, batch, context_tokens)
        where = math.log(max(1.0, batch))
        below = [item for item in levels if item[0] <= where]
        above = [item for item in levels if item[0] >= where]
        if below and above and above[0][0] > below[-1][0]:
            (x0, y0), (x1, y1) = below[-1], above[0]
            level = y0 + (y1 - y0) * (where - x0) / (x1 - x0)
        else:
            level = (below[-1] if below else above[0])[1]
        return math.exp(level) * prior.step_s(0, batch, context_tokens)

    def measured(self, batch: float) -> bool:
        return float(getattr(self.confident.confidence(batch), "on", 0.0)) >= MEASURED_NEAR

    def knows(self, batch: float) -> bool:
        """Whether speculation was measured in this band (an anchor's round, or the fit's samples)."""
        anchor = self.anchors.get(batch)
        return bool(anchor is not None and anchor.round_s) or self.measured(batch)

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        found = self._predict(alpha, draft_length, batch, context_tokens)
        # a round verifies K+1 tokens in at least one target step: never more than its expected tokens
        return min(found, expected_tokens(alpha, draft_length)) if draft_length > 0 else found

    def _predict(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        anchored = self._anchored(alpha, draft_length, batch, context_tokens)
        if anchored is not None:
            return anchored
        plain_s = self.plain_at(batch)
        if draft_length > 0 and plain_s and self.steps is not None:
            # plain measured here, speculation not: the measured plain step over the fitted round
            round_s = self.steps.step_s(draft_length, batch, context_tokens)
            return expected_tokens(alpha, draft_length) * plain_s / round_s
        if self.measured(batch):
            return self.fitted.predict_speedup(alpha, draft_length, batch, context_tokens)
        prior = self.prior.predict_speedup(alpha, draft_length, batch, context_tokens)
        if draft_length > 0:
            prior *= self.prior_scale(alpha, batch)
        if draft_length == 1 and batch in self.explore and prior >= 1.0 - EXPLORE_TOLERANCE:
            return max(prior, self.credit)
        return prior


def exploring(model: SpeedupModel, load: Mapping[float, float], credit: float) -> SpeedupModel:
    """``model`` crediting K=1 in its unmeasured bands that carry EXPLORE_SHARE of ``load`` (an
    Evidence model; any other model is returned as it is)."""
    if not isinstance(model, Evidence):
        return model
    total = sum(load.values())
    if total <= 0:
        return model
    loaded = frozenset(edge for edge, weight in load.items() if weight / total >= EXPLORE_SHARE)
    return replace(model, explore=loaded, credit=credit)


def measured_speedup(
    model: SpeedupModel,
    alpha: float,
    schedule: Schedule | None,
    batches: Mapping[float, float],
    k0_cost: float | None,
) -> float | None:
    """``expected_speedup`` over the bands whose speculation was measured (and K=0 bands once its
    cost was): what a slowdown is judged on. None when nothing of the load was measured."""
    knows = getattr(model, "knows", None)
    if knows is None or schedule is None:
        return None
    kept = {
        batch: weight
        for batch, weight in batches.items()
        if (knows(batch) if schedule.k_at(batch) > 0 else k0_cost is not None)
    }
    if not kept:
        return None
    return expected_speedup(model, alpha, schedule, kept, k0_cost if k0_cost is not None else DEFAULT_K0_COST)


def break_even(
    model: SpeedupModel, alpha: float, bounds: tuple[int, int], edges: Sequence[int] = BAND_EDGES
) -> int | None:
    """The smallest batch at which no draft length in ``bounds`` is predicted to beat plain: the
    first band edge where none does, refined by bisection down to the previous edge. None when
    every band up to the last edge pays."""

    def pays(batch: float) -> bool:
        return any(model.predict_speedup(alpha, k, batch) > 1.0 for k in range(bounds[0], bounds[1] + 1))

    previous = 0
    for edge in edges:
        if not pays(float(edge)):
            low, high = previous, edge  # pays at low (or nothing below), not at high
            while high - low > 1:
                middle = (low + high) // 2
                if pays(float(middle)):
                    low = middle
                else:
                    high = middle
            return max(1, high)
        previous = edge
    return None


@dataclass(frozen=True)
class Verdict:
    roll: bool
    reason: str
    """UpperCamelCase: RevisionProposed, GainBelowThreshold, TooSoon, CanaryRunning, RolloutRunning,
    AlreadyServing."""
    message: str
    gain: float


def verdict(
    current: Schedule | None,
    proposed: Schedule | None,
    current_speed: float,
    proposed_speed: float,
    *,
    min_gain: float,
    min_interval_s: float,
    last_change: datetime | None,
    now: datetime,
    canary_running: bool,
    rollout_running: bool,
) -> Verdict:
    """Whether to roll ``proposed`` out in place of ``current`` (None on either side: plain)."""
    gain = proposed_speed / current_speed - 1.0 if current_speed > 0 else 0.0
    name = _name(proposed)
    if proposed == current:
        return Verdict(False, "AlreadyServing", f"the pods already run the best revision ({name})", 0.0)
    if canary_running:
        return Verdict(False, "CanaryRunning", f"{name} waits for the draft canary to end", gain)
    if rollout_running:
        return Verdict(False, "RolloutRunning", f"{name} waits for the rollout in progress", gain)
    if gain <= min_gain:
        return Verdict(
            False,
            "GainBelowThreshold",
            f"{name} is predicted {gain:+.1%} over {_name(current)} on the batches seen "
            f"(a rollout needs more than {min_gain:+.1%})",
            gain,
        )
    if last_change is not None and (now - last_change).total_seconds() < min_interval_s:
        wait = min_interval_s - (now - last_change).total_seconds()
        return Verdict(False, "TooSoon", f"{name} ({gain:+.1%}) waits {wait:.0f} s more", gain)
    return Verdict(
        True,
        "RevisionProposed",
        f"rolling out {name}: predicted {gain:+.1%} over {_name(current)} on the batches seen",
        gain,
    )


def _name(schedule: Schedule | None) -> str:
    return "plain" if schedule is None else schedule.describe()
