"""The speculation control loop of one SpeculativeDeployment: one tick per metrics interval.

gather: the latest measurement from the metrics hub (in memory; the hub's poller
runs one grouped query set for every resource) and the ready serving pods;
decide: domain.policy.decide on state kept in status (so a restart resumes);
act: set num_draft_tokens on every pod through Triton's model control, then one
optimistic status write, and Events only when a decision changed something.

A metrics outage is a measured state: the loop holds its last decision (still
pushing it to pods that lack it, e.g. new ones), sets MetricsUnavailable, and
decides nothing until fresh data returns.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from specops.adapters.ports import FleetResult, KubePort, MetricsSource, ModelControl
from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import API_VERSION, KIND, SpeculativeDeployment, SpeculativeDeploymentSpec
from specops.api.units import format_duration, parse_duration
from specops.domain import lifecycle, perf
from specops.domain.discovery import ready_endpoints
from specops.domain.lifecycle import EventRecord
from specops.domain.metrics import REASON_PENDING, Measurement
from specops.domain.policy import (
    Baseline,
    Decision,
    Observation,
    PolicyConfig,
    PolicyState,
    decide,
    initial_state,
    measured_speedup,
)

log = logging.getLogger(__name__)

STABLE = "stable"
# A measurement older than this many intervals is stale.
STALE_INTERVALS = 3.0
SERVING_PHASES = {"Baseline", "Fixed", "Dynamic"}
# Phases in which the loop keeps tuning the pods (a canary or a retraining round runs beside it).
ACTIVE_PHASES = SERVING_PHASES | {"Canary", "Retraining"}
# Status fields that move with every measurement; a change of only these is written at most
# once per refresh period (max(MIN_STATUS_REFRESH_S, STATUS_REFRESH_INTERVALS x interval)).
VOLATILE_STATUS = {
    "speculation": {
        "lastDecisionTime", "message", "predictedSpeedup", "measuredSpeedup",
        "smoothedAlpha", "enableEvidence", "evidenceAt",
    },
    "observed": None,  # every field
    "baseline": None,
}  # fmt: skip
MIN_STATUS_REFRESH_S = 10.0
STATUS_REFRESH_INTERVALS = 4.0
# The loop's own conditions, and the status that deserves a Warning Event when it appears.
LOOP_CONDITION_WARNINGS = {
    cond.METRICS_UNAVAILABLE: "True",
    cond.SPECULATION_APPLIED: "False",
    cond.DEGRADED: "True",
}


def _seconds_or_none(text: str | None) -> float | None:
    return parse_duration(text) if text else None


def policy_config(spec: SpeculativeDeploymentSpec) -> PolicyConfig:
    """The policy's view of a spec: bounds clipped to the engine, the performance model of this setup."""
    speculation, guard = spec.speculation, spec.speculation.batch_guard
    engine_max = spec.target.engine.max_draft_len
    setup = perf.ModelSetup(
        gpu=perf.GPUS[spec.serving.gpu.type],
        target_params=spec.target.active_parameter_count,
        draft_params=spec.draft.parameter_count,
        bytes_per_param=perf.BYTES_PER_PARAM[spec.target.precision],
        tensor_parallel=spec.serving.tensor_parallel,
        context_tokens=perf.DEFAULT_CONTEXT_TOKENS,
    )
    return PolicyConfig(
        mode=speculation.mode,
        initial_length=min(speculation.draft_length.initial, engine_max),
        min_length=min(speculation.draft_length.min, engine_max),
        max_length=min(speculation.draft_length.max, engine_max),
        baseline_duration_s=parse_duration(speculation.rollout.baseline),
        soak_duration_s=parse_duration(speculation.rollout.soak),
        setup=setup,
        margin=guard.margin,
        hysteresis=guard.hysteresis,
        min_dwell_s=parse_duration(guard.min_dwell),
        off_above_batch=guard.off_above,
        on_below_batch=guard.on_below,
        min_acceptance=spec.slo.min_acceptance,
    )


def state_from_status(status: Mapping[str, Any], config: PolicyConfig, now: datetime) -> PolicyState:
    """Rebuild the policy state persisted in status; a fresh resource starts in Baseline."""
    speculation = status.get("speculation") or {}
    phase = speculation.get("controlPhase")
    since = cond.parse_time(speculation.get("phaseSince"))
    if phase not in SERVING_PHASES or since is None:
        return initial_state(config, now)
    recorded = status.get("baseline") or {}
    baseline = None
    if recorded.get("samples"):
        baseline = Baseline(
            p50_s=_seconds_or_none(recorded.get("perTokenLatencyP50")),
            p95_s=_seconds_or_none(recorded.get("perTokenLatencyP95")),
            p99_s=_seconds_or_none(recorded.get("perTokenLatencyP99")),
            tokens_per_s=recorded.get("tokensPerSecond"),
            samples=int(recorded["samples"]),
        )
    return PolicyState(
        phase=phase,
        phase_since=since,
        enabled=speculation.get("state") == "on",
        draft_length=int(speculation.get("tunedLength") or config.initial_length),
        alpha=speculation.get("smoothedAlpha"),
        last_toggle=cond.parse_time(speculation.get("lastToggleTime")),
        baseline=baseline,
        enable_evidence=float(speculation.get("enableEvidence") or 0.0),
        evidence_at=cond.parse_time(speculation.get("evidenceAt")),
    )


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _duration_text(seconds: float | None) -> str | None:
    return None if seconds is None else format_duration(seconds)


def decision_status(
    decision: Decision, observation: Observation, measurement: Measurement, now: datetime
) -> dict[str, Any]:
    """The status fields a decision owns (speculation, baseline, observed)."""
    state = decision.state
    speedup = measured_speedup(state.baseline, observation) if decision.num_draft_tokens else None
    patch: dict[str, Any] = {
        "speculation": {
            "state": "on" if decision.num_draft_tokens > 0 else "off",
            "draftLength": decision.num_draft_tokens,
            "tunedLength": state.draft_length,
            "controlPhase": state.phase,
            "phaseSince": cond.format_time(state.phase_since),
            "reason": decision.reason,
            "message": decision.message,
            "predictedSpeedup": _round(decision.predicted_speedup),
            "measuredSpeedup": _round(speedup),
            "smoothedAlpha": _round(state.alpha, 4),
            "enableEvidence": _round(state.enable_evidence, 3),
            "evidenceAt": cond.format_time(state.evidence_at) if state.evidence_at else None,
            "lastToggleTime": cond.format_time(state.last_toggle) if state.last_toggle else None,
        },
        "observed": {
            "alpha": _round(measurement.alpha, 4),
            "acceptanceRate": _round(measurement.acceptance_rate, 4),
            "batch": _round(measurement.batch, 2),
            "perTokenLatencyP99": _duration_text(measurement.tpot_p99_s),
            "requestRate": _round(measurement.request_rate),
            "at": cond.format_time(measurement.at),
        },
    }
    if state.baseline is not None:
        patch["baseline"] = {
            "perTokenLatencyP50": _duration_text(state.baseline.p50_s),
            "perTokenLatencyP95": _duration_text(state.baseline.p95_s),
            "perTokenLatencyP99": _duration_text(state.baseline.p99_s),
            "tokensPerSecond": _round(state.baseline.tokens_per_s, 1),
            "samples": state.baseline.samples,
        }
    return patch


def observation_from(measurement: Measurement) -> Observation:
    return Observation(
        batch=measurement.batch or 0.0,
        alpha=measurement.alpha,
        tpot_p50_s=measurement.tpot_p50_s,
        tpot_p95_s=measurement.tpot_p95_s,
        tpot_p99_s=measurement.tpot_p99_s,
        tokens_per_s=measurement.tokens_per_s,
    )


def _significant_change(patch: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether the patch changes anything beyond the volatile measurement fields (None = absent)."""
    for key, value in patch.items():
        current = live.get(key)
        if not isinstance(value, Mapping):
            if value != current:
                return True
            continue
        volatile = VOLATILE_STATUS.get(key, set())
        if volatile is None:
            continue
        current = current if isinstance(current, Mapping) else {}
        for field_name, field_value in value.items():
            if field_name not in volatile and field_value != current.get(field_name):
                return True
    return False


def acceptance_condition(decision: Decision, min_acceptance: float) -> ConditionUpdate:
    """AcceptanceBelowSLO: the smoothed alpha against slo.minAcceptance, judged only while speculating."""
    alpha = decision.state.alpha
    if alpha is None or decision.num_draft_tokens == 0:
        return ConditionUpdate(
            cond.ACCEPTANCE_BELOW_SLO, "Unknown", "NotSpeculating", "no acceptance measured now"
        )
    if alpha < min_acceptance:
        return ConditionUpdate(
            cond.ACCEPTANCE_BELOW_SLO,
            "True",
            Reason.ACCEPTANCE_BELOW_SLO,
            f"per-token acceptance {alpha:.2f} < slo.minAcceptance {min_acceptance:.2f}",
        )
    return ConditionUpdate(
        cond.ACCEPTANCE_BELOW_SLO,
        "False",
        Reason.ACCEPTANCE_OK,
        f"per-token acceptance {alpha:.2f} >= slo.minAcceptance {min_acceptance:.2f}",
    )


def applied_condition(fleet: FleetResult, num_draft_tokens: int) -> ConditionUpdate:
    if fleet.desired == 0:
        return ConditionUpdate(
            cond.SPECULATION_APPLIED, "Unknown", Reason.WAITING_FOR_PODS, "no ready serving pod"
        )
    if fleet.complete:
        return ConditionUpdate(
            cond.SPECULATION_APPLIED,
            "True",
            Reason.ALL_PODS_APPLIED,
            f"num_draft_tokens={num_draft_tokens} on {fleet.applied}/{fleet.desired} pods",
        )
    failing = ", ".join(f"{pod}: {message}" for pod, message in sorted(fleet.errors.items()))
    return ConditionUpdate(
        cond.SPECULATION_APPLIED,
        "False",
        Reason.PARTIALLY_APPLIED,
        f"num_draft_tokens={num_draft_tokens} on {fleet.applied}/{fleet.desired} pods; failing: {failing}"[
            :1000
        ],
    )


@dataclass(frozen=True)
class TickResult:
    body: dict[str, Any] | None
    events: list[EventRecord]
    interval_s: float


class ControlLoop:
    """One tick = gather, decide, act for one resource. State lives in status only."""

    def __init__(
        self, kube: KubePort, metrics: MetricsSource, triton: ModelControl, *, retries: int = 2
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.triton = triton
        self.retries = retries
        # The policy state between ticks, per resource (uid-checked). Status holds the same state,
        # written when a decision changes something and at least every refresh period, so a
        # restart resumes from status with at most that much smoothing progress lost.
        self._memory: dict[tuple[str, str], tuple[str, PolicyState]] = {}

    def interval_s(self, body: Mapping[str, Any], default: float) -> float:
        text = ((body.get("spec") or {}).get("metrics") or {}).get("interval")
        try:
            return parse_duration(text) if text else default
        except ValueError:
            return default

    def subscribe(self, body: Mapping[str, Any], interval_s: float) -> None:
        spec = body.get("spec") or {}
        url = ((spec.get("metrics") or {}).get("prometheus") or {}).get("url")
        backend = (spec.get("serving") or {}).get("backend", "triton-trtllm")
        if url:
            self.metrics.register(self._key(body), url, backend, interval_s)

    def unsubscribe(self, body: Mapping[str, Any]) -> None:
        self.metrics.unregister(self._key(body))
        self._memory.pop(self._key(body), None)

    @staticmethod
    def _key(body: Mapping[str, Any]) -> tuple[str, str]:
        return (body["metadata"]["namespace"], body["metadata"]["name"])

    async def tick(self, namespace: str, name: str, now: datetime, default_interval_s: float) -> TickResult:
        body = await self.kube.get(API_VERSION, KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return TickResult(None, [], default_interval_s)
        interval_s = self.interval_s(body, default_interval_s)
        try:
            resource = SpeculativeDeployment.model_validate(body)
        except ValidationError:
            return TickResult(body, [], interval_s)  # the reconciler reports InvalidSpec
        status = body.get("status") or {}
        if status.get("phase") not in ACTIVE_PHASES:
            return TickResult(body, [], interval_s)  # not serving yet
        self.subscribe(body, interval_s)
        spec = resource.spec
        config = policy_config(spec)
        current = status.get("speculation") or {}
        measurement = self.metrics.lookup(
            spec.metrics.prometheus.url,
            spec.serving.backend,
            namespace,
            name,
            STABLE,
            now,
            draft_length=current.get("draftLength") or None,
        )
        # Every variant runs the same setting, so a canary is compared like for like.
        pods = await self.kube.list("v1", "Pod", namespace, {"specops.dev/deployment": name})
        endpoints = ready_endpoints(pods)
        events: list[EventRecord] = []
        updates: list[ConditionUpdate] = []
        patch: dict[str, Any]

        if not measurement.ok:
            # Hold: the last decision stays, pods that lack it still get it, nothing new is decided.
            held = int(current.get("draftLength") or 0)
            fleet = await self.triton.apply_to_all(endpoints, num_draft_tokens=held, retries=self.retries)
            if measurement.reason != REASON_PENDING:  # the first poll after start-up is not an outage
                updates.append(
                    ConditionUpdate(
                        cond.METRICS_UNAVAILABLE,
                        "True",
                        measurement.reason or Reason.PROMETHEUS_UNREACHABLE,
                        f"{measurement.error}; holding num_draft_tokens={held}",
                    )
                )
            patch = {}
        else:
            uid = str(body["metadata"].get("uid", ""))
            remembered = self._memory.get((namespace, name))
            if remembered is not None and remembered[0] == uid:
                state = remembered[1]
            else:
                state = state_from_status(status, config, now)
            observation = observation_from(measurement)
            stale = (cond.find_condition(status.get("conditions") or [], "DraftStale") or {}).get(
                "status"
            ) == "True"
            if stale and spec.retraining.while_stale == "off":
                config = replace(config, mode="off")
            decision = decide(config, state, observation, now)
            if stale and spec.retraining.while_stale == "off":
                decision = replace(
                    decision,
                    reason="SpeculationOffDraftStale",
                    message="draft is stale for this target version; speculation off until a retrained draft is promoted",
                )
            self._memory[(namespace, name)] = (uid, decision.state)
            fleet = await self.triton.apply_to_all(
                endpoints, num_draft_tokens=decision.num_draft_tokens, retries=self.retries
            )
            updates.append(ConditionUpdate(cond.METRICS_UNAVAILABLE, "False", Reason.METRICS_OK, ""))
            patch = decision_status(decision, observation, measurement, now)
            patch["speculation"]["lastDecisionTime"] = cond.format_time(now)
            if status.get("phase") in SERVING_PHASES:
                patch["phase"] = decision.state.phase
            if decision.changed:
                events.append(EventRecord("Normal", decision.reason, decision.message))
            updates.append(acceptance_condition(decision, spec.slo.min_acceptance))
        held_length = patch.get("speculation", {}).get("draftLength", current.get("draftLength", 0))
        updates.append(applied_condition(fleet, int(held_length or 0)))
        patch.setdefault("speculation", {})["pods"] = {"desired": fleet.desired, "applied": fleet.applied}

        generation = int(body["metadata"].get("generation") or 1)
        refresh_s = max(MIN_STATUS_REFRESH_S, STATUS_REFRESH_INTERVALS * interval_s)

        def mutate(live: dict[str, Any]) -> dict[str, Any] | None:
            live_status = live.get("status") or {}
            if live_status.get("phase") not in ACTIVE_PHASES:
                return None  # no longer serving (deleted, invalid) meanwhile
            if live_status.get("phase") not in SERVING_PHASES:
                patch.pop("phase", None)
            old_conditions = list(live_status.get("conditions") or [])
            new_conditions = cond.set_conditions(old_conditions, updates, now, generation)
            significant = _significant_change(patch, live_status) or new_conditions != old_conditions
            observed_at = cond.parse_time((live_status.get("observed") or {}).get("at"))
            due = observed_at is None or (now - observed_at).total_seconds() >= refresh_s
            if not significant and not (due and "observed" in patch):
                return None  # only measurements moved: refreshed every refresh period, not every tick
            out: dict[str, Any] = {
                key: value for key, value in patch.items() if value != live_status.get(key)
            }
            if new_conditions != old_conditions:
                out["conditions"] = new_conditions
                events.extend(
                    lifecycle.condition_events(old_conditions, new_conditions, LOOP_CONDITION_WARNINGS)
                )
            return out or None

        written = await self.kube.update_status(API_VERSION, KIND, namespace, name, mutate)
        return TickResult(written or body, events, interval_s)
