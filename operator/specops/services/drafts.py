"""The draft's life after the control loop's tick: retraining rounds, then the canary.

Retraining may leave a trained draft; the canary service rolls it (or a changed
spec.draft) out; when a canary ends, retraining learns whether its draft was kept.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import ValidationError

from specops.adapters.ports import KubePort
from specops.api.models import API_VERSION, KIND, SpeculativeDeployment
from specops.domain.lifecycle import EventRecord
from specops.services.canary import CanaryService
from specops.services.control import ACTIVE_PHASES
from specops.services.retraining import RetrainingService


class DraftLifecycle:
    def __init__(self, kube: KubePort, retraining: RetrainingService, canary: CanaryService) -> None:
        self.kube = kube
        self.retraining = retraining
        self.canary = canary

    async def tick(self, namespace: str, name: str, now: datetime) -> tuple[dict | None, list[EventRecord]]:
        body = await self.kube.get(API_VERSION, KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None, []
        if (body.get("status") or {}).get("phase") not in ACTIVE_PHASES:
            return body, []
        try:
            resource = SpeculativeDeployment.model_validate(body)
        except ValidationError:
            return body, []
        alpha = ((body.get("status") or {}).get("observed") or {}).get("alpha")
        retraining = await self.retraining.tick(resource, body, alpha, now)
        canary = await self.canary.tick(namespace, name, now, candidate=retraining.candidate)
        events = [*retraining.events, *canary.events]
        if canary.finished and canary.body is not None:
            await self.retraining.after_canary(
                resource, canary.body, canary.finished, canary.source, canary.evidence, now
            )
        return canary.body or body, events
