"""Plays the cluster's Job controller (and JobSet's and Kubeflow Trainer's) for specops training rounds.

The emulated API server runs no controllers, so a training object specops creates would wait
forever. `TrainingController` finds every unfinished training object (a batch/v1 Job, and a
JobSet or TrainJob where the cluster serves those kinds) carrying specops' retraining label,
lets it "train" for ``train_s``, then finishes it the way a trainer that implements the specops
contract does (docs/retraining.md): the result ``{"draftVersion", "checkpointUri"}`` in the
``specops.dev/result`` annotation, and the kind's success condition in its status. The trained
draft's behaviour is registered for the simulated engines (a little better than the draft it
was trained from), so the canary that follows serves it.

`publish_result` is that last step alone, for callers that play the trainer themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import Any

from specops.domain.names import LABEL_COMPONENT
from specops.domain.retraining.jobs import SUPPORTED_KINDS, job_kind
from specops.domain.retraining.naming import (
    ANNOTATION_OUTPUT_VERSION,
    ANNOTATION_RESULT,
    COMPONENT_RETRAINING,
)
from specops_local.cluster import EmulatedCluster
from specops_local.serving import DraftBehaviour

log = logging.getLogger(__name__)

Body = dict[str, Any]
TRAIN_S = 5.0
"""How long a simulated training run takes (a real one takes hours)."""
GAIN = 0.04
"""How much more often the simulated engines accept a trained draft's tokens than its predecessor's."""
DEFAULT_ALPHA = 0.8
MAX_ALPHA = 0.95


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def finished(job: Mapping[str, Any]) -> bool:
    """Whether the training object carries a terminal condition (its kind's success, or Failed)."""
    kind = job_kind(job.get("apiVersion"), job.get("kind"))
    terminal = {"Failed", kind.success if kind else "Complete"}
    return any(
        c.get("type") in terminal and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def publish_result(cluster: EmulatedCluster, job: Mapping[str, Any], result: Mapping[str, Any]) -> None:
    """Finish a training object as its trainer and controller would: the trainer's result in the
    ``specops.dev/result`` annotation, then the kind's success condition (and, for a batch/v1 Job,
    ``succeeded: 1`` and the start and completion times)."""
    kind = job_kind(job.get("apiVersion"), job.get("kind"))
    if kind is None:
        raise ValueError(f"{job.get('apiVersion')} {job.get('kind')} is not a training kind specops creates")
    meta = job["metadata"]
    resource = cluster.resource(kind.kind)
    patch = {"metadata": {"annotations": {ANNOTATION_RESULT: json.dumps(dict(result))}}}
    cluster.emulator.patch_object(resource, meta["namespace"], meta["name"], patch)
    now = _now()
    condition = {
        "type": kind.success,
        "status": "True",
        "reason": "TrainingComplete",
        "message": f"trained draft {result.get('draftVersion')}",
        "lastTransitionTime": now,
    }
    status: Body = {"conditions": [condition]}
    if kind.kind == "Job":
        started = (job.get("status") or {}).get("startTime") or meta.get("creationTimestamp") or now
        status.update(succeeded=1, active=0, startTime=started, completionTime=now)
    cluster.emulator.patch_object(resource, meta["namespace"], meta["name"], {"status": status}, status=True)


class TrainingController:
    """Runs specops' training objects to completion (a poll loop; see the module docstring).

    ``drafts``: the serving controller's draft behaviours; a trained draft not in it yet is added
    with its predecessor's acceptance plus GAIN.
    """

    def __init__(
        self,
        cluster: EmulatedCluster,
        drafts: MutableMapping[str, DraftBehaviour],
        *,
        train_s: float = TRAIN_S,
        poll_s: float = 0.5,
    ) -> None:
        self.cluster = cluster
        self.drafts = drafts
        self.train_s = train_s
        self.poll_s = poll_s
        self.completed: list[str] = []
        """Names of the training objects finished so far, in order."""
        self._seen: dict[tuple[str, str, str], float] = {}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> TrainingController:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="training controller")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                self.sync()
            except Exception:  # keep playing the controller; what it missed shows as a stuck round
                log.exception("training controller sync failed")
            await asyncio.sleep(self.poll_s)

    def training_objects(self) -> list[Body]:
        """Every specops training object of the kinds this cluster serves."""
        found: list[Body] = []
        for kind in SUPPORTED_KINDS:
            try:
                resource = self.cluster.resource(kind.kind)
            except LookupError:
                continue
            if f"{resource.group}/{resource.version}".lstrip("/") != kind.api_version:
                continue
            found += self.cluster.emulator.list_objects(
                resource, None, f"{LABEL_COMPONENT}={COMPONENT_RETRAINING}"
            )
        return found

    def sync(self) -> None:
        now = time.monotonic()
        for job in self.training_objects():
            meta = job["metadata"]
            key = (str(job.get("kind")), meta["namespace"], meta["name"])
            if finished(job) or meta.get("deletionTimestamp"):
                continue
            started = self._seen.setdefault(key, now)
            if now - started >= self.train_s:
                self.complete(job)

    def complete(self, job: Body) -> None:
        """Publish the trained draft of one training object and register how it behaves."""
        meta = job["metadata"]
        version = str((meta.get("annotations") or {}).get(ANNOTATION_OUTPUT_VERSION) or "")
        owner = self._owner(job)
        draft = (owner.get("spec") or {}).get("draft") or {}
        if version not in self.drafts:
            before = self.drafts.get(str(draft.get("version")))
            alpha = before.alpha if before is not None else DEFAULT_ALPHA
            self.drafts[version] = DraftBehaviour(alpha=round(min(MAX_ALPHA, alpha + GAIN), 2))
        model = str(draft.get("model") or "draft")
        publish_result(
            self.cluster, job, {"draftVersion": version, "checkpointUri": f"pvc://models/{model}/{version}"}
        )
        self.completed.append(meta["name"])
        log.info("%s %s/%s trained draft %s", job.get("kind"), meta["namespace"], meta["name"], version)

    def _owner(self, job: Body) -> Body:
        for ref in job["metadata"].get("ownerReferences") or []:
            if ref.get("kind") == "SpeculativeDeployment":
                found = self.cluster.get("speculativedeployments", ref["name"], job["metadata"]["namespace"])
                if found is not None:
                    return found
        return {}
