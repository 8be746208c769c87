"""One resource's control decision as one pure step: ``step(state, snapshot, now) -> (state, actions)``.

The service gathers a ``Snapshot`` (the stable variant's measurement with each pod's own
readings, the ready stable pods and the revision each runs, whether a canary runs, the spec's
config and the prior), calls ``step`` and carries out the ``Actions``: the status blocks to
write, condition updates, Events with their evidence, the revision to render once status names
it, and the pods to restart after an acceptance collapse. The step composes, in order:

- acceptance collapse (domain.collapse): a speculating pod accepting nothing while its
  neighbours on the same draft accept normally is restarted, once an incarnation, and its
  windows teach the curve nothing;
- learning (domain.learning): each settled pod's window at the K its revision's schedule gave
  at its batch (``track_pods``, ``learn_pods``, ``anchor_pods``), then the fitted model (the
  calibration over the prior, per-band anchors: revision_policy.Evidence);
- the decision (domain.revision_step.step) and the break-even shown, worked out again once a
  ``CURVE_REFRESH_S`` or when the decision changes (it is what status and an Event show; worked
  out at every poll it would be two fifths of a tick's CPU).

``ControlState`` is the resource's one runtime record. What a restart of the operator must not
lose is in status: the revision, the phase and its start, the last change (written at once), the
baseline, the fit's statistics and the band anchors (written with the measurements). ``restore``
rebuilds the record from status; whenever status does not show what the record last decided (a
status write that failed, another writer), the decision's state is taken from status again.

A metrics outage is a measured state: the revision in force holds, MetricsUnavailable is set,
and nothing is decided until fresh data returns.

Fast path: a snapshot whose digest is the last one's (the same poll, pods, spec, prior and canary)
with no timer of the decision due (a phase's end, the minimum interval after a change) and no pod
restart to retry returns the state as it is and no actions; the decision in status stands.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.status import PodsApplied, RolloutStatus, SpeculativeDeploymentStatus
from specops.domain import collapse, learning, profile_prior, traffic
from specops.domain import control_status as cs
from specops.domain.calibration import CalibratedModel, CalibrationState, Confidence, Fit
from specops.domain.discovery import PodEndpoint
from specops.domain.engines.schedule import PLAIN, Revision
from specops.domain.lifecycle import EventRecord
from specops.domain.metrics import REASON_PENDING, Measurement
from specops.domain.names import STABLE
from specops.domain.revision_policy import BAND_EDGES, K0_COST_HIGH, Evidence, SpeedupModel
from specops.domain.revision_policy import break_even as revision_break_even
from specops.domain.revision_step import BASELINE_SAMPLES, PRIOR_ALPHA, StepConfig, StepState
from specops.domain.revision_step import step as decide

# ------------------------------------------------------------------ in


@dataclass(frozen=True)
class Snapshot:
    """What the service gathered for one resource this tick."""

    uid: str
    config: StepConfig
    """The spec's decision settings (with why speculation is held off now, if it is)."""
    learn: learning.LearningConfig
    status: SpeculativeDeploymentStatus
    """The resource's status as read: what a restored record starts from."""
    measurement: Measurement
    """The stable variant's latest measurement, with each pod's own readings (``per_pod``)."""
    pods: tuple[PodEndpoint, ...]
    """The ready stable pods (each labelled with the revision it runs)."""
    replicas: int
    held: tuple[PodEndpoint, ...] = ()
    """The ready holdback pods (plain, beside the speculating stable pods through a baseline)."""
    plain: Measurement | None = None
    """The holdback variant's latest measurement (None: no holdback pod runs)."""
    canary_running: bool = False
    weighted: bool = False
    """The holdback's share of traffic is a route weight this step sets (an HTTPRoute); False: the
    pods share the Service evenly."""
    min_acceptance: float = 0.0
    prior: CalibrationState | None = None
    """A calibration profile's prior statistics; None: the roofline is the prior."""
    profile_name: str | None = None

    def digest(self) -> int:
        """Everything the decision reads but status: equal digests decide the same (the status part
        is checked apart, ``ControlState.shown_by``). An Ok measurement is one poll (``at``); an
        Error one is its reason, whatever tick asked."""
        m = self.measurement
        reading = (m.phase, m.at) if m.ok else (m.phase, m.reason, m.error)
        plain = None if self.plain is None else (self.plain.phase, self.plain.at)
        return hash(
            (
                self.uid,
                self.config,
                self.learn,
                reading,
                plain,
                self.pods,
                self.held,
                self.replicas,
                self.canary_running,
                self.weighted,
                self.min_acceptance,
                self.prior,
                self.profile_name,
            )
        )


# ------------------------------------------------------------------ state


CURVE_REFRESH_S = 60.0
"""The break-even, the prior's and the band status shows are worked out again this often (or when
the decision changes): the model moves by a sample or two a poll, status refreshes its
measurements about once a minute, and the search asks the model a hundred points."""


@dataclass(frozen=True)
class Curve:
    """The break-even shown, and when and for what it was worked out."""

    at: datetime
    alpha: float
    revision: str
    break_even: int | None
    prior_break_even: int | None
    band: tuple[int, ...]

    def fresh(self, now: datetime, revision: str) -> bool:
        return revision == self.revision and (now - self.at).total_seconds() < CURVE_REFRESH_S


Shown = tuple[str, int, str, int | None, bool]
"""What status shows of a decision once written: phase, its start, the revision, the last change
(times to the second, as status holds them), whether a pod is held back."""


def _shown(state: StepState) -> Shown:
    changed = None if state.last_change is None else int(state.last_change.timestamp())
    return (state.phase, int(state.phase_since.timestamp()), state.revision.digest, changed, state.holdback)


@dataclass(frozen=True)
class ControlState:
    """One resource's runtime record: the decision's state and what learning keeps between steps."""

    uid: str
    decision: StepState
    knowledge: learning.LearningState
    fit: Fit | None = None
    fit_prior: CalibrationState | None = None
    """The prior ``fit`` was solved with (a new prior solves again)."""
    tracks: Mapping[str, learning.PodTrack] = field(default_factory=dict)
    revisions: Mapping[str, Revision] = field(default_factory=dict)
    """The revisions this resource's pods ran lately, by digest (a rollout's old pods still run one)."""
    anchors: Mapping[float, learning.Anchor] = field(default_factory=dict)
    collapsing: collapse.CollapseState = field(default_factory=collapse.CollapseState)
    restarts: Mapping[str, str] = field(default_factory=dict)
    """Collapsed pods (name -> incarnation) to restart: tried again every step until done."""
    digest: int | None = None
    """The digest of the snapshot last decided on (None: decide in full)."""
    due: datetime | None = None
    """When time alone may change the decision (a phase ends, the minimum interval passes)."""
    weight: int | None = None
    """The holdback's route weight as last confirmed on the route (None: not known yet)."""
    wanted_weight: int | None = None
    """The holdback's route weight the step decided (None: nothing to set, the route is not ours)."""
    weight_failure: str | None = None
    """Why the last weight write failed (None: it did not)."""
    curve: Curve | None = None
    """The break-even last worked out (None: never yet)."""

    def shown_by(self, status: SpeculativeDeploymentStatus) -> bool:
        """Whether status shows this record's decision (else the record is restored from it)."""
        speculation = status.speculation
        if (
            speculation.revision is None
            or speculation.control_phase is None
            or speculation.phase_since is None
        ):
            return False
        changed = speculation.last_change_time
        recorded: Shown = (
            speculation.control_phase,
            int(speculation.phase_since.timestamp()),
            speculation.revision.digest,
            None if changed is None else int(changed.timestamp()),
            speculation.holdback is not None,
        )
        return recorded == _shown(self.decision)

    def retrying(self, failed: Mapping[str, str]) -> ControlState:
        """The record after its restarts were tried: those that failed are tried again next step."""
        return replace(self, restarts=dict(failed)) if failed != self.restarts else self

    def weighted(self, confirmed: int | None, failure: str | None = None) -> ControlState:
        """The record after a weight write: ``confirmed`` is what the route now carries (the last
        confirmed weight when the write failed, ``failure`` saying why: the step sets it again)."""
        if confirmed == self.weight and failure == self.weight_failure:
            return self
        return replace(self, weight=confirmed, weight_failure=failure)


def restore(snapshot: Snapshot, now: datetime) -> ControlState:
    """The record as status keeps it (a new resource: its initial state)."""
    recorded = snapshot.status.speculation.calibration
    return ControlState(
        snapshot.uid,
        _recorded(snapshot, now),
        learning.from_status(recorded),
        anchors=learning.anchors_from_status(recorded.anchors),
    )


def _recorded(snapshot: Snapshot, now: datetime) -> StepState:
    """The decision's state as status shows it (a new resource: its initial state)."""
    config, learn, status = snapshot.config, snapshot.learn, snapshot.status
    prior_model = profile_prior.prior_model(config.setup, learn.calibration, snapshot.prior)
    return cs.state_from_status(status.speculation, status.baseline, config, prior_model, now)


# ------------------------------------------------------------------ out


@dataclass(frozen=True)
class Restart:
    """A stable pod to delete so that its Deployment starts a fresh engine on the same revision."""

    pod: str
    incarnation: str
    revision: str
    collapse: collapse.Collapse | None = None
    """The evidence, when it collapsed this step (None: a deletion that failed before, tried again)."""


@dataclass(frozen=True)
class Actions:
    """What the service does for one step. Empty: nothing moved."""

    status: SpeculativeDeploymentStatus | None = None
    """The status with the control loop's blocks (speculation, baseline, observed) as decided;
    None: they stand as recorded."""
    conditions: tuple[ConditionUpdate, ...] = ()
    events: tuple[EventRecord, ...] = ()
    roll_to: Revision | None = None
    """A new revision for the stable pods: rendered once the status naming it is written."""
    restarts: tuple[Restart, ...] = ()
    weight: int | None = None
    """The holdback's route weight to set, in percent (0: take the holdback out of the route);
    None: the route stands."""


NOTHING = Actions()


def restart_event(restart: Restart, namespace: str, failure: str | None) -> EventRecord | None:
    """The Warning Event of a collapse: the numbers, the likely cause, and what was done."""
    if restart.collapse is None:
        return None
    cause = "its engine has likely lost the draft weights (a resume or a weight sync)"
    if failure is not None:
        action = (
            f"deleting the pod failed ({failure}): tried again every interval; "
            f"or delete it by hand (kubectl -n {namespace} delete pod {restart.pod})"
        )
    else:
        action = f"deleted the pod: its Deployment starts a fresh engine on revision {restart.revision}"
    return EventRecord(
        "Warning", Reason.ACCEPTANCE_COLLAPSED, f"{restart.collapse.describe()}; {cause}; {action}."
    )


# ------------------------------------------------------------------ the step


def step(state: ControlState | None, snapshot: Snapshot, now: datetime) -> tuple[ControlState, Actions]:
    """The next record and what to do (see the module docstring)."""
    if state is None or state.uid != snapshot.uid:
        state = restore(snapshot, now)
    elif not state.shown_by(snapshot.status):  # the decision as status shows it; learning goes on
        state = replace(state, decision=_recorded(snapshot, now), digest=None)
    digest = snapshot.digest()
    if state.digest == digest and not state.restarts and (state.due is None or now < state.due):
        if (
            state.wanted_weight is not None
            and state.weight != state.wanted_weight
            and not snapshot.canary_running
        ):
            return state, Actions(weight=state.wanted_weight)  # a weight write that failed, again
        return state, NOTHING
    config = snapshot.config
    decision_state = state.decision
    drafted = cs.for_draft(decision_state.revision, config.draft)
    if drafted is not decision_state.revision:  # a promoted draft: the same schedule, the new identity
        decision_state = replace(decision_state, revision=drafted)
    current = decision_state.revision
    measurement = snapshot.measurement
    if measurement.ok and current.schedule is not None and measurement.batch is not None:
        # engines that count tokens but not steps: acceptance at the K the schedule gives here
        measurement = measurement.with_configured_draft_length(current.schedule.k_at(measurement.batch))
    if not measurement.ok:
        held = replace(state, decision=decision_state, digest=digest, due=None)
        return held, _held(snapshot, measurement, decision_state, now)
    return _decided(replace(state, decision=decision_state), snapshot, measurement, now, digest)


def _pods(snapshot: Snapshot, state: StepState, now: datetime) -> tuple[PodsApplied, RolloutStatus | None]:
    """How many stable pods run the revision in force, and the rollout while some do not."""
    current, pods, wanted = state.revision, snapshot.pods, snapshot.replicas
    held = _held_pods(state, wanted)  # the holdback pod runs plain, not ``current``
    on_revision = sum(1 for p in pods if p.revision == current.digest)
    plain_held = sum(1 for p in snapshot.held if p.revision == PLAIN.digest)
    applied = PodsApplied(desired=wanted - held, applied=on_revision)
    if (
        on_revision >= wanted - held
        and len(pods) <= wanted - held
        and plain_held >= held >= len(snapshot.held)
    ):
        return applied, None
    started = _rollout_start(snapshot.status, current.digest, state.last_change, now)
    return applied, RolloutStatus(
        target=current.digest, started_at=started, updated=on_revision, ready=on_revision, replicas=wanted
    )


def _held_pods(state: StepState, replicas: int) -> int:
    """Pods held back plain beside the stable ones (1 through a holdback baseline, else 0)."""
    return 1 if state.holdback and replicas >= 2 else 0


def _held(snapshot: Snapshot, measurement: Measurement, state: StepState, now: datetime) -> Actions:
    """No usable measurement: the revision in force holds, and says so."""
    current, status = state.revision, snapshot.status
    applied, rollout = _pods(snapshot, state, now)
    conditions = [cs.applied_condition(applied.desired, applied.applied, current)]
    if measurement.reason != REASON_PENDING:  # the first poll after start-up is not an outage
        conditions.append(
            ConditionUpdate(
                cond.METRICS_UNAVAILABLE,
                "True",
                measurement.reason or Reason.PROMETHEUS_UNREACHABLE,
                f"{measurement.error}; holding revision {current.digest} ({current.describe()})",
            )
        )
    previous = status.speculation.holdback
    update: dict[str, object] = {
        "pods": applied,
        "rollout": rollout,
        "revision": cs.revision_to_status(current),
        # a holdback under way keeps what status says of it (its cost is a decision's prediction)
        "holdback": previous
        if state.holdback and previous is not None
        else cs.holdback_status(state, snapshot.replicas, None),
    }
    if status.speculation.revision is None:  # a new resource: its first revision is recorded
        update.update(
            {"control_phase": state.phase, "phase_since": state.phase_since, "schedule": current.describe()}
        )
    speculation = status.speculation.model_copy(update=update)
    return Actions(
        status=status.model_copy(update={"speculation": speculation}),
        conditions=tuple(conditions),
        # the first record renders too: the pods came up on the reconciler's roofline prior
        roll_to=current if status.speculation.revision is None else None,
    )


def _decided(
    state: ControlState,
    snapshot: Snapshot,
    measurement: Measurement,
    now: datetime,
    digest: int,
) -> tuple[ControlState, Actions]:
    config, learn, status = snapshot.config, snapshot.learn, snapshot.status
    pods, wanted = snapshot.pods, snapshot.replicas
    current = state.decision.revision
    prior_stats = snapshot.prior
    prior_model = profile_prior.prior_model(config.setup, learn.calibration, prior_stats)
    previous = state.fit if state.fit_prior == prior_stats else None
    knowledge = state.knowledge
    fitted = profile_prior.model(
        config.setup, knowledge.calibration, learn.calibration, prior_stats, previous
    )
    revisions = {current.digest: current, **state.revisions}

    # a pod whose acceptance collapsed against its neighbours': restarted, a fresh engine replaces it
    collapsing, collapsed = collapse.detect(
        state.collapsing, _acceptances(measurement, pods, revisions), {p.name for p in pods}, measurement.at
    )
    serving = {p.name: p for p in pods}
    restarts = {
        pod: incarnation
        for pod, incarnation in state.restarts.items()
        if pod in serving and serving[pod].incarnation == incarnation
    }
    restarts.update({c.pod: c.incarnation for c in collapsed})
    evidence = {c.pod: c for c in collapsed}
    restart_actions = tuple(
        Restart(pod, incarnation, serving[pod].revision, evidence.get(pod))
        for pod, incarnation in restarts.items()
    )

    # learn: each settled pod's window at the K its revision's schedule gave at its batch (a
    # collapsing pod's windows measure a broken engine, not the deployment: left out)
    readings = [r for r in _readings(measurement, pods, revisions) if not collapsing.suspect(r.pod)]
    plain = snapshot.plain
    plain_tpot_s = None
    if plain is not None and plain.ok and snapshot.held:  # the holdback pod: plain speed where the load is
        readings += _readings(plain, snapshot.held, {PLAIN.digest: PLAIN})
        plain_tpot_s = plain.tpot_mean_s or plain.tpot_p50_s
    tracks = learning.track_pods(state.tracks, readings, learn, now)
    learned, at_zero = learning.learn_pods(knowledge.calibration, readings, tracks, config.setup, learn, now)
    anchors = learning.anchor_pods(state.anchors, readings, tracks, BAND_EDGES, learn, now)
    if learned is not knowledge.calibration:
        knowledge = replace(knowledge, calibration=learned)
        fitted = profile_prior.model(config.setup, learned, learn.calibration, prior_stats, fitted.fit)
    top = max(1, config.min_k, config.max_k)
    model: SpeedupModel = (
        Evidence(
            _Tabled(fitted, top),
            _Tabled(prior_model, top),
            _Confident(fitted),
            anchors=anchors,
            steps=fitted,
            prior_steps=prior_model,
            k0_cost=K0_COST_HIGH if state.decision.k0_cost is None else state.decision.k0_cost,
        )
        if learn.enabled
        else _Tabled(prior_model, top)
    )
    k0 = tuple(learning.k0_ratios(at_zero, anchors, BAND_EDGES, fitted)) if learn.enabled else ()

    applied, rollout = _pods(snapshot, state.decision, now)
    inputs = cs.inputs_from(
        measurement,
        rollout_running=rollout is not None,
        canary_running=snapshot.canary_running,
        k0_ratios=k0,
        plain_tpot_p50_s=plain_tpot_s,
        restart_s=_start_seconds((*pods, *snapshot.held)),
    )
    decision = decide(config, state.decision, inputs, model, now)
    alpha = decision.state.alpha if decision.state.alpha is not None else PRIOR_ALPHA
    curve = state.curve
    if curve is None or decision.changed or not curve.fresh(now, decision.state.revision.digest):
        bounds = (max(1, config.min_k), max(1, config.min_k, config.max_k))
        curve = Curve(
            now,
            alpha,
            decision.state.revision.digest,
            revision_break_even(model, alpha, bounds),
            learning.break_even(prior_model, alpha, bounds),
            tuple(_break_even_band(fitted if learn.enabled else prior_model, alpha, bounds)),
        )
    break_even, prior_break_even = curve.break_even, curve.prior_break_even
    knowledge, moved = learning.announce(knowledge, break_even, prior_break_even)
    events: list[EventRecord] = []
    if moved is not None:
        events.append(
            EventRecord(
                "Normal",
                "CalibrationMovedBreakEven",
                f"{moved} (alpha {curve.alpha:.2f}, {knowledge.calibration.samples} samples, "
                f"relative fit error {fitted.relative_fit_error() or 0.0:.3f}).",
            )
        )
    if decision.changed:
        events.append(
            EventRecord("Warning" if decision.warning else "Normal", decision.reason, decision.message)
        )

    if decision.changed:
        rollout = RolloutStatus(
            target=decision.state.revision.digest, started_at=now, updated=0, ready=0, replicas=wanted
        )
        applied = PodsApplied(desired=wanted - _held_pods(decision.state, wanted), applied=0)
    conditions = (
        ConditionUpdate(cond.METRICS_UNAVAILABLE, "False", Reason.METRICS_OK, ""),
        cs.acceptance_condition(decision.state, snapshot.min_acceptance),
        cs.applied_condition(wanted, applied.applied, decision.state.revision),
    )
    # a draft canary weights the same route: the holdback's weight holds until it ends
    split = (
        _holdback_weight(snapshot, state, decision.state, measurement, fitted, rollout is not None)
        if snapshot.weighted and not snapshot.canary_running
        else None
    )
    weight = None if split is None else split.weight
    moved_weight = _weight_event(state.wanted_weight, split, measurement, snapshot.plain)
    if moved_weight is not None:
        events.append(moved_weight)
    speculation = cs.speculation_status(
        decision,
        inputs,
        now,
        applied,
        rollout,
        replicas=wanted,
        holdback_weight=weight if weight is not None or not snapshot.weighted else state.weight,
    )
    calibration = learning.to_status(
        knowledge,
        fitted,
        learn,
        batch=measurement.batch or 0.0,
        break_even_batch=break_even,
        prior_break_even_batch=prior_break_even,
        computed=True,
    )
    calibration = calibration.model_copy(
        update={
            **_prior_fields(snapshot, knowledge, learn),
            "anchors": learning.anchors_to_status(anchors),
            "break_even_band": list(curve.band),
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
    running = {p.revision for p in pods}  # a rollout's old pods still run theirs
    known = {d: r for d, r in revisions.items() if d in running}
    known.update({current.digest: current, decision.state.revision.digest: decision.state.revision})
    next_state = ControlState(
        state.uid,
        decision.state,
        knowledge,
        fitted.fit,
        prior_stats,
        tracks,
        known,
        anchors,
        collapsing,
        restarts,
        digest,
        due_at(config, decision.state, now),
        state.weight,
        state.wanted_weight if snapshot.canary_running else weight,
        state.weight_failure,
        curve,
    )
    actions = Actions(
        status=new_status,
        conditions=conditions,
        events=tuple(events),
        # the first record renders too: the pods came up on the reconciler's roofline prior
        roll_to=decision.state.revision if decision.changed or status.speculation.revision is None else None,
        restarts=restart_actions,
        weight=weight if weight is not None and weight != state.weight else None,
    )
    return next_state, actions


def _start_seconds(pods: Sequence[PodEndpoint]) -> float | None:
    """The median time the ready pods took from creation to Ready (None: none says)."""
    seconds = sorted(p.start_s for p in pods if p.start_s is not None)
    return seconds[len(seconds) // 2] if seconds else None


def _holdback_weight(
    snapshot: Snapshot,
    state: ControlState,
    decided: StepState,
    measurement: Measurement,
    fitted: CalibratedModel,
    rolling: bool,
) -> traffic.Split:
    """The holdback's route weight: 0 while no holdback pod is Ready (none held back, or it is
    starting); while one serves, the split the measured speedup of the speculating pods favours
    (traffic.holdback_weight), its even share until both variants were measured, and the weight
    in force while stable pods roll."""
    held_pods = _held_pods(decided, snapshot.replicas)
    if not held_pods or not snapshot.held:
        return traffic.Split(0)  # no holdback, or none Ready: the route must not send it requests
    even = traffic.even_weight(snapshot.replicas - held_pods, held_pods)
    in_force = traffic.Split(state.wanted_weight if state.wanted_weight else even)
    plain = snapshot.plain
    stable_tpot = measurement.tpot_mean_s or measurement.tpot_p50_s
    plain_tpot = None if plain is None or not plain.ok else plain.tpot_mean_s or plain.tpot_p50_s
    if (
        rolling
        or not snapshot.pods
        or not snapshot.held
        or plain is None
        or plain.batch is None
        or plain_tpot is None
        or measurement.batch is None
        or stable_tpot is None
    ):
        return in_force
    return traffic.holdback_weight(
        stable_pods=len(snapshot.pods),
        held_pods=len(snapshot.held),
        stable_batch=measurement.batch,
        stable_tpot_s=stable_tpot,
        plain_batch=plain.batch,
        plain_tpot_s=plain_tpot,
        plain_step_s=lambda batch: fitted.step_s(0, batch),
        margin=snapshot.config.margin,
    )


def _weight_event(
    before: int | None, split: traffic.Split | None, measurement: Measurement, plain: Measurement | None
) -> EventRecord | None:
    """The Event of a holdback weight that moved on a measurement (None: it did not move, or it
    was only set to its even share or released)."""
    if split is None or before is None or split.weight == before or split.speedup is None:
        return None
    where = ""
    if measurement.batch is not None and plain is not None and plain.batch is not None:
        where = f" (speculating pods at batch {measurement.batch:.1f}, the holdback at {plain.batch:.1f})"
    found = f"the speculating pods measured {split.speedup - 1:+.1%} against plain{where}"
    return EventRecord(
        "Warning" if split.weight > before else "Normal",
        Reason.TRAFFIC_MOVED,
        f"{found}: the holdback's route weight moves from {before}% to {split.weight}%",
    )


def due_at(config: StepConfig, state: StepState, now: datetime) -> datetime | None:
    """The first moment after ``now`` at which time alone may change the decision of ``state``: the
    Baseline's end (and its extension while samples are short), the soak's end, the minimum
    interval after the last change. None: only new inputs can."""
    if config.mode == "off" or config.off_reason:
        return None
    since = state.phase_since
    moments: list[datetime] = []
    if state.phase == "Baseline":
        moments.append(since + timedelta(seconds=config.baseline_s))
        if state.baseline.samples < BASELINE_SAMPLES:
            moments.append(since + timedelta(seconds=3 * config.baseline_s))
    elif state.phase == "Fixed":
        moments.append(since + timedelta(seconds=config.soak_s))
    if state.last_change is not None:
        moments.append(state.last_change + timedelta(seconds=config.min_interval_s))
    later = [m for m in moments if m > now]
    return min(later) if later else None


# ------------------------------------------------------------------ helpers


class _Tabled:
    """A calibrated model whose predictions at one (alpha, batch) come from one pass over every
    length 1..top (``CalibratedModel.speedup_table``: the same values as one by one), kept for the
    step: a decision asks for every length at each of 20 bands, and again for the schedules it
    compares and the break-even shown."""

    __slots__ = ("_model", "_rows", "_top")

    def __init__(self, model: CalibratedModel, top: int) -> None:
        self._model, self._top = model, top
        self._rows: dict[tuple[float, float, float | None], tuple[float, ...]] = {}

    def predict_speedup(
        self, alpha: float, draft_length: int, batch: float, context_tokens: float | None = None
    ) -> float:
        if not 1 <= draft_length <= self._top:
            return self._model.predict_speedup(alpha, draft_length, batch, context_tokens)
        key = (alpha, batch, context_tokens)
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = self._model.speedup_table(alpha, batch, 1, self._top, context_tokens)
        return row[draft_length - 1]


class _Confident:
    """A calibrated model's confidence by batch, kept for the step (it depends on the octave only)."""

    __slots__ = ("_model", "_seen")

    def __init__(self, model: CalibratedModel) -> None:
        self._model = model
        self._seen: dict[float, Confidence] = {}

    def confidence(self, batch: float) -> Confidence:
        found = self._seen.get(batch)
        if found is None:
            found = self._seen[batch] = self._model.confidence(batch)
        return found


def _prior_fields(
    snapshot: Snapshot, knowledge: learning.LearningState, learn: learning.LearningConfig
) -> dict[str, object]:
    """Which prior the model starts from; the model source reads `profile` until a sample lands."""
    if snapshot.prior is None:
        return {"prior_source": "roofline", "profile_name": None}
    fields: dict[str, object] = {"prior_source": "profile", "profile_name": snapshot.profile_name}
    if not learn.enabled or knowledge.calibration.weight <= 0:
        fields["model_source"] = "profile"
    return fields


BAND_TOLERANCE = 0.02
"""The speedup "hugs 1" where the best draft length predicts within this of 1."""
BAND_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _break_even_band(model: CalibratedModel, alpha: float, bounds: tuple[int, int]) -> list[int]:
    """[low, high] batches over which the best K's predicted speedup stays within BAND_TOLERANCE of 1,
    when that spans more than a factor 2 (a break-even that is a band, not a batch); else []. Each
    batch's lengths in one pass of the model (``speedup_table``: the same values as one by one)."""
    near = [
        batch
        for batch in BAND_BATCHES
        if abs(max(model.speedup_table(alpha, float(batch), bounds[0], bounds[1])) - 1.0) <= BAND_TOLERANCE
    ]
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
