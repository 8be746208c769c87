"""Split-fleet A/B: the pure comparison, and the control loop running one on two pods in-process.

The in-process world answers per pod from a serving profile at the setting each pod was given,
so a split shows the two settings side by side at one load, as Prometheus's per-pod series do.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specops.api.status import SpeculativeDeploymentStatus
from specops.domain import split_fleet
from specops.domain.discovery import PodEndpoint
from specops.domain.metrics import (
    POD_QUANTITIES,
    PROFILES,
    Measurement,
    PodMeasurement,
    build_snapshot,
)
from specops.domain.perf import expected_tokens
from specops.domain.profile import ServingProfile
from specops.ports import ApplyResult, FleetResult
from specops.services.control import ControlLoop
from tests.unit.test_control_learning import ALPHA, fresh, resource, slow_world

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_split_sets_one_of_n_pods_apart_never_more_than_half_and_rotates() -> None:
    assert split_fleet.choose_pods(["a"], 0) == ()
    assert split_fleet.choose_pods(["b", "a"], 0) == ("a",)
    assert split_fleet.choose_pods(["b", "a"], 1) == ("b",)
    for n in range(2, 40):
        chosen = split_fleet.choose_pods([f"p{i}" for i in range(n)], 3)
        assert 1 <= len(chosen) <= n // 2 and len(set(chosen)) == len(chosen)


def split_of(
    probe_length: int, base_length: int, comparisons: Sequence[tuple[float, float, float]]
) -> split_fleet.Split:
    split = split_fleet.Split(("a",), probe_length, base_length, T0, 0.5)
    for probe_ms, base_ms, alpha in comparisons:
        pods = {"a": PodMeasurement(32, probe_ms / 1e3), "b": PodMeasurement(32, base_ms / 1e3)}
        split = split_fleet.measure(split, pods, alpha)
    return split


def test_the_verdict_is_plain_over_speculating_latency_at_the_current_alpha() -> None:
    # probe off (pod a plain at 40 ms), the rest speculating at 3 (50 ms per token): 0.8x
    split = split_of(0, 3, [(40.0, 50.0, 0.8), (40.0, 50.0, 0.8)])
    verdict = split_fleet.verdict(split, 0.8, ["b"])
    assert verdict is not None
    assert verdict.speedup == pytest.approx(0.8) and verdict.slower
    assert verdict.on_pods == ("b",) and verdict.off_pods == ("a",) and verdict.on_length == 3
    assert "split-fleet A/B at batch 32" in verdict.evidence() and "0.80x" in verdict.evidence()
    # measured at alpha 0.6: at the current 0.8 the same rounds yield more tokens
    adjusted = split_fleet.verdict(split_of(0, 3, [(40.0, 50.0, 0.6)] * 2), 0.8, ["b"])
    assert adjusted is not None
    assert adjusted.speedup == pytest.approx(0.8 * expected_tokens(0.8, 3) / expected_tokens(0.6, 3))
    # the probe speculating against plain pods reads the other way round
    on_probe = split_fleet.verdict(split_of(3, 0, [(20.0, 40.0, 0.8)] * 3), 0.8, ["b"])
    assert on_probe is not None and on_probe.speedup == pytest.approx(2.0) and not on_probe.slower
    # one measurement is not a verdict; nor is a split of two lengths both on
    assert split_fleet.verdict(split_of(0, 3, [(40.0, 50.0, 0.8)]), 0.8) is None
    assert split_fleet.verdict(split_of(2, 3, [(40.0, 50.0, 0.8)] * 3), 0.8) is None


def test_each_pod_is_sampled_with_its_own_setting_and_unusable_pods_are_skipped() -> None:
    split = split_fleet.Split(("a",), 0, 3, T0, 0.5)
    pods = {"a": PodMeasurement(30, 0.04), "b": PodMeasurement(34, 0.05), "c": PodMeasurement(None, 0.05)}
    measured = split_fleet.measure(split, pods, 0.7)
    assert [(s.batch, s.draft_length, s.alpha) for s in measured.samples] == [(30, 0, None), (34, 3, 0.7)]
    assert measured.comparisons[0].probe_batch == 30 and measured.comparisons[0].base_batch == 34
    # without an acceptance the speculating pods cannot be sampled: no comparison either
    assert split_fleet.measure(split, pods, None).comparisons == ()


def test_per_pod_series_are_kept_apart_with_one_query_per_quantity_for_every_resource() -> None:
    profile = PROFILES["triton-trtllm"]
    queries = profile.queries(10)
    assert all(q in queries and "pod)" in queries[q] for q in POD_QUANTITIES)

    def series(pod: str, value: float, name: str = "a") -> dict[str, Any]:
        labels = {"namespace": "ns", "specops_deployment": name, "variant": "stable", "pod": pod}
        return {"metric": labels, "value": [0, str(value)]}

    results = {
        "batch_per_pod": [{"metric": {"namespace": "ns", "specops_deployment": "a", "variant": "stable"},
                           "value": [0, "31"]}],
        "pod_batch": [series("a-0", 30), series("a-1", 32), series("b-0", 5, "b")],
        "pod_tpot_mean_s": [series("a-0", 0.04), series("a-1", 0.05)],
    }  # fmt: skip
    snapshot = build_snapshot(profile, results, T0)
    a = snapshot.measurements[("ns", "a", "stable")]
    assert a.batch == 31  # the fleet's quantities are untouched by the per-pod ones
    assert a.per_pod == {"a-0": PodMeasurement(30, 0.04), "a-1": PodMeasurement(32, 0.05)}
    assert snapshot.measurements[("ns", "b", "stable")].per_pod == {"b-0": PodMeasurement(5, None)}


class Fleet:
    """Metrics and model control of pods serving `profile` at `batch`, each at its own setting."""

    def __init__(self, profile: ServingProfile, batch: float, pods: int) -> None:
        self.profile = profile
        self.batch = batch
        self.lengths = {f"pod-{i}": 3 for i in range(pods)}
        self.history: list[dict[str, int]] = []

    def register(self, key: Hashable, url: str, backend: str, interval_s: float) -> None:
        pass

    def unregister(self, key: Hashable) -> None:
        pass

    def tpot(self, g: int) -> float:
        return self.profile.round_ms_at(g, self.batch) / 1e3 / expected_tokens(ALPHA, g)

    def lookup(self, url: str, backend: str, namespace: str, name: str, variant: str, now: datetime,
               draft_length: int | None = None) -> Measurement:  # fmt: skip
        per_pod = {pod: PodMeasurement(self.batch, self.tpot(g)) for pod, g in self.lengths.items()}
        mean = sum(p.tpot_mean_s or 0.0 for p in per_pod.values()) / len(per_pod)
        return Measurement(
            phase="Ok",
            at=now,
            alpha=ALPHA if any(self.lengths.values()) else None,
            batch=self.batch,
            tpot_p50_s=mean,
            tpot_mean_s=mean,
            pods_reporting=len(per_pod),
            per_pod=per_pod,
        )

    async def close(self) -> None:
        pass

    async def apply_to_all(self, endpoints: Sequence[PodEndpoint], *, num_draft_tokens: int | None = None,
                           draft_model_name: str | None = None, retries: int = 2,
                           backoff_s: float = 0.2) -> FleetResult:  # fmt: skip
        assert num_draft_tokens is not None
        for endpoint in endpoints:
            self.lengths[endpoint.name] = num_draft_tokens
        results = [ApplyResult(pod=e.name, ok=True) for e in endpoints]
        return FleetResult(desired=len(endpoints), applied=len(endpoints), changed=0, results=results)


async def test_two_pods_split_at_one_moment_and_the_measured_slowdown_switches_off() -> None:
    fleet = Fleet(slow_world(), batch=2, pods=2)
    endpoints = [
        PodEndpoint(name, "default", "127.0.0.1", 8000 + i, "stable") for i, name in enumerate(fleet.lengths)
    ]
    loop = ControlLoop(fleet, fleet, rate_window_s=2.0)  # type: ignore[arg-type]
    # two minutes stand for hours here: the probe budget (2 % of the time by default) is widened
    # so that a second split fits after the load rises
    sdep = resource(exploration={"maxProbeFraction": 0.2, "minSpacing": "5s"})
    status: SpeculativeDeploymentStatus = fresh()
    events: list[Any] = []
    split_seen: list[tuple[int, dict[str, int], list[str]]] = []
    for second in range(120):
        if second == 40:
            fleet.batch = 32  # past this world's break-even; the roofline prior still promises a gain
        result = await loop.tick(sdep, status, endpoints, T0 + timedelta(seconds=second), draft_stale=False)
        status = result.status
        events.extend(result.events)
        shown = status.speculation.calibration
        if len(set(fleet.lengths.values())) > 1:
            assert shown.probing and shown.probe_kind == "split" and shown.probe_share == 0.5
            split_seen.append((second, dict(fleet.lengths), list(shown.probe_pods)))
    assert split_seen, [(e.reason, e.message) for e in events]
    assert any(second >= 40 for second, _, _ in split_seen)
    # the pods at the probe setting are the ones status names
    for _, lengths, probe_pods in split_seen:
        assert [
            p for p, g in lengths.items() if g != lengths[next(iter(set(lengths) - set(probe_pods)))]
        ] == probe_pods
    off = [e for e in events if e.reason == "SpeculationOffSplitSlowdown"]
    assert off and off[0].type == "Warning" and "split-fleet A/B at batch 32" in off[0].message, [
        (e.reason, e.message) for e in events
    ]
    assert status.speculation.state == "off" and not any(fleet.lengths.values())
    last = status.speculation.calibration.last_split
    assert (
        last is not None and last.acted and last.measured_speedup is not None and last.measured_speedup < 0.97
    )
    expected = fleet.profile.round_ms_at(0, 32) / fleet.profile.round_ms_at(last.on_length or 0, 32)
    assert last.measured_speedup == pytest.approx(
        expected * expected_tokens(ALPHA, last.on_length or 0), rel=0.02
    )
    # a split costs the probe pods' share of the fleet's throughput: half of its duration here
    ledger = status.speculation.calibration.ledger
    split_seconds = len(split_seen)
    assert ledger.probe_seconds == pytest.approx(0.5 * split_seconds, abs=1.01)
    # and the Event naming the split is posted once, as a Warning (no second Normal one)
    assert [e.reason for e in events].count("SpeculationOffSplitSlowdown") == 1


async def test_a_restart_during_a_split_resumes_it_from_status() -> None:
    fleet = Fleet(slow_world(), batch=2, pods=2)
    endpoints = [
        PodEndpoint(name, "default", "127.0.0.1", 8000 + i, "stable") for i, name in enumerate(fleet.lengths)
    ]
    sdep = resource(exploration={"maxProbeFraction": 0.2, "minSpacing": "5s"})  # as above
    loop = ControlLoop(fleet, fleet, rate_window_s=2.0)  # type: ignore[arg-type]
    status: SpeculativeDeploymentStatus = fresh()
    second = 0
    for second in range(200):
        if second == 40:
            fleet.batch = 32
        status = (
            await loop.tick(sdep, status, endpoints, T0 + timedelta(seconds=second), draft_stale=False)
        ).status
        shown = status.speculation.calibration
        if second > 40 and shown.probe_kind == "split" and shown.probing:
            break
    else:
        pytest.fail("no split within 200 s")
    split_lengths = dict(fleet.lengths)
    assert len(set(split_lengths.values())) == 2
    restarted = ControlLoop(fleet, fleet, rate_window_s=2.0)  # type: ignore[arg-type]
    status = SpeculativeDeploymentStatus.from_wire(status.to_wire())
    status = (
        await restarted.tick(sdep, status, endpoints, T0 + timedelta(seconds=second + 1), draft_stale=False)
    ).status
    assert fleet.lengths == split_lengths  # the same pods stay apart
    apart = [pod for pod, g in split_lengths.items() if g == status.speculation.calibration.probe_length]
    assert status.speculation.calibration.probe_pods == apart and len(apart) == 1
    assert status.speculation.calibration.probe_kind == "split" and status.speculation.calibration.probing


def verdict_of(speedup: float) -> split_fleet.SplitVerdict:
    return split_fleet.SplitVerdict(speedup, 3, ("pod-0",), ("pod-1",), 0.02, 0.02 * speedup, 64.0, 0.8, 3)


def test_a_split_switches_on_a_clear_gain_while_off_past_the_dwell_and_leaves_explicit_limits_alone() -> None:
    from specops.domain.control_status import policy_config
    from specops.domain.policy import Decision, PolicyState
    from specops.services.control import _split_decision

    config = policy_config(resource().spec)  # margin 0.02, hysteresis 0.05, min dwell 2 s
    now = T0 + timedelta(seconds=60)
    off = PolicyState("Dynamic", T0, False, 3, 0.8, T0 + timedelta(seconds=50), None)
    held = Decision(off, 0, "SpeculationDisabledHighBatch", "off", 1.0, changed=False)
    decision, acted = _split_decision(held, off, config, verdict_of(1.4), now)
    assert acted and decision.changed and decision.num_draft_tokens == 3
    assert decision.reason == "SpeculationOnSplitGain" and "measured speedup 1.40x" in decision.message
    assert decision.state.enabled and decision.state.last_toggle == now
    # a gain inside the on threshold, or within the dwell, changes nothing
    assert _split_decision(held, off, config, verdict_of(1.05), now) == (held, False)
    recent = PolicyState("Dynamic", T0, False, 3, 0.8, now - timedelta(seconds=1), None)
    assert _split_decision(held, recent, config, verdict_of(1.4), now)[1] is False
    # explicit batch limits rule on/off whatever a split measured
    pinned = replace(config, off_above_batch=96.0, on_below_batch=64.0)
    assert _split_decision(held, off, pinned, verdict_of(1.4), now)[1] is False
    # while on, a measured slowdown switches off
    on = replace(off, enabled=True)
    speculating = Decision(on, 3, "BestModelledSpeedup", "on", 1.5, changed=False)
    decision, acted = _split_decision(speculating, on, config, verdict_of(0.8), now)
    assert acted and decision.num_draft_tokens == 0 and decision.reason == "SpeculationOffSplitSlowdown"
    # and when the model switched off in the same tick, the switch is told with the split's
    # evidence (the same switch: its state, budget and toggle time are the model's decision's)
    switched = Decision(replace(off, last_toggle=now), 0, "SpeculationDisabledHighBatch", "off", 1.0, True)
    decision, acted = _split_decision(switched, on, config, verdict_of(0.8), now)
    assert (
        acted and decision.reason == "SpeculationOffSplitSlowdown" and "split-fleet A/B" in decision.message
    )
    assert decision.state == switched.state and decision.changed and decision.num_draft_tokens == 0
    # unless a Warning already told it (the slowdown guard's): one switch, one Warning
    assert _split_decision(switched, on, config, verdict_of(0.8), now, told=True) == (switched, False)


async def test_the_models_switch_waits_for_a_running_splits_verdict() -> None:
    # Given a split running at a batch past this world's break-even
    fleet = Fleet(slow_world(), batch=2, pods=2)
    endpoints = [
        PodEndpoint(name, "default", "127.0.0.1", 8000 + i, "stable") for i, name in enumerate(fleet.lengths)
    ]
    loop = ControlLoop(fleet, fleet, rate_window_s=2.0)  # type: ignore[arg-type]
    sdep = resource(exploration={"maxProbeFraction": 0.2, "minSpacing": "5s"})  # as above
    status: SpeculativeDeploymentStatus = fresh()
    events: list[Any] = []
    second = 0
    for second in range(200):
        if second == 40:
            fleet.batch = 32
        result = await loop.tick(sdep, status, endpoints, T0 + timedelta(seconds=second), draft_stale=False)
        status = result.status
        events.extend(result.events)
        if second > 40 and len(set(fleet.lengths.values())) > 1:
            break
    else:
        pytest.fail("no split within 200 s")
    assert status.speculation.state == "on"
    # When the load rises past where even the roofline prior finds no gain, mid-split
    fleet.batch = 2000
    held: list[str] = []
    split_at = second
    for second in range(split_at + 1, split_at + 60):
        result = await loop.tick(sdep, status, endpoints, T0 + timedelta(seconds=second), draft_stale=False)
        status = result.status
        events.extend(result.events)
        if status.speculation.calibration.probe_kind == "split" and status.speculation.calibration.probing:
            # Then while the split runs, the model's switch waits, told in status
            assert status.speculation.state == "on", status.speculation
            if status.speculation.reason == "HeldForSplit":
                held.append(status.speculation.message or "")
        elif status.speculation.state == "off":
            break
    assert held and "split-fleet A/B" in held[0] and "The model alone would say: Speculation off" in held[0]
    # and the switch comes once, when the split has its verdict
    switches = [e for e in events if e.reason.startswith(("SpeculationOff", "SpeculationDisabled"))]
    assert len(switches) == 1 and status.speculation.state == "off", [(e.reason, e.message) for e in events]
    assert status.speculation.calibration.last_split is not None


def test_only_the_models_own_switches_wait_for_a_split() -> None:
    from specops.domain.control_status import policy_config
    from specops.domain.policy import Decision, PolicyState
    from specops.services.control import _split_decides

    config = policy_config(resource().spec)
    on = PolicyState("Dynamic", T0, True, 3, 0.8, T0, None)
    off = replace(on, enabled=False, last_toggle=T0 + timedelta(seconds=5))
    model_off = Decision(off, 0, "SpeculationDisabledHighBatch", "off", 1.0, changed=True)
    assert _split_decides(model_off, on, config)
    # no switch, the slowdown guard, a forced mode, a stale draft and explicit limits go through
    assert not _split_decides(Decision(on, 3, "BestModelledSpeedup", "on", 1.4, False), on, config)
    for reason in ("SpeculationOffMeasuredSlowdown", "ForcedOff", "SpeculationOffDraftStale"):
        assert not _split_decides(replace(model_off, reason=reason), on, config)
    assert not _split_decides(model_off, on, replace(config, off_above_batch=96.0))
