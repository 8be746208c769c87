"""The speculation control loop's part of one resource's tick.

gather: the stable variant's latest measurement from the metrics hub (one grouped query set for
every resource) and its ready pods; learn: the measurement becomes a calibration sample of the
draft length the engine used at that batch (the revision's schedule at the batch), once the
revision has settled (domain.learning); decide: one pure step (domain.revision_step) on the state
kept in status, which names the revision the stable pods should run; act: a new revision is
written to status and the stable Deployment is rendered with it after the write (a rollout, pod
by pod). Events come only from revision changes, break-even moves and collapsed pods.

A stable pod whose own acceptance collapsed while its neighbours on the same draft accept normally
(domain.collapse: an engine that lost its draft weights) is deleted, once an incarnation: its
Deployment starts a fresh engine on the same revision, and the Service stops sending it traffic as
soon as it terminates. A Warning Event names it with the numbers; status counts it.

A metrics outage is a measured state: the loop holds the revision in force, sets
MetricsUnavailable, and decides nothing until fresh data returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import SpeculativeDeployment
from specops.api.status import PodsApplied, RolloutStatus, SpeculativeDeploymentStatus
from specops.domain import collapse, drafts, learning, profile_prior
from specops.domain import control_status as cs
from specops.domain.calibration import CalibrationState, Fit
from specops.domain.discovery import PodEndpoint
from specops.domain.engines.schedule import PLAIN, Revision
from specops.domain.lifecycle import EventRecord
from specops.domain.metrics import REASON_PENDING, Measurement
from specops.domain.names import HOLDBACK, STABLE
from specops.domain.profile import ProfileError, ServingProfile
from specops.domain.records import replace
from specops.domain.revision_policy import BAND_EDGES, Evidence, SpeedupModel
from specops.domain.revision_policy import break_even as revision_break_even
from specops.domain.revision_step import PRIOR_ALPHA, StepConfig, config_from_spec, step
from specops.ports import KubeApiError, KubePort, MetricsSource

PROFILE_REFRESH_S = 60.0  # a calibration profile's ConfigMap is read again at most this often


@dataclass
class ControlResult:
    """The control loop's part of status (speculation, baseline, observed) and what to tell people."""

    status: SpeculativeDeploymentStatus
    updates: list[ConditionUpdate] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    roll_to: Revision | None = None
    """A new revision for the stable pods: rendered once the status naming it is written."""


@dataclass(frozen=True)
class _Memory:
    uid: str
    knowledge: learning.LearningState
    fit: Fit | None = None
    fit_prior: CalibrationState | None = None
    tracks: Mapping[str, learning.PodTrack] = field(default_factory=dict)
    revisions: Mapping[str, Revision] = field(default_factory=dict)
    """The revisions this resource's pods ran lately, by digest (a rollout's old pods still run one)."""
    anchors: Mapping[float, learning.Anchor] = field(default_factory=dict)
    """What each batch band measured directly (learning.anchor_pods); rebuilt after a restart."""
    collapsing: collapse.CollapseState = field(default_factory=collapse.CollapseState)
    restarts: Mapping[str, str] = field(default_factory=dict)
    """Collapsed pods (name -> incarnation) whose deletion failed: tried again every tick."""


class ControlLoop:
    """One tick = gather, learn, decide, act for one resource."""

    def __init__(
        self, metrics: MetricsSource, *, rate_window_s: float = 60.0, kube: KubePort | None = None
    ) -> None:
        self.metrics = metrics
        self.kube = kube  # reads a calibration profile's ConfigMap
        self._profiles: dict[tuple[str, str], _LoadedProfile] = {}
        self.rate_window_s = rate_window_s  # what one measurement spans: samples wait for it to settle
        self._memory: dict[tuple[str, str], _Memory] = {}
        self.rest_ended = "not-at-rest"

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

    def config_of(
        self, resource: SpeculativeDeployment, status: SpeculativeDeploymentStatus, off_reason: str | None
    ) -> StepConfig:
        draft = drafts.stable_draft(resource.spec.draft, status)
        return config_from_spec(resource.spec, draft, off_reason=off_reason)

    def rest(
        self, resource: SpeculativeDeployment, endpoints: Sequence[PodEndpoint], now: datetime
    ) -> Measurement | None:
        """Every tick is decided in full (the step is cheap; no rest is kept)."""
        return None

    def speculating(self, namespace: str, name: str) -> bool:
        """New pods start with their revision: none needs waking."""
        return False

    def subscribe(self, resource: SpeculativeDeployment, interval_s: float) -> None:
        spec = resource.spec
        self.metrics.register(_key(resource), spec.metrics.prometheus, spec.serving.backend, interval_s)

    def unsubscribe(self, namespace: str, name: str) -> None:
        self.metrics.unregister((namespace, name))
        self._memory.pop((namespace, name), None)
        self._profiles.pop((namespace, name), None)

    def _measure(
        self, resource: SpeculativeDeployment, draft_length: int, now: datetime, variant: str = STABLE
    ) -> Measurement:
        """A variant's latest measurement, from the metrics hub's memory."""
        spec = resource.spec
        return self.metrics.lookup(
            spec.metrics.prometheus,
            spec.serving.backend,
            *_key(resource),
            variant,
            now,
            draft_length=draft_length or None,
        )

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
        spec = resource.spec
        namespace, name = _key(resource)
        off_reason = None
        if draft_unchecked:
            off_reason = "the stable draft has not passed its lossless check: the pods run plain"
        elif draft_stale and spec.retraining.while_stale == "off":
            off_reason = (
                "the draft is stale for the target version (retraining.whileStale: off): the pods run plain"
            )
        config = self.config_of(resource, status, off_reason)
        learn = cs.learning_config(spec, self.rate_window_s)
        loaded = await self._profile(resource, config, learn, now)
        prior_stats = loaded.statistics if loaded is not None else None
        uid = str(resource.metadata.get("uid", ""))
        remembered = self._memory.get((namespace, name))
        if remembered is None or remembered.uid != uid:
            recorded = status.speculation.calibration
            remembered = _Memory(
                uid, learning.from_status(recorded), anchors=learning.anchors_from_status(recorded.anchors)
            )
        previous = remembered.fit if remembered.fit_prior == prior_stats else None
        fitted = profile_prior.model(
            config.setup, remembered.knowledge.calibration, learn.calibration, prior_stats, previous
        )
        prior_model = profile_prior.prior_model(config.setup, learn.calibration, prior_stats)
        state = cs.state_from_status(status.speculation, status.baseline, config, prior_model, now)
        current = state.revision
        mine = [e for e in endpoints if e.variant == STABLE]
        held_back = [e for e in endpoints if e.variant == HOLDBACK]
        on_revision = sum(1 for e in mine if e.revision == current.digest)
        wanted = spec.serving.replicas
        stable_wanted = wanted - 1 if state.holdback else wanted
        held_wanted = 1 if state.holdback else 0
        rollout_running = (
            on_revision < stable_wanted
            or len(mine) > stable_wanted
            or sum(1 for e in held_back if e.revision == PLAIN.digest) < held_wanted
            or len(held_back) > held_wanted
        )
        measurement = self._measure(resource, 0, now)
        if measurement.ok and current.schedule is not None and measurement.batch is not None:
            # engines that count tokens but not steps: acceptance at the K the schedule gives here
            measurement = measurement.with_configured_draft_length(current.schedule.k_at(measurement.batch))
        updates: list[ConditionUpdate] = []
        events: list[EventRecord] = []
        if loaded is not None:
            updates.append(loaded.condition)
        pods = PodsApplied(desired=wanted, applied=on_revision)
        rollout = (
            RolloutStatus(
                target=current.digest,
                started_at=_rollout_start(status, current.digest, state.last_change, now),
                updated=on_revision,
                ready=on_revision,
                replicas=wanted,
            )
            if rollout_running
            else None
        )
        if not measurement.ok:
            updates.append(cs.applied_condition(wanted, on_revision, current))
            if measurement.reason != REASON_PENDING:  # the first poll after start-up is not an outage
                updates.append(
                    ConditionUpdate(
                        cond.METRICS_UNAVAILABLE,
                        "True",
                        measurement.reason or Reason.PROMETHEUS_UNREACHABLE,
                        f"{measurement.error}; holding revision {current.digest} ({current.describe()})",
                    )
                )
            speculation = status.speculation.model_copy(
                update={"pods": pods, "rollout": rollout, "revision": cs.revision_to_status(current)}
            )
            held = ControlResult(status.model_copy(update={"speculation": speculation}), updates, events)
            if status.speculation.revision is None:  # a new resource: its first revision is recorded
                held.roll_to = current
                held.status = held.status.model_copy(
                    update={
                        "speculation": speculation.model_copy(
                            update={
                                "control_phase": state.phase,
                                "phase_since": state.phase_since,
                                "schedule": current.describe(),
                            }
                        )
                    }
                )
            return held

        revisions = {current.digest: current, **remembered.revisions}
        # a pod whose acceptance collapsed against its neighbours': deleted, so a fresh engine replaces it
        collapsing, collapsed = collapse.detect(
            remembered.collapsing,
            _acceptances(measurement, mine, revisions),
            {e.name for e in mine},
            measurement.at,
        )
        restarts, restart_events = await self._restart_collapsed(
            namespace, mine, collapsed, remembered.restarts
        )
        events += restart_events
        # learn: each settled pod's window at the K its revision's schedule gave at its batch (a
        # collapsing pod's windows measure a broken engine, not the deployment: left out)
        knowledge = remembered.knowledge
        batch = measurement.batch or 0.0
        readings = [r for r in _readings(measurement, mine, revisions) if not collapsing.suspect(r.pod)]
        plain_tpot_s = None
        if held_back:  # the holdback pod: plain speed where the load is
            plain = self._measure(resource, 0, now, HOLDBACK)
            if plain.ok:
                readings += _readings(plain, held_back, {PLAIN.digest: PLAIN})
                plain_tpot_s = plain.tpot_mean_s or plain.tpot_p50_s
        tracks = learning.track_pods(remembered.tracks, readings, learn, now)
        learned, at_zero = learning.learn_pods(
            knowledge.calibration, readings, tracks, config.setup, learn, now
        )
        anchors = learning.anchor_pods(remembered.anchors, readings, tracks, BAND_EDGES, learn, now)
        if learned is not knowledge.calibration:
            knowledge = replace(knowledge, calibration=learned)
            fitted = profile_prior.model(config.setup, learned, learn.calibration, prior_stats, fitted.fit)
        model: SpeedupModel = (
            Evidence(fitted, prior_model, fitted, anchors=anchors, steps=fitted, prior_steps=prior_model)
            if learn.enabled
            else prior_model
        )
        k0 = tuple(learning.k0_ratios(at_zero, fitted)) if learn.enabled else ()

        inputs = cs.inputs_from(
            measurement,
            rollout_running=rollout_running,
            canary_running=canary_running,
            k0_ratios=k0,
            plain_tpot_p50_s=plain_tpot_s,
        )
        decision = step(config, state, inputs, model, now)
        alpha = decision.state.alpha if decision.state.alpha is not None else PRIOR_ALPHA
        bounds = (max(1, config.min_k), max(1, config.min_k, config.max_k))
        break_even = revision_break_even(model, alpha, bounds)
        prior_break_even = learning.break_even(prior_model, alpha, bounds)
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
        if decision.changed:
            events.append(
                EventRecord("Warning" if decision.warning else "Normal", decision.reason, decision.message)
            )
        known = {current.digest: current, decision.state.revision.digest: decision.state.revision}
        self._memory[(namespace, name)] = _Memory(
            uid, knowledge, fitted.fit, prior_stats, tracks, known, anchors, collapsing, restarts
        )
        updates.append(ConditionUpdate(cond.METRICS_UNAVAILABLE, "False", Reason.METRICS_OK, ""))
        updates.append(cs.acceptance_condition(decision.state, spec.slo.min_acceptance))
        if decision.changed:
            rollout = RolloutStatus(
                target=decision.state.revision.digest, started_at=now, updated=0, ready=0, replicas=wanted
            )
            pods = PodsApplied(desired=wanted, applied=0)
        updates.append(cs.applied_condition(wanted, pods.applied, decision.state.revision))
        speculation = cs.speculation_status(
            decision, inputs, now, pods, rollout, replicas=resource.spec.serving.replicas
        )
        calibration = learning.to_status(
            knowledge,
            fitted,
            learn,
            batch=batch,
            break_even_batch=break_even,
            prior_break_even_batch=prior_break_even,
            computed=True,
        )
        calibration = calibration.model_copy(
            update={
                **_prior_fields(loaded, knowledge, learn),
                "anchors": learning.anchors_to_status(anchors),
                "break_even_band": _break_even_band(fitted if learn.enabled else prior_model, alpha, bounds),
            }
        )
        speculation = speculation.model_copy(
            update={
                "calibration": calibration,
                "acceptance_collapses": status.speculation.acceptance_collapses + len(collapsed),
            }
        )
        new_status = status.model_copy(
            update={
                "speculation": speculation,
                "baseline": cs.baseline_status(decision.state, status.baseline),
                "observed": cs.observed_status(measurement),
            }
        )
        # the first record renders too: the pods came up on the reconciler's roofline prior
        first = status.speculation.revision is None
        return ControlResult(
            new_status, updates, events, decision.state.revision if decision.changed or first else None
        )

    async def _restart_collapsed(
        self,
        namespace: str,
        pods: Sequence[PodEndpoint],
        collapsed: Sequence[collapse.Collapse],
        pending: Mapping[str, str],
    ) -> tuple[dict[str, str], list[EventRecord]]:
        """Delete each collapsed pod (its Deployment starts a fresh engine with the same revision) and
        retry those whose deletion failed before, while the same incarnation still serves; returns
        the pods still to delete and one Warning Event per collapse."""
        serving = {e.name: e for e in pods}
        wanted = {
            pod: incarnation
            for pod, incarnation in pending.items()
            if pod in serving and serving[pod].incarnation == incarnation
        }
        wanted.update({c.pod: c.incarnation for c in collapsed})
        failed: dict[str, str] = {}
        for pod in wanted:
            if self.kube is None:
                failed[pod] = "no Kubernetes API client"
                continue
            try:
                await self.kube.delete("v1", "Pod", namespace, pod)
            except KubeApiError as error:
                failed[pod] = str(error)
        events = []
        for c in collapsed:
            revision = serving[c.pod].revision if c.pod in serving else ""
            cause = "its engine has likely lost the draft weights (a resume or a weight sync)"
            if c.pod in failed:
                action = (
                    f"deleting the pod failed ({failed[c.pod]}): tried again every interval; "
                    f"or delete it by hand (kubectl -n {namespace} delete pod {c.pod})"
                )
            else:
                action = f"deleted the pod: its Deployment starts a fresh engine on revision {revision}"
            events.append(
                EventRecord("Warning", Reason.ACCEPTANCE_COLLAPSED, f"{c.describe()}; {cause}; {action}.")
            )
        return {pod: wanted[pod] for pod in failed}, events


@dataclass(frozen=True)
class _LoadedProfile:
    """A calibration profile as last read: its prior statistics, or None when it could not be used."""

    source: tuple[object, ...]
    read_at: datetime
    name: str | None
    statistics: CalibrationState | None
    condition: ConditionUpdate


def _prior_fields(
    loaded: _LoadedProfile | None, knowledge: learning.LearningState, learn: learning.LearningConfig
) -> dict[str, object]:
    """Which prior the model starts from; the model source reads `profile` until a sample lands."""
    if loaded is None or loaded.statistics is None:
        return {"prior_source": "roofline", "profile_name": None}
    fields: dict[str, object] = {"prior_source": "profile", "profile_name": loaded.name}
    if not learn.enabled or knowledge.calibration.weight <= 0:
        fields["model_source"] = "profile"
    return fields


BAND_TOLERANCE = 0.02
"""The speedup "hugs 1" where the best draft length predicts within this of 1."""


def _break_even_band(model: SpeedupModel, alpha: float, bounds: tuple[int, int]) -> list[int]:
    """[low, high] batches over which the best K's predicted speedup stays within BAND_TOLERANCE of 1,
    when that spans more than a factor 2 (a break-even that is a band, not a batch); else []."""
    predict = model.predict_speedup
    near = []
    for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        best = max(predict(alpha, k, float(batch)) for k in range(bounds[0], bounds[1] + 1))
        if abs(best - 1.0) <= BAND_TOLERANCE:
            near.append(batch)
    if len(near) >= 2 and near[-1] >= 2 * near[0]:
        return [near[0], near[-1]]
    return []


def _readings(
    measurement: Measurement, pods: Sequence[PodEndpoint], revisions: Mapping[str, Revision]
) -> list[learning.PodReading]:
    """Each stable pod's own window, with the revision its label names (pods of an unknown revision,
    or without a reading, are left out); acceptance is the variant's, read for speculating pods."""
    if not measurement.per_pod:  # an engine or scrape without per-pod series: the variant as one pod
        current = revisions.get(pods[0].revision) if pods and len({p.revision for p in pods}) == 1 else None
        if current is None or measurement.batch is None:
            return []
        alpha = measurement.alpha if current.mode == "spec" else None
        tpot = measurement.tpot_mean_s or measurement.tpot_p50_s
        return [learning.PodReading(STABLE, current, measurement.batch, tpot, alpha)]
    readings = []
    for pod in pods:
        own = measurement.per_pod.get(pod.name)
        revision = revisions.get(pod.revision)
        if own is None or revision is None or own.batch is None:
            continue
        alpha = measurement.alpha if revision.mode == "spec" else None
        readings.append(learning.PodReading(pod.name, revision, own.batch, own.tpot_mean_s, alpha))
    return readings


def _acceptances(
    measurement: Measurement, pods: Sequence[PodEndpoint], revisions: Mapping[str, Revision]
) -> list[collapse.PodAcceptance]:
    """Each speculating stable pod's own acceptance, where its drafts flow (collapse.reading)."""
    found = []
    for pod in pods:
        own = measurement.per_pod.get(pod.name)
        revision = revisions.get(pod.revision)
        if own is None or revision is None or revision.schedule is None or own.batch is None:
            continue
        k = revision.schedule.k_at(own.batch) if revision.mode == "spec" else 0
        reading = collapse.reading(pod.name, pod.incarnation, pod.draft, own, k)
        if reading is not None:
            found.append(reading)
    return found


def _rollout_start(
    status: SpeculativeDeploymentStatus, digest: str, last_change: datetime | None, now: datetime
) -> datetime:
    """When the rollout to ``digest`` began: as status recorded it, else the revision's last change,
    else now (written once: a status whose start moved every tick would be written every tick)."""
    recorded = status.speculation.rollout
    if recorded is not None and recorded.target == digest:
        return recorded.started_at
    return last_change or now


def _key(resource: SpeculativeDeployment) -> tuple[str, str]:
    meta = resource.metadata
    return str(meta.get("namespace", "")), str(meta.get("name", ""))
