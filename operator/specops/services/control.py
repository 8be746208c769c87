"""The speculation control loop's part of one resource's tick.

gather: the latest measurement from the metrics hub (in memory; the hub's poller runs one
grouped query set for every resource) and the ready serving pods (given by the tick);
learn: the measurement becomes a calibration sample of the setting in force once it has
settled (domain.learning); decide: domain.policy.decide on the state kept in status (so a
restart resumes), its Dynamic phase predicting from the calibrated model; the measured-slowdown
guard and bounded probes may then override what the pods run (domain.learning); act: set
num_draft_tokens on every pod through Triton's model control. The tick writes status; Events
come only from decisions that change something, probes, the guard and break-even moves.

A metrics outage is a measured state: the loop holds its last decision (still pushing it
to pods that lack it, e.g. new ones), sets MetricsUnavailable, and decides nothing until
fresh data returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import SpeculativeDeployment
from specops.api.status import PodsApplied, SpeculativeDeploymentStatus
from specops.domain import control_status as cs
from specops.domain import learning
from specops.domain.discovery import PodEndpoint
from specops.domain.lifecycle import EventRecord
from specops.domain.metrics import REASON_PENDING
from specops.domain.names import STABLE
from specops.domain.policy import PRIOR_ALPHA, Decision, PolicyState, decide
from specops.ports import MetricsSource, ModelControl


@dataclass
class ControlResult:
    """The control loop's part of status (speculation, baseline, observed) and what to tell people."""

    status: SpeculativeDeploymentStatus
    updates: list[ConditionUpdate] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)


class ControlLoop:
    """One tick = gather, decide, act for one resource."""

    def __init__(
        self, metrics: MetricsSource, triton: ModelControl, *, retries: int = 2, rate_window_s: float = 60.0
    ) -> None:
        self.metrics = metrics
        self.triton = triton
        self.retries = retries
        self.rate_window_s = rate_window_s  # what one measurement spans: samples wait for it to settle
        # The policy and learning state between ticks, per resource (uid-checked). Status holds the
        # same state, written when a decision changes something and at least every refresh period,
        # so a restart resumes from status with at most that much smoothing and learning lost.
        self._memory: dict[tuple[str, str], tuple[str, PolicyState, learning.LearningState]] = {}

    def subscribe(self, resource: SpeculativeDeployment, interval_s: float) -> None:
        spec = resource.spec
        self.metrics.register(_key(resource), spec.metrics.prometheus.url, spec.serving.backend, interval_s)

    def unsubscribe(self, namespace: str, name: str) -> None:
        self.metrics.unregister((namespace, name))
        self._memory.pop((namespace, name), None)

    async def tick(
        self,
        resource: SpeculativeDeployment,
        status: SpeculativeDeploymentStatus,
        endpoints: Sequence[PodEndpoint],
        now: datetime,
        *,
        draft_stale: bool,
        draft_unchecked: bool = False,
    ) -> ControlResult:
        spec = resource.spec
        namespace, name = _key(resource)
        current = status.speculation
        measurement = self.metrics.lookup(
            spec.metrics.prometheus.url,
            spec.serving.backend,
            namespace,
            name,
            STABLE,
            now,
            draft_length=current.draft_length or None,
        )
        updates: list[ConditionUpdate] = []
        events: list[EventRecord] = []
        # Every variant runs the same setting, so a canary is compared like for like.
        if not measurement.ok:
            # Hold: the last decision stays, pods that lack it still get it, nothing new is decided.
            held = 0 if draft_unchecked else current.draft_length
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
            pods = PodsApplied(desired=fleet.desired, applied=fleet.applied)
            updates.append(cs.applied_condition(fleet.desired, fleet.applied, dict(fleet.errors), held))
            speculation = current.model_copy(update={"pods": pods})
            return ControlResult(status.model_copy(update={"speculation": speculation}), updates, events)

        config = cs.policy_config(spec, draft_stale=draft_stale, draft_unchecked=draft_unchecked)
        learn = cs.learning_config(spec, self.rate_window_s)
        uid = str(resource.metadata.get("uid", ""))
        remembered = self._memory.get((namespace, name))
        if remembered is not None and remembered[0] == uid:
            state, knowledge = remembered[1], remembered[2]
        else:
            state = cs.state_from_status(current, status.baseline, config, now)
            knowledge = learning.from_status(current.calibration, current.last_decision_time)
        observation = cs.observation_from(measurement)
        tpot = measurement.tpot_mean_s if measurement.tpot_mean_s is not None else measurement.tpot_p50_s
        seen = learning.Observed(observation.batch, tpot, observation.alpha)
        knowledge = learning.observe(knowledge, seen, config.setup, learn, now)
        fitted = learning.model(config.setup, knowledge, learn)
        if learn.enabled:
            config = replace(config, model=fitted)
        decision = decide(config, state, observation, now)
        learns = (
            config.mode == "auto"
            and not (config.draft_stale_off or config.draft_unchecked_off)
            and decision.state.phase == "Dynamic"
        )
        learns = learns and state.phase == "Dynamic"
        if learns:
            verdict = learning.guard(knowledge, fitted, seen, decision.num_draft_tokens, learn, now)
            knowledge = verdict.state
            if verdict.fired:
                decision = _off(
                    decision,
                    now,
                    "SpeculationOffMeasuredSlowdown",
                    f"Speculation off: {verdict.evidence}.",
                    changed=True,
                )
                events.append(EventRecord("Warning", decision.reason, decision.message))
            elif decision.num_draft_tokens > 0 and not state.enabled and learning.holds_off(knowledge, seen):
                decision = _off(
                    decision,
                    now,
                    "HeldMeasuredSlowdown",
                    f"Speculation stays off: it was measured slower than plain at batch "
                    f"{knowledge.slowdown_batch or 0.0:.0f} and the batch is {seen.batch:.0f}.",
                    changed=decision.state.phase != state.phase,
                )
            step = decision.num_draft_tokens
            if (
                learn.enabled
                and step > 0
                and state.enabled
                and step != state.draft_length
                and (
                    knowledge.probe_length is not None
                    or (
                        knowledge.applied_length == state.draft_length
                        and not learning.settled(knowledge, learn, now)
                    )
                )
            ):
                # one length step per measured setting: the current one is measured before the next
                # (and none while a probe runs: the step would go unmeasured)
                decision = _hold_length(decision, state.draft_length, knowledge, learn, now, current.reason)
        alpha = decision.state.alpha if decision.state.alpha is not None else PRIOR_ALPHA
        bounds = (max(1, config.min_length), max(1, config.min_length, config.max_length))
        last = knowledge.decided_at
        dt = 0.0 if last is None else min(max(0.0, (now - last).total_seconds()), 3.0 * learn.settle_s)
        exploration = learning.explore(
            knowledge,
            fitted,
            allowed=learns and status.canary is None,
            enabled=decision.num_draft_tokens > 0,
            decided_length=decision.num_draft_tokens,
            decision_changed=decision.changed,
            alpha=alpha,
            batch=seen.batch,
            bounds=bounds,
            dt_s=dt if learns else 0.0,
            config=learn,
            now=now,
        )
        knowledge = exploration.state
        tokens = exploration.num_draft_tokens
        if exploration.probe and knowledge.last_probe_at == now:
            events.append(
                EventRecord(
                    "Normal",
                    "CalibrationProbe",
                    f"Probing num_draft_tokens={tokens} for {learn.probes.probe_duration_s:.0f} s "
                    f"({exploration.reason}); the decision stays {decision.num_draft_tokens}.",
                )
            )
        fleet = await self.triton.apply_to_all(endpoints, num_draft_tokens=tokens, retries=self.retries)
        knowledge = learning.applied(knowledge, tokens, now)
        computed = decision.state.phase == "Dynamic"
        break_even = prior_break_even = None
        if computed:
            break_even = learning.break_even(fitted, alpha, bounds)
            prior = learning.model(config.setup, learning.LearningState(), learn)
            prior_break_even = learning.break_even(prior, alpha, bounds)
            knowledge, moved = learning.announce(knowledge, break_even, prior_break_even)
            if moved is not None:
                events.append(
                    EventRecord(
                        "Normal",
                        "CalibrationMovedBreakEven",
                        f"{moved} (alpha {alpha:.2f}, {knowledge.calibration.samples} samples, "
                        f"relative fit error {fitted.relative_fit_error() or 0.0:.3f}).",
                    )
                )
        knowledge = replace(knowledge, decided_at=now)
        self._memory[(namespace, name)] = (uid, decision.state, knowledge)
        updates.append(ConditionUpdate(cond.METRICS_UNAVAILABLE, "False", Reason.METRICS_OK, ""))
        updates.append(cs.acceptance_condition(decision, spec.slo.min_acceptance))
        updates.append(cs.applied_condition(fleet.desired, fleet.applied, dict(fleet.errors), tokens))
        if decision.changed:
            events.append(EventRecord("Normal", decision.reason, decision.message))
        pods = PodsApplied(desired=fleet.desired, applied=fleet.applied)
        speculation = cs.speculation_status(decision, observation, now, pods)
        calibration = learning.to_status(
            knowledge,
            fitted,
            learn,
            batch=seen.batch,
            break_even_batch=break_even,
            prior_break_even_batch=prior_break_even,
            computed=computed,
        )
        speculation = speculation.model_copy(update={"calibration": calibration})
        if exploration.probe:  # state stays the decision's; draftLength is what the pods run
            speculation = speculation.model_copy(update={"draft_length": tokens})
        new_status = status.model_copy(
            update={
                "speculation": speculation,
                "baseline": cs.baseline_status(decision.state, status.baseline),
                "observed": cs.observed_status(measurement),
            }
        )
        return ControlResult(new_status, updates, events)


def _off(decision: Decision, now: datetime, reason: str, message: str, *, changed: bool) -> Decision:
    """The decision turned into speculation off (the guard's verdict outranks the model's)."""
    state = replace(
        decision.state,
        enabled=False,
        last_toggle=now if changed else decision.state.last_toggle,
        enable_evidence=0.0,
        evidence_at=now,
    )
    return Decision(state, 0, reason, message, 1.0, changed=changed)


def _hold_length(
    decision: Decision,
    length: int,
    knowledge: learning.LearningState,
    learn: learning.LearningConfig,
    now: datetime,
    reason: str | None,
) -> Decision:
    """Keep the length (and the last reason: a wait is not a new decision; the message says why)."""
    since = 0.0 if knowledge.applied_since is None else (now - knowledge.applied_since).total_seconds()
    message = (
        f"Keeping draft length {length} until it is measured ({since:.0f}/{learn.settle_s:.0f} s); "
        f"then toward {decision.num_draft_tokens}. {decision.message}"
    )
    state = replace(decision.state, draft_length=length)
    shown = reason or "BestModelledSpeedup"
    return Decision(state, length, shown, message, decision.predicted_speedup, changed=False)


def _key(resource: SpeculativeDeployment) -> tuple[str, str]:
    return (str(resource.metadata["namespace"]), str(resource.metadata["name"]))
