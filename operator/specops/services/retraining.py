"""Retraining's part of one resource's tick: trigger, create the training Job once, read its result.

All state is in status.retraining (domain.retraining.RetrainingState): the Job's name
derives from the target version and round number, so however often the operator
restarts, a round creates one Job. A finished round leaves a trained draft that the
canary rolls out (spec.retraining.autoCanary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import DraftSpec, SpeculativeDeployment, SpeculativeDeploymentSpec
from specops.api.status import RetrainingStatus, SpeculativeDeploymentStatus
from specops.domain import drafts
from specops.domain import retraining as rt
from specops.domain.lifecycle import EventRecord
from specops.ports import KubeApiError, KubePort


@dataclass
class RetrainingResult:
    """Retraining's part of status and what to tell people; `candidate` waits for its canary."""

    retraining: RetrainingStatus
    updates: list[ConditionUpdate] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    candidate: DraftSpec | None = None
    draft_stale: bool = False


def trained_to_draft(spec_draft: DraftSpec, trained: rt.TrainedDraft) -> DraftSpec:
    """The trained draft as a DraftSpec: same model, method, kind and size, new version and checkpoint."""
    return DraftSpec(
        model=spec_draft.model,
        version=trained.draft_version,
        method=spec_draft.method,
        kind=spec_draft.kind,
        parameters=spec_draft.parameters,
        uri=trained.checkpoint_uri,
    )


def serving_spec(
    spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus
) -> SpeculativeDeploymentSpec:
    """The spec with the draft that serves in place of spec.draft (the same spec when they agree)."""
    serving = drafts.stable_draft(spec.draft, status)
    return spec if serving == spec.draft else spec.model_copy(update={"draft": serving})


def after_canary(
    spec: SpeculativeDeploymentSpec,
    retraining: RetrainingStatus,
    result: str,
    source: str | None,
    evidence: str,
    now: datetime,
) -> tuple[RetrainingStatus, list[ConditionUpdate]]:
    """A canary ended: a promoted draft is current for this target; a rejected trained draft is a failed round."""
    before = rt.RetrainingState.from_status(retraining, default_target_version=spec.target.version)
    if result == "Promoted":
        state = rt.accept_trained_draft(before, spec.target.version)
    elif source == "Retraining":
        state = rt.reject_trained_draft(spec, before, evidence, now)
    else:
        return retraining, []
    return state.to_status(), list(rt.retraining_conditions(spec, state, now))


class RetrainingService:
    def __init__(self, kube: KubePort) -> None:
        self.kube = kube

    async def tick(
        self, resource: SpeculativeDeployment, status: SpeculativeDeploymentStatus, now: datetime
    ) -> RetrainingResult:
        """Retraining works from the draft serving (status.draft), not spec.draft: after a rollback
        spec.draft names a rejected draft, and the conditions, the round's output version and the
        training Job all concern the draft in service."""
        spec = serving_spec(resource.spec, status)
        resource = resource.model_copy(update={"spec": spec})
        namespace = resource.metadata["namespace"]
        before = rt.RetrainingState.from_status(status.retraining, default_target_version=spec.target.version)
        state = rt.observe_acceptance(before, status.observed.alpha, spec.slo.min_acceptance, now)
        events: list[EventRecord] = []
        updates: list[ConditionUpdate] = []

        if rt.superseded(spec, state):
            state = await self._supersede(spec, state, namespace, now, events)
        if state.active is not None:
            state = await self._follow(spec, state, namespace, now, events)
        else:
            trigger = rt.retraining_trigger(spec, state, now=now)
            if trigger is not None:
                try:
                    manifest = rt.render_training_job(resource, trigger)
                except rt.TemplateError as error:
                    message = f"{error.field}: {error}"
                    updates.append(
                        ConditionUpdate(cond.RETRAINING, "False", Reason.INVALID_TEMPLATE, message)
                    )
                    previous = cond.find_condition(status.conditions, cond.RETRAINING)
                    if previous is None or previous.reason != Reason.INVALID_TEMPLATE:
                        events.append(EventRecord("Warning", Reason.INVALID_TEMPLATE, message))
                else:
                    if await self._create_once(manifest):
                        events.append(
                            EventRecord(
                                "Normal",
                                Reason.RETRAINING_STARTED,
                                f"{trigger.message}: {manifest['kind']} {manifest['metadata']['name']}",
                            )
                        )
                    state = rt.start_round(state, trigger, manifest, now)

        updates = [*rt.retraining_conditions(spec, state, now), *updates]
        trained = rt.draft_to_canary(spec, state)
        return RetrainingResult(
            retraining=state.to_status(),
            updates=updates,
            events=events,
            candidate=trained_to_draft(spec.draft, trained) if trained is not None else None,
            draft_stale=rt.draft_stale(spec, state),
        )

    async def _follow(
        self,
        spec: SpeculativeDeploymentSpec,
        state: rt.RetrainingState,
        namespace: str,
        now: datetime,
        events: list[EventRecord],
    ) -> rt.RetrainingState:
        active = state.active
        assert active is not None
        job = await self.kube.get(active.api_version, active.kind, namespace, active.job_name)
        if job is None:
            outcome: rt.Outcome = rt.Failed(f"{active.kind} {active.job_name} disappeared")
        else:
            pods = await self.kube.list("v1", "Pod", namespace, rt.pod_selector(active))
            outcome = rt.training_outcome(job, pods)
        if isinstance(outcome, rt.Running):
            return state
        state = rt.finish_round(spec, state, outcome, now)
        if isinstance(outcome, rt.Succeeded):
            events.append(
                EventRecord(
                    "Normal",
                    Reason.RETRAINING_SUCCEEDED,
                    f"{active.job_name} trained draft {outcome.draft_version}",
                )
            )
        else:
            events.append(
                EventRecord(
                    "Warning", Reason.RETRAINING_FAILED, f"{active.job_name}: {outcome.message}"[:1000]
                )
            )
        return state

    async def _supersede(
        self,
        spec: SpeculativeDeploymentSpec,
        state: rt.RetrainingState,
        namespace: str,
        now: datetime,
        events: list[EventRecord],
    ) -> rt.RetrainingState:
        """Stop the running round's training object (its pods go with it) and close the round as
        superseded. Only once the delete is confirmed (or the object is already gone): a refused
        delete raises, the round stays recorded and the next tick tries again, so no Job is left
        running unrecorded."""
        active = state.active
        assert active is not None
        await self.kube.delete(active.api_version, active.kind, namespace, active.job_name)
        closed = rt.supersede_round(spec, state, now)
        events.append(
            EventRecord(
                "Normal",
                Reason.RETRAINING_SUPERSEDED,
                f"{active.kind} {active.job_name} stopped: {closed.last_message}",
            )
        )
        return closed

    async def _create_once(self, manifest: dict[str, Any]) -> bool:
        """Create the training object; one that already exists (created before a restart) is kept.

        Only a 409 whose reason is AlreadyExists means that: another 409 (a quota or admission
        conflict) is an error, retried next tick, and never recorded as a started round.
        """
        try:
            await self.kube.create(manifest)
        except KubeApiError as error:
            if error.conflict and error.reason == "AlreadyExists":
                return False
            raise
        return True
