"""One resource's periodic tick: one read, the control loop, retraining and the canary, one write.

gather: the resource (as the watch last saw it, else one GET) and its serving pods (as the
operator's pod index last saw them, else one LIST); each
part takes the typed status and returns its own blocks of it plus condition updates and
Events; the phase is derived
from the parts (domain.phases); one optimistic status patch writes what changed. A 409
re-reads the resource and lays the tick's blocks and condition updates onto the fresh
status, so another writer's changes (the reconciler's conditions) are never lost. Nothing
is written when nothing changed, and a change of measurements only is written at most
once per refresh period.

A part whose API calls fail keeps its blocks as they were; the others still land.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from specops.api import conditions as cond
from specops.api.base import SharedModels
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import API_VERSION, KIND, SpeculativeDeployment
from specops.api.status import SpeculativeDeploymentStatus
from specops.api.units import parse_duration
from specops.domain import drafts, lifecycle, phases
from specops.domain.discovery import PodEndpoint, ready_endpoints, sorted_endpoints
from specops.domain.lifecycle import EventRecord
from specops.domain.names import shared_selector_labels
from specops.domain.status_patch import merge_patch, only_volatile
from specops.ports import KubeApiError, KubePort
from specops.services.canary import CanaryResult, CanaryService
from specops.services.control import ControlLoop
from specops.services.reconciler import describe_exception
from specops.services.retraining import RetrainingService, after_canary

log = logging.getLogger(__name__)

MIN_STATUS_REFRESH_S = 10.0
STATUS_REFRESH_INTERVALS = 4.0
REFRESH_WRITES_PER_S = 5.0
"""Measurements alone are written at most every max(MIN_STATUS_REFRESH_S, STATUS_REFRESH_INTERVALS x
interval, active resources / REFRESH_WRITES_PER_S): one refresh a minute per resource at the default
15 s interval, and never more than 5 refresh writes a second for the whole operator. At 2,000
resources a refresh is 400 s apart: the API server is not asked for 33 writes a second (each of
which comes back to every watcher as an event) to show numbers the operator's own metrics carry
fresh every tick. Decisions and conditions are written at once whatever the fleet size."""
WRITE_ATTEMPTS = 5

# Status blocks each part owns: the tick writes these and only these (plus conditions and phase).
CONTROL_BLOCKS = ("speculation", "baseline", "observed")
CANARY_BLOCKS = (
    "canary",
    "draft",
    "previous_draft",
    "spec_draft",
    "rejected_draft",
    "observed_spec_draft",
    "last_canary",
)
RETRAINING_BLOCKS = ("retraining",)


SUPERSEDED_KEPT = 8
"""How many versions behind its own writes a lagging watch may be and still hand the tick what it
wrote (the tick writes at most once an interval: eight intervals of lag)."""


_NO_STATUS = SpeculativeDeploymentStatus()


@dataclass
class _Validated:
    """One resource as the tick validated it, for one resourceVersion.

    The spec is kept typed (it moves only with a generation), its parts equal to another
    resource's held once (``SharedModels``); the status only in its wire form,
    loaded again at each tick (about 25 us). Typed, a status is about 22 KiB of model objects
    against under 7 KiB of plain values: at 2,000 resources 44 MiB, and some 100,000 objects more
    for every full pass of the garbage collector to scan."""

    version: Any
    resource: SpeculativeDeployment  # its status left at the default: see status_wire
    status_wire: dict[str, Any]
    superseded: tuple[Any, ...] = ()
    """The resourceVersions this tick's own write replaced: the one it was computed from, and the
    one a conflict's fresh read found (empty: validated, not written). A watched body still at
    one of them has not caught up with the write yet."""


@dataclass
class TickOutcome:
    """What one resource's periodic tick produced, for the daemon: when to come back, what to post."""

    interval_s: float
    gone: bool = False
    body: dict[str, Any] | None = None
    events: list[EventRecord] = field(default_factory=list)
    # The status as this tick computed it (wire form), written or not: a change of measurements
    # only is written once per refresh period, but the operator's metrics show it every tick.
    status: dict[str, Any] | None = None
    status_stored: bool = False
    """What the tick computed is in the resource's status (written, or nothing to write but
    measurements not yet due)."""
    unchanged: bool = False
    """The control loop found its inputs as they were: nothing was decided (control_step's fast path)."""


MIN_INTERVAL_S = 1.0
MAX_INTERVAL_S = 3600.0
"""spec.metrics.interval's bounds (the CRD refuses others); a body that got past an older CRD is
clamped, so it neither hot-loops nor sleeps forever."""


def interval_of(body: dict[str, Any], default: float) -> float:
    text = ((body.get("spec") or {}).get("metrics") or {}).get("interval")
    try:
        seconds = parse_duration(str(text)) if text else default
    except ValueError:
        seconds = default
    if not math.isfinite(seconds):
        return MAX_INTERVAL_S if seconds > 0 else MIN_INTERVAL_S
    return min(max(seconds, MIN_INTERVAL_S), MAX_INTERVAL_S)


MAX_TICK_BACKOFF_S = 600.0
"""A failing tick comes back after interval x 2^failures, at most this (or the interval if longer)."""


def _condition_change(
    update: ConditionUpdate, now: datetime, body: dict[str, Any] | None
) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    generation = int(((body or {}).get("metadata") or {}).get("generation") or 1)

    def mutate(live: dict[str, Any]) -> dict[str, Any] | None:
        try:
            current = SpeculativeDeploymentStatus.from_wire(live.get("status"))
        except ValidationError:
            current = SpeculativeDeploymentStatus()
        wanted = current.model_copy(
            update={"conditions": cond.set_condition(current.conditions, update, now, generation)}
        )
        return merge_patch(current.to_wire(), wanted.to_wire()) or None

    return mutate


def _shows(body: dict[str, Any] | None, update: ConditionUpdate) -> bool:
    conditions = ((body or {}).get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == update.type
        and c.get("reason") == update.reason
        and c.get("message") == update.message
        for c in conditions
        if isinstance(c, dict)
    )


class ResourceTick:
    def __init__(
        self,
        kube: KubePort,
        control: ControlLoop,
        retraining: RetrainingService,
        canary: CanaryService,
        *,
        default_interval_s: float,
    ) -> None:
        self.kube = kube
        self.control = control
        self.retraining = retraining
        self.canary = canary
        self.default_interval_s = default_interval_s
        self._failures: dict[tuple[str, str], tuple[int, str]] = {}
        """(namespace, name) -> (consecutive failed ticks, last message): log and announce once."""
        # The typed resource per resource, validated once per resourceVersion, and the wire form
        # of its status (what a status patch is computed against), dumped once for that version.
        self._resources: dict[tuple[str, str], _Validated] = {}
        self._specs = SharedModels()  # the kept specs' equal parts, held once across resources
        self._roll_pending: set[tuple[str, str]] = set()
        """Resources whose stable Deployment could not be rendered from a new revision yet."""

    async def run(
        self,
        namespace: str,
        name: str,
        now: datetime,
        watched: Mapping[str, Any] | None = None,
        serving: Sequence[PodEndpoint] | None = None,
    ) -> TickOutcome:
        """One tick; an unexpected exception parks the resource (Degraded=True/TickFailed, one Warning
        Event, logged once) and comes back after a growing delay instead of crashing the daemon.

        ``watched`` is the resource as the operator's watch last saw it (Kopf's live body): the tick
        starts from it instead of reading the resource again. A stale copy costs nothing: the status
        patch carries its resourceVersion, and a conflict re-reads and recomputes. ``serving`` is
        likewise the resource's ready serving pods as the operator's pod watch last saw them; without
        it, the tick LISTs them."""
        outcome = TickOutcome(interval_s=self.default_interval_s)
        try:
            await self._run(outcome, namespace, name, now, watched, serving)
        except KubeApiError as error:  # the API is down or refused a write: the next interval retries
            log.warning("tick of %s/%s: Kubernetes API: %s", namespace, name, error)
            return outcome
        except Exception as error:  # any failure becomes a condition, never a crash loop
            return await self._park(outcome, namespace, name, now, error)
        if (namespace, name) in self._failures:
            del self._failures[(namespace, name)]
            await self._recovered(namespace, name, now)
        return outcome

    async def _park(
        self, outcome: TickOutcome, namespace: str, name: str, now: datetime, error: Exception
    ) -> TickOutcome:
        key = (namespace, name)
        failures, last = self._failures.get(key, (0, ""))
        message = f"tick failed: {describe_exception(error)}"
        failures += 1
        self._failures[key] = (failures, message)
        outcome.interval_s = min(
            outcome.interval_s * 2.0 ** min(failures, 16), max(MAX_TICK_BACKOFF_S, outcome.interval_s)
        )
        outcome.gone = False
        update = ConditionUpdate(cond.DEGRADED, "True", Reason.TICK_FAILED, message)
        if message == last:
            log.debug("tick of %s/%s failed again (%d): %s", namespace, name, failures, message)
            outcome.events = []
            if _shows(outcome.body, update):
                return outcome  # already said; rewritten only if another writer replaced it
        else:
            log.error("tick of %s/%s failed: %s", namespace, name, message, exc_info=error)
            outcome.events = [EventRecord("Warning", Reason.TICK_FAILED, message)]
        try:
            await self.kube.update_status(
                API_VERSION, KIND, namespace, name, _condition_change(update, now, outcome.body)
            )
        except Exception as write_error:  # the Event and the log still tell
            log.warning("tick of %s/%s: writing the failure failed: %s", namespace, name, write_error)
        return outcome

    def forget(self, namespace: str, name: str) -> None:
        """The resource's daemon stopped: drop its failure count and its validated copy."""
        self._failures.pop((namespace, name), None)
        self._resources.pop((namespace, name), None)
        self._roll_pending.discard((namespace, name))

    def _validated(
        self, namespace: str, name: str, body: dict[str, Any]
    ) -> tuple[SpeculativeDeployment, dict[str, Any]]:
        """The typed resource and the wire form of its status; the spec is validated again only
        when the resourceVersion moved (most ticks it has not)."""
        version = (body.get("metadata") or {}).get("resourceVersion")
        cached = self._resources.get((namespace, name))
        if cached is not None and version is not None and cached.version == version:
            status = SpeculativeDeploymentStatus.from_wire(cached.status_wire)
            return cached.resource.model_copy(update={"status": status}), cached.status_wire
        resource = SpeculativeDeployment.model_validate(body)
        wire = resource.status.to_wire()
        resource = resource.model_copy(update={"spec": self._specs.share(resource.spec)})
        kept = resource.model_copy(update={"status": _NO_STATUS})
        self._resources[(namespace, name)] = _Validated(version, kept, wire)
        return resource, wire

    def _remember_written(
        self,
        namespace: str,
        name: str,
        resource: SpeculativeDeployment,
        status_wire: dict[str, Any],
        written: Mapping[str, Any],
        replaced: tuple[Any, ...] = (),
    ) -> None:
        """Keep what this tick wrote (the typed spec, the status in the wire form written), for the
        resourceVersion the write made; ``replaced``: a conflict's fresh read, whose version the
        write replaced too.

        The next tick's watched body is usually that version: it is not validated again (a
        resource whose only writer is its tick is validated once, not after every write). The
        stored status is the one computed: the patch carried the resourceVersion of the status it
        was computed from, so the server applied it to exactly that status (a status write cannot
        move the spec). What the server stores may leave out fields at their defaults, which
        validation fills in again."""
        version = (written.get("metadata") or {}).get("resourceVersion")
        if version is None:
            return
        typed = resource.model_copy(update={"status": _NO_STATUS, "metadata": dict(written["metadata"])})
        computed_from = (resource.metadata or {}).get("resourceVersion")
        superseded: tuple[Any, ...] = (computed_from, *replaced)
        previous = self._resources.get((namespace, name))
        if previous is not None and previous.version == computed_from:
            # written on top of an earlier write of the tick's own: a watch still lagging behind
            # that one is behind this one too
            superseded = (*superseded, *previous.superseded)[:SUPERSEDED_KEPT]
        self._resources[(namespace, name)] = _Validated(version, typed, status_wire, superseded=superseded)

    def _caught_up(self, namespace: str, name: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """``body``, or what the last tick wrote when the watch has not delivered that write yet.

        Under load the watch can lag a whole interval behind the API server: a tick starting from
        the version its own last write replaced would decide again on the status before it (a
        first draft's check run twice, its Event posted twice) and lose a conflict on writing."""
        cached = self._resources.get((namespace, name))
        version = (body.get("metadata") or {}).get("resourceVersion")
        if cached is None or version is None or version not in cached.superseded:
            return body
        metadata = cached.resource.metadata
        return {**body, "metadata": dict(metadata), "status": cached.status_wire}

    async def _recovered(self, namespace: str, name: str, now: datetime) -> None:
        update = ConditionUpdate(cond.DEGRADED, "False", Reason.AS_EXPECTED, "")

        def clear(live: dict[str, Any]) -> dict[str, Any] | None:
            current = SpeculativeDeploymentStatus.from_wire(live.get("status"))
            degraded = next((c for c in current.conditions if c.type == cond.DEGRADED), None)
            if degraded is None or degraded.reason != Reason.TICK_FAILED:
                return None
            return _condition_change(update, now, live)(live)

        try:
            await self.kube.update_status(API_VERSION, KIND, namespace, name, clear)
        except Exception as error:
            log.warning("tick of %s/%s: clearing TickFailed failed: %s", namespace, name, error)

    async def _run(
        self,
        outcome: TickOutcome,
        namespace: str,
        name: str,
        now: datetime,
        watched: Mapping[str, Any] | None = None,
        serving: Sequence[PodEndpoint] | None = None,
    ) -> TickOutcome:
        body: dict[str, Any] | None = dict(watched) if watched is not None else None
        if not (body and (body.get("metadata") or {}).get("resourceVersion")):
            try:
                body = await self.kube.get(API_VERSION, KIND, namespace, name)
            except KubeApiError as error:
                log.warning("tick of %s/%s: reading the resource failed: %s", namespace, name, error)
                return outcome
        if body is None or body["metadata"].get("deletionTimestamp"):
            outcome.gone = True
            return outcome
        caught_up = self._caught_up(namespace, name, body)
        body = caught_up if isinstance(caught_up, dict) else dict(caught_up)
        outcome.interval_s = interval_of(body, self.default_interval_s)
        outcome.body = body
        try:
            resource, status_wire = self._validated(namespace, name, body)
        except ValidationError:
            return outcome  # the reconciler reports InvalidSpec
        status = resource.status
        if not phases.is_active(status):
            return outcome  # not serving yet
        self.control.subscribe(resource, outcome.interval_s)

        parts: dict[str, Any] = {}
        updates: list[ConditionUpdate] = []
        events: list[EventRecord] = []
        if serving is not None:
            endpoints = sorted_endpoints(serving)
        else:
            try:
                pods = await self.kube.list("v1", "Pod", namespace, shared_selector_labels(name))
            except KubeApiError as error:
                log.warning("tick of %s/%s: listing pods failed: %s", namespace, name, error)
                return outcome
            endpoints = ready_endpoints(pods)

        candidate = None
        draft_stale = False
        try:
            retraining = await self.retraining.tick(resource, status, now)
        except KubeApiError as error:
            log.warning("retraining tick of %s/%s failed: %s", namespace, name, error)
            draft_stale = cond.is_true(status.conditions, cond.DRAFT_STALE)
        else:
            parts["retraining"] = retraining.retraining
            updates += retraining.updates
            events += retraining.events
            candidate, draft_stale = retraining.candidate, retraining.draft_stale

        control = await self.control.tick(
            resource,
            status,
            endpoints,
            now,
            draft_stale=draft_stale,
            draft_unchecked=not drafts.speculation_allowed(status),
            canary_running=status.canary is not None,
        )
        parts.update({block: getattr(control.status, block) for block in CONTROL_BLOCKS})
        updates += control.updates
        events += control.events

        canary: CanaryResult | None = None
        try:
            canary = await self.canary.tick(resource, status, endpoints, now, candidate)
        except KubeApiError as error:
            log.warning("canary tick of %s/%s failed: %s", namespace, name, error)
        if canary is not None:
            parts.update({block: getattr(canary.status, block) for block in CANARY_BLOCKS})
            updates += canary.updates
            events += canary.events
            if canary.finished and "retraining" in parts:
                retraining_status, retraining_updates = after_canary(
                    resource.spec, parts["retraining"], canary.finished, canary.source, canary.evidence, now
                )
                parts["retraining"] = retraining_status
                updates += retraining_updates

        written = await self._write(
            body, parts, updates, now, outcome.interval_s, events, (resource, status_wire), outcome
        )
        if written is not None:
            outcome.body = written
        rolled = written if written is not None else outcome.body
        pending = (namespace, name) in self._roll_pending
        # the revision in status is what the stable pods must run: render it once status names it
        # (a failed render is tried again at every tick until it lands; a reconcile renders it too)
        if rolled is not None and (
            (control.roll_to is not None and written is not None) or (pending and control.roll_to is None)
        ):
            try:
                await self.canary.reconciler.roll_stable(self._validated(namespace, name, rolled)[0])
            except KubeApiError as error:
                self._roll_pending.add((namespace, name))
                log.warning(
                    "rolling out a revision of %s/%s failed (tried again next tick): %s",
                    namespace,
                    name,
                    error,
                )
            else:
                self._roll_pending.discard((namespace, name))
        if written is not None and canary is not None and canary.after_write:
            try:
                await self.canary.after_write(
                    self._validated(namespace, name, written)[0], canary.after_write
                )
            except KubeApiError as error:
                log.warning("canary of %s/%s: acting on the new status failed: %s", namespace, name, error)
        outcome.events = events
        outcome.unchanged = control.unchanged
        return outcome

    async def _write(
        self,
        body: dict[str, Any],
        parts: dict[str, Any],
        updates: list[ConditionUpdate],
        now: datetime,
        interval_s: float,
        events: list[EventRecord],
        validated: tuple[SpeculativeDeployment, dict[str, Any]] | None = None,
        outcome: TickOutcome | None = None,
    ) -> dict[str, Any] | None:
        """One optimistic status patch of the tick's blocks; on 409 re-read, lay them onto the fresh status.

        ``validated`` is ``body`` validated (the tick's typed copy) and the wire form of its status:
        the first attempt starts from them instead of loading and dumping the status again."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        generation = int(meta.get("generation") or 1)
        refresh_s = max(
            MIN_STATUS_REFRESH_S,
            STATUS_REFRESH_INTERVALS * interval_s,
            len(self._resources) / REFRESH_WRITES_PER_S,
        )
        live = body
        for _ in range(WRITE_ATTEMPTS):
            if live is body and validated is not None:
                current, before = validated[0].status, validated[1]
            else:
                try:
                    current = SpeculativeDeploymentStatus.from_wire(live.get("status"))
                except ValidationError as error:
                    log.warning(
                        "status of %s/%s does not load (%s); rewriting the tick's blocks",
                        namespace,
                        name,
                        error,
                    )
                    current = SpeculativeDeploymentStatus()
                before = current.to_wire()
            if not phases.is_active(current):
                return None  # no longer serving (deleted, invalid) meanwhile
            wanted = current.model_copy(update=parts)
            conditions = cond.set_conditions(current.conditions, updates, now, generation)
            wanted = wanted.model_copy(
                update={"conditions": conditions, "phase": phases.derive_phase("Serving", wanted)}
            )
            wanted_wire = wanted.to_wire()
            if outcome is not None:
                outcome.status = wanted_wire
            patch = merge_patch(before, wanted_wire)
            if not patch:
                if outcome is not None:
                    outcome.status_stored = True
                return None
            if only_volatile(patch, before):
                observed_at = current.observed.at
                if observed_at is not None and (now - observed_at).total_seconds() < refresh_s:
                    if outcome is not None:
                        outcome.status_stored = True
                    return None  # only measurements moved: refreshed every refresh period
            request = {"metadata": {"resourceVersion": live["metadata"]["resourceVersion"]}, "status": patch}
            try:
                written = await self.kube.patch(
                    API_VERSION, KIND, namespace, name, request, subresource="status"
                )
            except KubeApiError as error:
                if not (error.conflict or error.status >= 500 or error.status == 0):
                    log.warning("status write of %s/%s failed: %s", namespace, name, error)
                    return None
                # A conflict, or an answer that may or may not have landed: read again and recompute.
                try:
                    fresh = await self.kube.get(API_VERSION, KIND, namespace, name)
                except KubeApiError as read_error:
                    log.warning("status of %s/%s: re-read failed: %s", namespace, name, read_error)
                    continue
                if fresh is None:
                    return None
                live = fresh
                continue
            events.extend(lifecycle.condition_events(current.conditions, conditions))
            if outcome is not None:
                outcome.status_stored = True
            if validated is not None and (live is body or _same_spec(live, body)):
                # after a conflict (Kopf's annotations, another status writer) the write replaced
                # the fresh read too; with the typed copy's spec, the copy still holds. Without it,
                # a watch lagging behind the write restarts the next tick from the status before
                # it: a first draft's check run twice, its Event posted twice
                replaced = () if live is body else ((live.get("metadata") or {}).get("resourceVersion"),)
                self._remember_written(namespace, name, validated[0], wanted_wire, written, replaced)
            return written
        log.warning(
            "status of %s/%s kept changing; gave up after %d attempts", namespace, name, WRITE_ATTEMPTS
        )
        return None


def _same_spec(fresh: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    """Whether a fresh read carries the spec (and generation) of the body the tick validated."""

    def generation(resource: Mapping[str, Any]) -> Any:
        return (resource.get("metadata") or {}).get("generation")

    return generation(fresh) == generation(body) and fresh.get("spec") == body.get("spec")
