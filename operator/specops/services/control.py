"""The speculation control loop's part of one resource's tick: gather, step, act.

gather: the stable variant's latest measurement from the metrics hub (one grouped query set for
every resource, each pod's own series in it), the ready stable pods, the spec's settings and the
prior (a calibration profile's ConfigMap, read again at most every PROFILE_REFRESH_S); step: one
pure call (domain.control_step) on the resource's one runtime record; act: delete the pods whose
acceptance collapsed, and hand the status blocks, conditions, Events and the revision to render
to the tick, which writes status and renders the revision once status names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import DraftSpec, SpeculativeDeployment
from specops.api.status import SpeculativeDeploymentStatus
from specops.domain import control_status as cs
from specops.domain import control_step, drafts, learning, profile_prior
from specops.domain.calibration import CalibrationState
from specops.domain.control_step import ControlState, Snapshot
from specops.domain.discovery import PodEndpoint
from specops.domain.engines.schedule import Revision
from specops.domain.lifecycle import EventRecord
from specops.domain.names import HOLDBACK, STABLE, variant_service_name
from specops.domain.profile import ProfileError, ServingProfile
from specops.domain.revision_step import StepConfig, config_from_spec, routes_holdback
from specops.ports import KubeApiError, KubePort, MetricsSource, RouteWeights

PROFILE_REFRESH_S = 60.0  # a calibration profile's ConfigMap is read again at most this often


@dataclass
class ControlResult:
    """The control loop's part of status (speculation, baseline, observed) and what to tell people."""

    status: SpeculativeDeploymentStatus
    updates: list[ConditionUpdate] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    roll_to: Revision | None = None
    """A new revision for the stable pods: rendered once the status naming it is written."""
    unchanged: bool = False
    """The inputs had not moved: nothing was decided (control_step's fast path)."""


class ControlLoop:
    """One tick = gather, step, act for one resource."""

    def __init__(
        self,
        metrics: MetricsSource,
        *,
        rate_window_s: float = 60.0,
        kube: KubePort | None = None,
        routes: RouteWeights | None = None,
    ) -> None:
        self.metrics = metrics
        self.kube = kube  # reads a calibration profile's ConfigMap, deletes collapsed pods
        self.routes = routes  # the holdback's weight on a user's HTTPRoute
        self._profiles: dict[tuple[str, str], _LoadedProfile] = {}
        self.rate_window_s = rate_window_s  # what one measurement spans: samples wait for it to settle
        self._records: dict[tuple[str, str], ControlState] = {}
        self._settings: dict[
            tuple[str, str], tuple[object, DraftSpec, str | None, StepConfig, learning.LearningConfig]
        ] = {}

    async def _profile(
        self,
        resource: SpeculativeDeployment,
        config: StepConfig,
        learn: learning.LearningConfig,
        now: datetime,
    ) -> _LoadedProfile | None:
        """The spec's calibration profile as prior statistics, read again at most every PROFILE_REFRESH_S;
        None when the spec names none. A missing or invalid one falls back to the roofline."""
        namespace, name = _key(resource)
        ref = resource.spec.speculation.calibration.profile
        if ref is None:
            self._profiles.pop((namespace, name), None)
            return None
        source = (ref.config_map_ref.name, ref.config_map_ref.key, resource.metadata.get("generation"))
        cached = self._profiles.get((namespace, name))
        if (
            cached is not None
            and cached.source == source
            and (now - cached.read_at).total_seconds() < PROFILE_REFRESH_S
        ):
            return cached
        where = f"ConfigMap {namespace}/{ref.config_map_ref.name} key {ref.config_map_ref.key!r}"

        def failed(reason: str, why: str) -> _LoadedProfile:
            message = f"{why}; deciding from the roofline prior instead"
            return _LoadedProfile(
                source, now, None, None, ConditionUpdate(cond.CALIBRATION_PROFILE, "False", reason, message)
            )

        if self.kube is None:
            loaded = failed(Reason.PROFILE_NOT_FOUND, f"cannot read {where}: no Kubernetes API client")
        else:
            try:
                config_map = await self.kube.get("v1", "ConfigMap", namespace, ref.config_map_ref.name)
            except KubeApiError as error:
                config_map, loaded = None, failed(Reason.PROFILE_NOT_FOUND, f"cannot read {where}: {error}")
            else:
                text = ((config_map or {}).get("data") or {}).get(ref.config_map_ref.key)
                if config_map is None:
                    loaded = failed(Reason.PROFILE_NOT_FOUND, f"{where}: the ConfigMap does not exist")
                elif not isinstance(text, str):
                    loaded = failed(Reason.PROFILE_NOT_FOUND, f"{where}: the ConfigMap has no such key")
                else:
                    try:
                        profile = ServingProfile.from_json(text)
                    except ProfileError as error:
                        loaded = failed(Reason.PROFILE_INVALID, f"{where} is not a serving profile: {error}")
                    else:
                        statistics = profile_prior.prior_statistics(
                            profile, config.setup, learn.calibration, max(1, config.max_k)
                        )
                        message = (
                            f"serving profile {profile.name!r} from {where} is the prior "
                            f"(break-even at alpha 0.8: {profile.break_even_batch(0.8) or 'none up to 1024'})"
                        )
                        condition = ConditionUpdate(
                            cond.CALIBRATION_PROFILE, "True", Reason.PROFILE_LOADED, message
                        )
                        loaded = _LoadedProfile(source, now, profile.name, statistics, condition)
        self._profiles[(namespace, name)] = loaded
        return loaded

    def subscribe(self, resource: SpeculativeDeployment, interval_s: float) -> None:
        spec = resource.spec
        self.metrics.register(_key(resource), spec.metrics.prometheus, spec.serving.backend, interval_s)

    def unsubscribe(self, namespace: str, name: str) -> None:
        self.metrics.unregister((namespace, name))
        self._records.pop((namespace, name), None)
        self._settings.pop((namespace, name), None)
        self._profiles.pop((namespace, name), None)

    async def tick(
        self,
        resource: SpeculativeDeployment,
        status: SpeculativeDeploymentStatus,
        endpoints: Sequence[PodEndpoint],
        now: datetime,
        *,
        draft_stale: bool,
        draft_unchecked: bool = False,
        canary_running: bool = False,
    ) -> ControlResult:
        key = _key(resource)
        off_reason = _off_reason(resource, draft_stale, draft_unchecked)
        snapshot, loaded = await self._gather(resource, now, status, endpoints, off_reason, canary_running)
        state, actions = control_step.step(self._records.get(key), snapshot, now)
        failed: dict[str, str] = {}
        events = list(actions.events)
        for restart in actions.restarts:
            failure = await self._delete_pod(key[0], restart.pod)
            if failure is not None:
                failed[restart.pod] = restart.incarnation
            event = control_step.restart_event(restart, key[0], failure)
            if event is not None:
                events.append(event)
        state = state.retrying(failed)
        new_status = actions.status
        if actions.weight is not None:
            confirmed, failure = await self._set_holdback_weight(resource, actions.weight, state.weight)
            if failure is not None:
                if state.weight_failure is None:  # said once, until the route carries a weight again
                    events.append(EventRecord("Warning", Reason.HOLDBACK_WEIGHT_NOT_SET, failure))
                new_status = _with_holdback_weight(new_status, confirmed)
            state = state.weighted(confirmed, failure)
        self._records[key] = state
        updates = [loaded.condition] if loaded is not None else []
        return ControlResult(
            new_status or status,
            updates + list(actions.conditions),
            events,
            actions.roll_to,
            unchanged=new_status is None,
        )

    async def _set_holdback_weight(
        self, resource: SpeculativeDeployment, weight: int, confirmed: int | None
    ) -> tuple[int | None, str | None]:
        """Set the holdback Service's weight on the resource's HTTPRoute, read back; the weight the
        route now carries and, when the write failed, why (the step sets it again next tick)."""
        gateway_api = resource.spec.canary.traffic_routing.gateway_api
        if self.routes is None or gateway_api is None:
            return confirmed, "no HTTPRoute to weight"
        namespace, name = _key(resource)
        held = variant_service_name(name, HOLDBACK)
        if weight > 0 and self.kube is not None:
            # a route naming a Service that does not exist fails that share of requests: the
            # Service comes with the holdback's Deployment, and a failed apply can leave it out
            try:
                service = await self.kube.get("v1", "Service", namespace, held)
            except KubeApiError as error:
                return (
                    confirmed,
                    f"could not read Service {namespace}/{held}: {error}; tried again every interval",
                )
            if service is None:
                return confirmed, (
                    f"Service {namespace}/{held} does not exist yet: the holdback stays off HTTPRoute "
                    f"{namespace}/{gateway_api.http_route} until it does"
                )
        result = await self.routes.set_route_weight(
            namespace,
            gateway_api.http_route,
            variant_service_name(name, STABLE),
            held,
            weight,
        )
        if result.ok:
            return weight, None
        return confirmed, (
            f"could not set the holdback Service's weight to {weight}% on HTTPRoute "
            f"{namespace}/{gateway_api.http_route}: {result.message}; tried again every interval"
        )

    async def _gather(
        self,
        resource: SpeculativeDeployment,
        now: datetime,
        status: SpeculativeDeploymentStatus,
        endpoints: Sequence[PodEndpoint],
        off_reason: str | None,
        canary_running: bool,
    ) -> tuple[Snapshot, _LoadedProfile | None]:
        spec = resource.spec
        config, learn = self._configs(resource, drafts.stable_draft(spec.draft, status), off_reason)
        loaded = await self._profile(resource, config, learn, now)
        measurement = self.metrics.lookup(
            spec.metrics.prometheus, spec.serving.backend, *_key(resource), STABLE, now
        )
        held = tuple(e for e in endpoints if e.variant == HOLDBACK)
        plain = (  # the holdback pod: plain speed where the load is
            self.metrics.lookup(spec.metrics.prometheus, spec.serving.backend, *_key(resource), HOLDBACK, now)
            if held
            else None
        )
        snapshot = Snapshot(
            uid=str(resource.metadata.get("uid", "")),
            config=config,
            learn=learn,
            status=status,
            measurement=measurement,
            pods=tuple(e for e in endpoints if e.variant == STABLE),
            held=held,
            plain=plain,
            replicas=spec.serving.replicas,
            canary_running=canary_running,
            weighted=self.routes is not None and routes_holdback(spec),
            min_acceptance=spec.slo.min_acceptance,
            prior=loaded.statistics if loaded is not None else None,
            profile_name=loaded.name if loaded is not None else None,
        )
        return snapshot, loaded

    def _configs(
        self, resource: SpeculativeDeployment, draft: DraftSpec, off_reason: str | None
    ) -> tuple[StepConfig, learning.LearningConfig]:
        """The step's and learning's settings, parsed again only when the spec object (typed once
        per resourceVersion), the stable draft or the reason to hold off changed."""
        key = _key(resource)
        kept = self._settings.get(key)
        if kept is not None and kept[0] is resource.spec and kept[1] == draft and kept[2] == off_reason:
            return kept[3], kept[4]
        config = config_from_spec(resource.spec, draft, off_reason=off_reason)
        learn = cs.learning_config(resource.spec, self.rate_window_s)
        self._settings[key] = (resource.spec, draft, off_reason, config, learn)
        return config, learn

    async def _delete_pod(self, namespace: str, pod: str) -> str | None:
        """Delete a collapsed pod (its Deployment starts a fresh engine); why it failed, or None."""
        if self.kube is None:
            return "no Kubernetes API client"
        try:
            await self.kube.delete("v1", "Pod", namespace, pod)
        except KubeApiError as error:
            return str(error)
        return None


@dataclass(frozen=True)
class _LoadedProfile:
    """A calibration profile as last read: its prior statistics, or None when it could not be used."""

    source: tuple[object, ...]
    read_at: datetime
    name: str | None
    statistics: CalibrationState | None
    condition: ConditionUpdate


def _off_reason(resource: SpeculativeDeployment, draft_stale: bool, draft_unchecked: bool) -> str | None:
    """Why the pods must run plain whatever the curve says, or None."""
    if draft_unchecked:
        return "the stable draft has not passed its lossless check: the pods run plain"
    if draft_stale and resource.spec.retraining.while_stale == "off":
        return "the draft is stale for the target version (retraining.whileStale: off): the pods run plain"
    return None


def _with_holdback_weight(
    status: SpeculativeDeploymentStatus | None, weight: int | None
) -> SpeculativeDeploymentStatus | None:
    """``status`` showing the holdback weight the route carries (a write that failed leaves it)."""
    holdback = None if status is None else status.speculation.holdback
    if status is None or holdback is None:
        return status
    speculation = status.speculation.model_copy(
        update={"holdback": holdback.model_copy(update={"weight": weight})}
    )
    return status.model_copy(update={"speculation": speculation})


def _key(resource: SpeculativeDeployment) -> tuple[str, str]:
    meta = resource.metadata
    return str(meta.get("namespace", "")), str(meta.get("name", ""))
