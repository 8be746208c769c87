"""The speculation control loop's part of one resource's tick.

gather: the latest measurement from the metrics hub (in memory; the hub's poller runs one
grouped query set for every resource) and the ready serving pods (given by the tick);
decide: domain.policy.decide on the state kept in status (so a restart resumes);
act: set num_draft_tokens on every pod through Triton's model control. The tick writes
status; Events come only from decisions that change something.

A metrics outage is a measured state: the loop holds its last decision (still pushing it
to pods that lack it, e.g. new ones), sets MetricsUnavailable, and decides nothing until
fresh data returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import SpeculativeDeployment
from specops.api.status import PodsApplied, SpeculativeDeploymentStatus
from specops.domain import control_status as cs
from specops.domain.discovery import PodEndpoint
from specops.domain.lifecycle import EventRecord
from specops.domain.metrics import REASON_PENDING
from specops.domain.names import STABLE
from specops.domain.policy import PolicyState, decide
from specops.ports import MetricsSource, ModelControl


@dataclass
class ControlResult:
    """The control loop's part of status (speculation, baseline, observed) and what to tell people."""

    status: SpeculativeDeploymentStatus
    updates: list[ConditionUpdate] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)


class ControlLoop:
    """One tick = gather, decide, act for one resource."""

    def __init__(self, metrics: MetricsSource, triton: ModelControl, *, retries: int = 2) -> None:
        self.metrics = metrics
        self.triton = triton
        self.retries = retries
        # The policy state between ticks, per resource (uid-checked). Status holds the same state,
        # written when a decision changes something and at least every refresh period, so a
        # restart resumes from status with at most that much smoothing progress lost.
        self._memory: dict[tuple[str, str], tuple[str, PolicyState]] = {}

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
            held = current.draft_length
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

        config = cs.policy_config(spec, draft_stale=draft_stale)
        uid = str(resource.metadata.get("uid", ""))
        remembered = self._memory.get((namespace, name))
        if remembered is not None and remembered[0] == uid:
            state = remembered[1]
        else:
            state = cs.state_from_status(current, status.baseline, config, now)
        observation = cs.observation_from(measurement)
        decision = decide(config, state, observation, now)
        self._memory[(namespace, name)] = (uid, decision.state)
        fleet = await self.triton.apply_to_all(
            endpoints, num_draft_tokens=decision.num_draft_tokens, retries=self.retries
        )
        updates.append(ConditionUpdate(cond.METRICS_UNAVAILABLE, "False", Reason.METRICS_OK, ""))
        updates.append(cs.acceptance_condition(decision, spec.slo.min_acceptance))
        updates.append(
            cs.applied_condition(fleet.desired, fleet.applied, dict(fleet.errors), decision.num_draft_tokens)
        )
        if decision.changed:
            events.append(EventRecord("Normal", decision.reason, decision.message))
        pods = PodsApplied(desired=fleet.desired, applied=fleet.applied)
        new_status = status.model_copy(
            update={
                "speculation": cs.speculation_status(decision, observation, now, pods),
                "baseline": cs.baseline_status(decision.state, status.baseline),
                "observed": cs.observed_status(measurement),
            }
        )
        return ControlResult(new_status, updates, events)


def _key(resource: SpeculativeDeployment) -> tuple[str, str]:
    return (str(resource.metadata["namespace"]), str(resource.metadata["name"]))
