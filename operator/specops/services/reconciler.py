"""Reconcile a SpeculativeDeployment's serving objects and its lifecycle status.

gather (live children) -> decide (pure render + drift + readiness in domain/) ->
act (create or patch only what differs, then one optimistic status write).
A second reconcile with nothing changed writes nothing at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import API_VERSION, KIND, SpeculativeDeployment
from specops.api.status import SpeculativeDeploymentStatus
from specops.domain import drafts, lifecycle, phases, profile_prior
from specops.domain.calibration import CalibrationConfig
from specops.domain.control_status import for_draft, revision_from_status
from specops.domain.engines.schedule import PLAIN, Revision
from specops.domain.lifecycle import EventRecord
from specops.domain.names import (
    HOLDBACK,
    LABEL_DEPLOYMENT,
    STABLE,
    label_value,
    selector_labels,
    service_name,
    variant_service_name,
)
from specops.domain.render import (
    RenderError,
    RenderOptions,
    check_renderable,
    render_children,
    serving_deployment_name,
)
from specops.domain.revision_step import config_from_spec, holds_back, initial_state
from specops.domain.status_patch import merge_patch
from specops.ports import KubeApiError, KubePort, RouteResult, RouteWeights

log = logging.getLogger(__name__)

# Kinds the reconciler renders; anything of these kinds labelled with the resource and variant
# that is no longer rendered is pruned.
MANAGED_KINDS: tuple[tuple[str, str], ...] = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
)

REFUSED_STATUSES = frozenset({400, 422})
"""Answers to a child write that say the object itself is wrong (BadRequest, Invalid)."""


@dataclass
class ApplyReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    live: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    """Objects as the API server just returned them (created, patched, read), by ``Kind/name``:
    what readiness reads without a GET of its own."""

    @property
    def wrote(self) -> bool:
        return bool(self.created or self.updated or self.pruned)


def status_change(
    change: Callable[[SpeculativeDeploymentStatus], SpeculativeDeploymentStatus],
) -> Callable[[dict[str, Any]], dict[str, Any] | None]:
    """A status mutation on the typed document, as the merge patch `update_status` sends."""

    def mutate(live: dict[str, Any]) -> dict[str, Any] | None:
        current = SpeculativeDeploymentStatus.from_wire(live.get("status"))
        return merge_patch(current.to_wire(), change(current).to_wire()) or None

    return mutate


MAX_EXCEPTION_MESSAGE = 500


def describe_exception(error: BaseException) -> str:
    """``ZeroDivisionError: float division by zero``, cut to a length a condition can carry."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_EXCEPTION_MESSAGE else text[: MAX_EXCEPTION_MESSAGE - 3] + "..."


class ReconcileParked(Exception):
    """Reconcile failed in pure code; status says InvalidSpec. The handler posts ``events`` and retries later."""

    def __init__(self, message: str, events: list[EventRecord]) -> None:
        super().__init__(message)
        self.events = events


def _key(obj: Mapping[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def endpoint_url(resource: SpeculativeDeployment, options: RenderOptions) -> str:
    """The in-cluster URL clients call: the shared Service on the engine's API port."""
    engine = options.engine(resource.spec.serving.backend)
    port = next(p.number for p in engine.ports if p.name == engine.http_port)
    meta = resource.metadata
    return f"http://{service_name(str(meta['name']))}.{meta['namespace']}.svc:{port}"


def stable_revision(resource: SpeculativeDeployment) -> Revision:
    """The revision recorded in status, else the one a new resource starts with (plain through its
    baseline, or the roofline prior's first schedule)."""
    return stable_plan(resource)[0]


def stable_plan(resource: SpeculativeDeployment) -> tuple[Revision, bool]:
    """The stable pods' revision and whether one pod is held back plain beside them (as status
    records them, else as a new resource starts)."""
    recorded = revision_from_status(resource.status.speculation.revision)
    draft = drafts.stable_draft(resource.spec.draft, resource.status)
    if recorded is not None:
        holdback = resource.status.speculation.holdback is not None and holds_back(resource.spec)
        return for_draft(recorded, drafts.draft_identity(draft) if draft.uri else None), holdback
    config = config_from_spec(
        resource.spec,
        draft,
        # a new resource's first draft is checked before speculation goes on (Reconciler.write_status)
        off_reason=None
        if resource.status.draft.version and drafts.speculation_allowed(resource.status)
        else "unchecked",
    )
    prior = profile_prior.prior_model(config.setup, CalibrationConfig(), None)
    state = initial_state(config, prior, datetime.now(UTC))
    return state.revision, state.holdback


def _route(resource: SpeculativeDeployment) -> str | None:
    """The user's HTTPRoute naming the stable Service, if the spec gives one."""
    gateway_api = resource.spec.canary.traffic_routing.gateway_api
    return None if gateway_api is None else gateway_api.http_route


class Reconciler:
    """Owns the stable variant's serving objects and the lifecycle part of status."""

    def __init__(
        self, kube: KubePort, render_options: RenderOptions, *, routes: RouteWeights | None = None
    ) -> None:
        self.kube = kube
        self.render_options = render_options
        self.routes = routes  # takes an ended holdback out of the user's HTTPRoute before its Service goes

    async def reconcile(self, body: Mapping[str, Any], now: datetime) -> list[EventRecord]:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        generation = int(meta.get("generation") or 1)
        try:
            resource = SpeculativeDeployment.model_validate(dict(body))
        except ValidationError as error:
            return await self._invalid(
                namespace, name, generation, lifecycle.describe_validation_error(error), now
            )
        try:
            return await self._reconcile_valid(resource, body, now)
        except KubeApiError as error:
            if error.status not in REFUSED_STATUSES:
                raise  # unavailable, conflict, throttled, forbidden: retried as it is
            # The API server refused a rendered object as invalid: retrying as is cannot help.
            message = f"the API server refused a serving object: {error}"
            events = await self._invalid(namespace, name, generation, message, now, Reason.APPLY_FAILED)
            if events:
                log.error("reconcile of %s/%s: %s", namespace, name, message)
            raise ReconcileParked(message, events) from error
        except Exception as error:  # pure code failing on a spec that admission let through
            message = f"could not process the spec: {describe_exception(error)}"
            events = await self._invalid(namespace, name, generation, message, now)
            if events:  # logged once: when the condition first says so
                log.error("reconcile of %s/%s failed: %s", namespace, name, message, exc_info=error)
            raise ReconcileParked(message, events) from error

    async def _reconcile_valid(
        self, resource: SpeculativeDeployment, body: Mapping[str, Any], now: datetime
    ) -> list[EventRecord]:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        generation = int(meta.get("generation") or 1)
        try:
            children = self.render_stable(resource, body)
        except RenderError as error:
            return await self._invalid(namespace, name, generation, f"{error.field}: {error}", now)

        never_reconciled = resource.status.observed_generation is None
        report = await self.apply(children, owner_uid=meta.get("uid", ""), fresh=never_reconciled)
        # One Event per kind of change, naming every object: a new resource's four children are
        # one Event, not four API writes (thousands of resources come up at once)
        events = [
            EventRecord("Normal", reason, f"{verb} {', '.join(keys)}")
            for reason, verb, keys in (
                ("ChildCreated", "created", report.created),
                ("ChildUpdated", "updated", report.updated),
                ("ChildPruned", "deleted", report.pruned),
            )
            if keys
        ]
        events += [
            EventRecord("Warning", "ChildConflict", f"{key} exists and is not managed by this resource")
            for key in report.conflicts
        ]
        if not (never_reconciled and len(report.created) == len(children)):
            # (a resource never reconciled whose children were all created just now has nothing
            # of its own to prune: what another incarnation left is garbage-collected by owner)
            for variant in (STABLE, HOLDBACK):
                await self.prune(
                    namespace, name, {_key(c) for c in children}, report, variant, route=_route(resource)
                )
        events += await self.write_status(resource, children, report, now, base=body)
        return events

    def render_stable(
        self, resource: SpeculativeDeployment, body: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        """The stable variant serves the draft and the revision recorded in status (spec.draft only
        reaches it through a canary; a revision only through the control loop)."""
        revision, holdback = stable_plan(resource)
        draft = drafts.stable_draft(resource.spec.draft, resource.status)
        replicas = resource.spec.serving.replicas
        children = render_children(
            resource, self.render_options, revision, draft=draft, replicas=replicas - 1 if holdback else None
        )
        if holdback:  # one plain pod beside the others, in the shared Service: an even share of traffic
            children += render_children(
                resource, self.render_options, PLAIN, variant=HOLDBACK, draft=draft, replicas=1
            )
        return children

    async def roll_stable(self, resource: SpeculativeDeployment) -> ApplyReport:
        """Render the stable variant from status again: a new revision rolls out pod by pod, and a
        holdback that ended is removed."""
        children = self.render_stable(resource)
        report = await self.apply(children, resource.metadata.get("uid", ""))
        meta = resource.metadata
        await self.prune(
            str(meta["namespace"]),
            str(meta["name"]),
            {_key(c) for c in children},
            report,
            HOLDBACK,
            route=_route(resource),
        )
        return report

    async def refresh(
        self,
        namespace: str,
        name: str,
        now: datetime,
        *,
        owner: Mapping[str, Any] | None = None,
        deployment: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any] | None, list[EventRecord]]:
        """Re-judge readiness after a child changed; returns the owner's body and the Events.

        ``owner`` is the resource as the operator already holds it (its daemon's live body) and
        ``deployment`` the Deployment whose event this is: without them each is read. A stale
        owner costs one conflict on the status write and a fresh read, never a lost write."""
        body = dict(owner) if owner is not None else await self.kube.get(API_VERSION, KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None, []
        try:
            resource = SpeculativeDeployment.model_validate(body)
            # without rendering: readiness needs only the Deployment's name
            check_renderable(resource, self.render_options)
        except (ValidationError, RenderError):
            return body, []  # reconcile() already reported InvalidSpec
        wanted = serving_deployment_name(resource)
        stub = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": wanted}}
        report = ApplyReport()
        if deployment is not None and (deployment.get("metadata") or {}).get("name") == wanted:
            report.live[f"Deployment/{wanted}"] = deployment
        return body, await self.write_status(resource, [stub], report, now, base=body)

    async def apply(
        self, children: list[dict[str, Any]], owner_uid: str, *, fresh: bool = False
    ) -> ApplyReport:
        """Create what is missing, patch what differs, leave what matches (and what another owns).

        ``fresh``: the resource was never reconciled, so its children most likely do not exist
        yet: each is created straight away, and only one that does exist (409 AlreadyExists) is
        read and compared. Thousands of new resources save a GET per child."""
        report = ApplyReport()
        for child in children:
            api_version, kind, meta = child["apiVersion"], child["kind"], child["metadata"]
            key = _key(child)
            if fresh:
                try:
                    report.live[key] = await self.kube.create(child)
                except KubeApiError as error:
                    if not (error.conflict and error.reason == "AlreadyExists"):
                        raise
                else:
                    report.created.append(key)
                    continue
            live = await self.kube.get(api_version, kind, meta["namespace"], meta["name"])
            if live is None:
                report.live[key] = await self.kube.create(child)
                report.created.append(key)
            elif owner_uid and not lifecycle.owned_by(live, owner_uid):
                report.conflicts.append(key)
            elif lifecycle.is_subset(child, live):
                report.live[key] = live
                report.unchanged.append(key)
            else:
                report.live[key] = await self.kube.patch(
                    api_version, kind, meta["namespace"], meta["name"], child
                )
                report.updated.append(key)
        return report

    async def prune(
        self,
        namespace: str,
        name: str,
        keep: set[str],
        report: ApplyReport,
        variant: str = STABLE,
        *,
        route: str | None = None,
    ) -> None:
        """Delete the variant's objects not in ``keep``. A holdback's go only once ``route`` (the
        user's HTTPRoute, if any) no longer names its Service: a route naming a Service that is gone
        fails its share of requests. A release that fails raises, and the prune is tried again."""
        labels = selector_labels(name, variant)
        released = route is None or variant != HOLDBACK
        for api_version, kind in MANAGED_KINDS:
            if kind == "PodMonitor" and not self.render_options.pod_monitor:
                continue
            for live in await self.kube.list(api_version, kind, namespace, labels):
                key = f"{kind}/{live['metadata']['name']}"
                if key in keep:
                    continue
                if not released:
                    await self._release_holdback(namespace, name, str(route))
                    released = True
                await self.kube.delete(api_version, kind, namespace, live["metadata"]["name"])
                report.pruned.append(key)

    async def release_holdback(self, namespace: str, name: str, route: str) -> RouteResult:
        """Take the holdback's Service out of ``route`` (read back); done at once without a router."""
        if self.routes is None:
            return RouteResult(True, 0)
        return await self.routes.set_route_weight(
            namespace, route, variant_service_name(name, STABLE), variant_service_name(name, HOLDBACK), 0
        )

    async def _release_holdback(self, namespace: str, name: str, route: str) -> None:
        result = await self.release_holdback(namespace, name, route)
        if not result.ok:
            raise KubeApiError(
                503,
                "RouteNotReleased",
                f"the holdback of {namespace}/{name} stays until HTTPRoute {route} drops its Service: "
                f"{result.message}",
            )

    async def cleanup(self, body: Mapping[str, Any]) -> list[EventRecord]:
        """On delete: remove every object labelled with this resource, whatever its variant.

        Garbage collection would remove owned children eventually; deleting them here
        also covers objects created without an ownerReference (none by design) and
        clusters whose GC is slow, and makes the deletion visible at once.
        """
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        removed = []
        for api_version, kind in MANAGED_KINDS:
            if kind == "PodMonitor" and not self.render_options.pod_monitor:
                continue
            for live in await self.kube.list(
                api_version, kind, namespace, {LABEL_DEPLOYMENT: label_value(name)}
            ):
                try:
                    if await self.kube.delete(api_version, kind, namespace, live["metadata"]["name"]):
                        removed.append(f"{kind}/{live['metadata']['name']}")
                except KubeApiError as error:
                    log.warning("could not delete %s/%s: %s", kind, live["metadata"]["name"], error)
        return (
            [EventRecord("Normal", "ChildrenDeleted", f"deleted {len(removed)} serving objects")]
            if removed
            else []
        )

    async def write_status(
        self,
        resource: SpeculativeDeployment,
        children: list[dict[str, Any]],
        report: ApplyReport,
        now: datetime,
        base: Mapping[str, Any] | None = None,
    ) -> list[EventRecord]:
        """Readiness from the serving Deployments, written as conditions. ``base`` is the resource as
        just read or handed over (the status write starts from it instead of a GET); a Deployment
        the API server just returned (``report.live``) is not read again."""
        meta = resource.metadata
        namespace, name = meta["namespace"], meta["name"]
        generation = int(meta.get("generation") or 1)
        deployments = [
            report.live.get(_key(c))
            or await self.kube.get(c["apiVersion"], c["kind"], namespace, c["metadata"]["name"])
            for c in children
            if c["kind"] == "Deployment"
        ]
        state = lifecycle.readiness(resource.spec.serving.replicas, deployments)
        updates = list(state.conditions)
        if report.conflicts:
            updates.append(
                ConditionUpdate(
                    cond.DEGRADED,
                    "True",
                    Reason.APPLY_FAILED,
                    "objects exist that this resource does not own: " + ", ".join(report.conflicts),
                )
            )
        updates += lifecycle.advisories(resource.spec)
        events: list[EventRecord] = []

        def change(status: SpeculativeDeploymentStatus) -> SpeculativeDeploymentStatus:
            conditions = cond.set_conditions(status.conditions, updates, now, generation)
            wanted = status.model_copy(
                update={
                    "observed_generation": generation,
                    "conditions": conditions,
                    "endpoint": endpoint_url(resource, self.render_options),
                }
            )
            if not status.draft.version:
                wanted = wanted.model_copy(
                    update={
                        # The first draft is checked on the stable pods before speculation goes on.
                        "draft": drafts.draft_to_status(
                            resource.spec.draft, "Spec", lossless_check="Pending"
                        ),
                        "observed_spec_draft": drafts.draft_key(resource.spec.draft),
                    }
                )
            wanted = wanted.model_copy(update={"phase": phases.derive_phase(state.phase, wanted)})
            events[:] = lifecycle.condition_events(
                status.conditions, conditions, announce_first=frozenset({cond.READY})
            )
            return wanted

        await self.kube.update_status(API_VERSION, KIND, namespace, name, status_change(change), base=base)
        return events

    async def _invalid(
        self,
        namespace: str,
        name: str,
        generation: int,
        message: str,
        now: datetime,
        reason: str = Reason.INVALID_SPEC,
    ) -> list[EventRecord]:
        """Park the resource with Ready=False/InvalidSpec: no crash, no hot retry, nothing touched."""
        update = ConditionUpdate(cond.READY, "False", reason, message)
        events: list[EventRecord] = []

        def change(status: SpeculativeDeploymentStatus) -> SpeculativeDeploymentStatus:
            conditions = cond.set_condition(status.conditions, update, now, generation)
            if conditions != status.conditions:
                events[:] = [EventRecord("Warning", reason, message)]
            return status.model_copy(
                update={"conditions": conditions, "phase": "Invalid", "observed_generation": generation}
            )

        await self.kube.update_status(API_VERSION, KIND, namespace, name, status_change(change))
        return events
