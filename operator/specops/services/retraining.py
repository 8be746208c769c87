"""Draft retraining rounds: trigger, create the training Job once, read its result.

All state is in status.retraining (domain.retraining.RetrainingState): the Job's name
derives from the target version and round number, so however often the operator
restarts, a round creates one Job. A finished round leaves a trained draft that the
canary service rolls out (spec.retraining.autoCanary).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from specops.adapters.kube import KubeApiError
from specops.adapters.ports import KubePort
from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate
from specops.api.models import API_VERSION, KIND, DraftEngine, DraftSpec, SpeculativeDeployment
from specops.domain import retraining as rt
from specops.domain.lifecycle import EventRecord

log = logging.getLogger(__name__)


@dataclass
class RetrainingTick:
    events: list[EventRecord] = field(default_factory=list)
    candidate: DraftSpec | None = None  # a trained draft waiting for its canary
    stale: bool = False


def trained_to_draft(spec_draft: DraftSpec, trained: rt.TrainedDraft) -> DraftSpec:
    """The trained draft as a DraftSpec: same model, kind and size, new version and engine."""
    return DraftSpec(
        model=spec_draft.model,
        version=trained.draft_version,
        kind=spec_draft.kind,
        parameters=spec_draft.parameters,
        engine=DraftEngine(uri=trained.engine_uri),
    )


class RetrainingService:
    def __init__(self, kube: KubePort) -> None:
        self.kube = kube

    async def tick(
        self, resource: SpeculativeDeployment, body: dict[str, Any], alpha: float | None, now: datetime
    ) -> RetrainingTick:
        spec = resource.spec
        namespace = body["metadata"]["namespace"]
        status = body.get("status") or {}
        before = rt.RetrainingState.from_status(
            status.get("retraining"), default_target_version=spec.target.version
        )
        state = rt.observe_acceptance(before, alpha, spec.slo.min_acceptance, now)
        events: list[EventRecord] = []
        updates: list[ConditionUpdate] = []

        if state.active is not None:
            state = await self._follow(spec, state, namespace, now, events)
        else:
            trigger = rt.retraining_trigger(spec, state, now=now)
            if trigger is not None:
                try:
                    manifest = rt.render_training_job(resource, trigger)
                except rt.TemplateError as error:
                    message = f"{error.field}: {error}"
                    updates.append(ConditionUpdate(rt.RETRAINING, "False", "InvalidTemplate", message))
                    if (cond.find_condition(status.get("conditions") or [], rt.RETRAINING) or {}).get(
                        "reason"
                    ) != "InvalidTemplate":
                        events.append(EventRecord("Warning", "InvalidTemplate", message))
                else:
                    if await self._create_once(manifest):
                        events.append(
                            EventRecord(
                                "Normal",
                                "RetrainingStarted",
                                f"{trigger.message}: {manifest['kind']} {manifest['metadata']['name']}",
                            )
                        )
                    state = rt.start_round(state, trigger, manifest, now)

        updates = [*rt.retraining_conditions(spec, state, now), *updates]
        trained = rt.draft_to_canary(spec, state)
        result = RetrainingTick(
            events=events,
            candidate=trained_to_draft(spec.draft, trained) if trained is not None else None,
            stale=rt.draft_stale(spec, state),
        )
        await self._write(body, state, before, updates, now, result)
        return result

    async def _follow(
        self, spec: Any, state: rt.RetrainingState, namespace: str, now: datetime, events: list[EventRecord]
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
                    "RetrainingSucceeded",
                    f"{active.job_name} trained draft {outcome.draft_version}",
                )
            )
        else:
            events.append(
                EventRecord("Warning", "RetrainingFailed", f"{active.job_name}: {outcome.message}"[:1000])
            )
        return state

    async def _create_once(self, manifest: dict[str, Any]) -> bool:
        """Create the training object; one that already exists (created before a restart) is kept."""
        try:
            await self.kube.create(manifest)
        except KubeApiError as error:
            if error.conflict:
                return False
            raise
        return True

    async def after_canary(
        self,
        resource: SpeculativeDeployment,
        body: dict[str, Any],
        result: str,
        source: str | None,
        evidence: str,
        now: datetime,
    ) -> None:
        """A canary ended: a promoted draft is current for this target; a rejected trained draft is a failed round."""
        spec = resource.spec
        status = body.get("status") or {}
        before = rt.RetrainingState.from_status(
            status.get("retraining"), default_target_version=spec.target.version
        )
        if result == "Promoted":
            state = rt.accept_trained_draft(before, spec.target.version)
        elif source == "Retraining":
            state = rt.reject_trained_draft(spec, before, evidence, now)
        else:
            return
        await self._write(
            body, state, before, list(rt.retraining_conditions(spec, state, now)), now, RetrainingTick()
        )

    async def _write(
        self,
        body: dict[str, Any],
        state: rt.RetrainingState,
        before: rt.RetrainingState,
        updates: list[ConditionUpdate],
        now: datetime,
        result: RetrainingTick,
    ) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        generation = int(body["metadata"].get("generation") or 1)
        wanted = state.to_status()

        def mutate(live: dict[str, Any]) -> dict[str, Any] | None:
            status = live.get("status") or {}
            out: dict[str, Any] = {}
            current = status.get("retraining") or {}
            if {k: v for k, v in wanted.items() if v is not None} != {
                k: v for k, v in current.items() if v is not None
            }:
                out["retraining"] = wanted
            conditions = list(status.get("conditions") or [])
            new_conditions = cond.set_conditions(conditions, updates, now, generation)
            if new_conditions != conditions:
                out["conditions"] = new_conditions
                for condition in new_conditions:
                    old = cond.find_condition(conditions, condition["type"])
                    if (
                        condition["type"] == rt.DRAFT_STALE
                        and condition["status"] == "True"
                        and (old is None or old["status"] != "True")
                    ):
                        result.events.append(
                            EventRecord("Warning", condition["reason"], condition["message"])
                        )
            return out or None

        await self.kube.update_status(API_VERSION, KIND, namespace, name, mutate)
