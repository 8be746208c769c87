"""Where plain speed comes from where no plain pod ran, and when a plain pod is held back to measure it."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from specops.domain import learning, perf
from specops.domain.engines.schedule import PLAIN, Revision, Schedule
from specops.domain.learning import Anchor, PodReading
from specops.domain.revision_policy import BAND_EDGES, K0_COST_HIGH, Evidence
from specops.domain.revision_step import StepInputs, StepState, config_from_spec, initial_state, step
from tests.unit.test_control_state import spec

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
SETUP = perf.ModelSetup(
    gpu=perf.GPUS["H100"], target_params=70e9, draft_params=7e9, bytes_per_param=2.0, tensor_parallel=1
)
CONFIG = learning.learning_config(
    enabled=True, guard=True, half_life_s=1800.0, interval_s=1.0, rate_window_s=1.0
)
SPECULATING = Revision("spec", "draftModel", "d", Schedule.of([[16, 3], [None, 0]]))


def settled(readings: list[PodReading]) -> dict[str, learning.PodTrack]:
    """Each reading's pod ran its revision at its load for well over a settle window."""
    tracks: dict[str, learning.PodTrack] = {}
    for second in range(0, 10):
        tracks = learning.track_pods(tracks, readings, CONFIG, T0 + timedelta(seconds=second))
    return tracks


def test_a_speculating_pod_at_k0_anchors_its_latency_and_its_cost_is_read_against_plain_in_its_band() -> None:
    readings = [
        PodReading("spec-0", SPECULATING, 100.0, 0.044, 0.7),  # K=0 above batch 16
        PodReading("plain-0", PLAIN, 110.0, 0.040, None),  # the same band (96, 128]
    ]
    now = T0 + timedelta(seconds=10)
    tracks = settled(readings)
    anchors = learning.anchor_pods({}, readings, tracks, BAND_EDGES, CONFIG, now)
    assert anchors[128.0] == Anchor(plain_s=0.040, k0_s=0.044)

    class OffFit:  # a fit whose plain step is off by half at every batch: no measure of K=0's cost
        def confidence(self, batch: float) -> object:
            return type("C", (), {"off": 5.0})()

        def step_s(self, k: int, batch: float, context_tokens: float | None = None) -> float:
            return 0.020

    assert learning.k0_ratios(readings[:1], anchors, BAND_EDGES, OffFit()) == [pytest.approx(1.1)]  # type: ignore[arg-type]
    # no plain pod in the band: the fit speaks where it measured plain near the batch
    assert learning.k0_ratios(readings[:1], {}, BAND_EDGES, OffFit()) == [pytest.approx(2.2)]  # type: ignore[arg-type]
    round_trip = learning.anchors_from_status(learning.anchors_to_status(anchors))
    assert round_trip[128.0].k0_s == pytest.approx(0.044)


class Steps:
    """Step times: plain flat at 10 ms (a weight-bound prior's shape), a round at K twice plain."""

    def step_s(self, k: int, batch: float, context_tokens: float | None = None) -> float:
        return 0.010 * (2.0 if k else 1.0)

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        return 0.8 if draft_length else 1.0

    def confidence(self, batch: float) -> object:
        return type("C", (), {"on": 0.0, "off": 0.0})()


def evidence(anchors: dict[float, Anchor], k0_cost: float = K0_COST_HIGH) -> Evidence:
    steps = Steps()
    return Evidence(steps, steps, steps, anchors=anchors, steps=steps, prior_steps=steps, k0_cost=k0_cost)


def test_plain_between_measured_bands_follows_them_not_the_priors_shape() -> None:
    # plain measured 10 ms at batch 16; at batch 256 only K=0 ran, at 33 ms with K=0 costing 10 %
    model = evidence({16.0: Anchor(plain_s=0.010), 256.0: Anchor(k0_s=0.033)}, k0_cost=0.10)
    assert model.plain_at(256.0) == pytest.approx(0.030)
    assert model.plain_at(64.0) is None
    # halfway in log batch between the two: halfway in log level (3x over 4 octaves: sqrt 3 at 64)
    assert model._plain_s(64.0, None) == pytest.approx(0.010 * math.sqrt(3.0))
    assert model._plain_s(512.0, None) == pytest.approx(0.030)  # beyond the last: its level
    # a round measured at 64 is judged against that plain step, not the prior's 10 ms
    anchored = evidence(
        {16.0: Anchor(plain_s=0.010), 64.0: Anchor(k=3, round_s=0.030), 256.0: Anchor(k0_s=0.033)}, 0.10
    )
    want = perf.expected_tokens(0.8, 3) * 0.010 * math.sqrt(3.0) / 0.030
    assert anchored.predict_speedup(0.8, 3, 64.0) == pytest.approx(min(want, perf.expected_tokens(0.8, 3)))
    # until K=0's cost is measured a K=0 latency says plain at the highest cost seen, erring low
    assert evidence({256.0: Anchor(k0_s=0.033)}).plain_at(256.0) == pytest.approx(0.033 / (1 + K0_COST_HIGH))


class Measured(Steps):
    """A curve measured everywhere at ``speedup`` for every K (the anchors say no plain ran near batch 128)."""

    def __init__(self, speedup: float, anchors: dict[float, Anchor] | None = None) -> None:
        self.speedup = speedup
        self.anchors = anchors or {}

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        return self.speedup if draft_length else 1.0

    def knows(self, batch: float) -> bool:
        return True


@pytest.mark.parametrize(
    ("speedup", "minutes", "reason"),
    [(1.30, 5, "BaselineRecorded"), (0.90, 2, "MeasuredSlowdown"), (1.01, 15, "BaselineRecorded")],
    ids=[
        "clearly faster: ends at the baseline",
        "slower: ends at its third plain sample",
        "within the margin: measures on",
    ],
)
def test_a_holdback_baseline_ends_when_the_evidence_is_clear(
    speedup: float, minutes: int, reason: str
) -> None:
    config = config_from_spec(spec(), spec().draft)  # baseline 5m, margin 2 %
    model = Measured(speedup, {1.0: Anchor(plain_s=0.01)})
    state = initial_state(config, model, T0)
    inputs = StepInputs(batch=1, alpha=0.7, tpot_p50_s=0.01, plain_tpot_p50_s=0.01)
    for minute in range(0, 20):
        decision = step(config, state, inputs, model, T0 + timedelta(minutes=minute))
        state = decision.state
        if decision.changed:
            break
    assert (minute, decision.reason) == (minutes, reason) and not state.holdback


def test_load_at_k0_where_plain_was_never_measured_holds_a_pod_back_once_the_soak_allows() -> None:
    config = config_from_spec(spec(), spec().draft)  # soak 10m, minInterval 30m
    model = Measured(1.5, {8.0: Anchor(plain_s=0.01)})  # plain measured near batch 8 only
    changed = T0
    state = StepState("Dynamic", changed, SPECULATING, changed, 0.7, (), changed)
    inputs = StepInputs(batch=128, alpha=0.7, tpot_p50_s=0.02)  # K=0 above 16: what it costs is unknown
    decided = []
    for minute in range(1, 16):
        decision = step(config, state, inputs, model, changed + timedelta(minutes=minute))
        state = decision.state
        decided.append((minute, decision.reason))
        if decision.changed:
            break
    assert decided[-1] == (10, "MeasuringPlain") and state.holdback  # at the soak, not minInterval
    assert "near batch 128" in decision.message
    # with plain measured there the same load moves nothing before minInterval
    known = Measured(1.5, {8.0: Anchor(plain_s=0.01), 128.0: Anchor(plain_s=0.02, k0_s=0.021)})
    calm = StepState("Dynamic", changed, SPECULATING, changed, 0.7, (), changed)
    later = step(config, calm, inputs, known, changed + timedelta(minutes=11))
    assert not later.changed and later.reason != "MeasuringPlain"


def test_plain_pods_never_hold_one_back_to_measure_plain() -> None:
    """Where the pods run plain they measure plain themselves: a speculating proposal on load no
    plain pod settled at rolls out on its own merits, with no holdback first."""
    config = config_from_spec(spec(), spec().draft)
    model = Measured(1.5, {8.0: Anchor(plain_s=0.01)})  # plain settled near batch 8 only
    state = StepState("Dynamic", T0, PLAIN, T0, 0.7, (), T0)
    decision = step(
        config, state, StepInputs(batch=128, alpha=None, tpot_p50_s=0.02), model, T0 + timedelta(hours=1)
    )
    assert decision.changed and decision.reason != "MeasuringPlain" and not decision.state.holdback
    assert decision.state.revision.mode == "spec"
