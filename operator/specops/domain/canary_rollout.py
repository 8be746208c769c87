"""The canary of a new draft as a pure step: this tick's inputs in, the next state and actions out.

One call advances a canary by at most one step (like Argo Rollouts' reconcile of a
canary step). The caller gathers the inputs (golden-prompt results, this tick's samples,
whether the stable variant rolled out), calls `step`, runs the actions in order and
writes the next status. When an action fails the caller keeps the previous state, so the
same step is tried again at the next tick and status never claims what did not happen.

1. Start: spec.draft changed (or retraining produced a draft) -> canary pods with the new
   draft, held out of traffic.
2. LosslessCheck: golden prompts at temperature 0 on a canary pod and a reference pod; any difference
   rolls back with NotLossless before the canary ever receives traffic.
3. Progressing: each step sets the canary weight, collects one sample per tick and
   variant, and after the step's pause asks `domain.canary.analyse` / `next_action`.
   Samples start only once the canary's pods have served traffic for a full rate window
   (`CanaryInputs.warm_up_s`): before that the window still holds the time they served
   nothing, and back-to-back canaries would share what the previous one left in it. The
   first step's pause counts from the end of the warm-up.
4. Promoting: all traffic to the canary, the stable variant re-rendered with the new draft
   (status.draft), and once it has rolled, traffic back to stable and canary objects removed.
   Rollback: traffic to stable, canary objects removed, the draft remembered as rejected.

A spec.draft that stops naming the running canary's draft (an edit or a revert mid-canary)
supersedes the canary at any phase, as an Argo Rollouts abort does: it is never promoted and its
draft is not rejected. A revert to the stable draft only ends it (while Promoting, the stable
variant rolls back onto the draft it served); any other draft starts its own canary from the
stable in the same tick, unless a canary rejected it before. A retraining candidate's canary is
superseded the same way by any spec.draft edit; the candidate stays waiting for a later canary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from specops.api import conditions as cond
from specops.api.conditions import ConditionUpdate, Reason
from specops.api.models import DraftSpec, SpeculativeDeploymentSpec
from specops.api.status import (
    CanaryAnalysisStatus,
    CanaryCounters,
    CanaryStatus,
    CanaryWindow,
    DraftSource,
    LastCanaryStatus,
    SpeculativeDeploymentStatus,
)
from specops.api.units import parse_duration
from specops.domain import canary as judgement
from specops.domain import canary_window, drafts
from specops.domain.lifecycle import EventRecord

MIN_SAMPLES = judgement.DEFAULT_MIN_SAMPLES
MAX_BAKE_FACTOR = 4.0
"""A step whose window is still too thin after max(factor x pause, extension) is judged anyway."""
MIN_BAKE_EXTENSION_S = 60.0
LOSSLESS_ATTEMPTS = 10
"""Tries of golden prompts that could not run (pods answering errors) before the canary gives up."""
FIRST_CHECK_WARN_AFTER = 3
"""Tries of the first draft's check that could not run before a condition and a Warning say so."""
FIRST_CHECK_MAX_BACKOFF_S = 600.0
"""The first draft's check never gives up (speculation has no other way on), but it retries at
most this far apart: every try is golden prompts on a pod that is failing."""

TrafficRouting = Literal["GatewayAPI", "ReplicaRatio"]


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class LosslessPassed:
    """Every golden prompt gave the reference pod's text (within the allowed divergence)."""


@dataclass(frozen=True)
class LosslessDiffers:
    evidence: str


@dataclass(frozen=True)
class LosslessUnrunnable:
    message: str


LosslessOutcome = LosslessPassed | LosslessDiffers | LosslessUnrunnable


@dataclass(frozen=True)
class CanaryInputs:
    """What the caller gathered for this tick; fields a phase does not use stay at their defaults."""

    spec: SpeculativeDeploymentSpec
    status: SpeculativeDeploymentStatus
    now: datetime
    routing: TrafficRouting = "ReplicaRatio"
    """How a new canary splits traffic (the canary keeps the mode it started with)."""
    achievable: Callable[[int], int] = lambda weight: weight
    """The weight the router can really give for a requested one (replica ratio rounds)."""
    candidate: DraftSpec | None = None
    """A trained draft waiting for its canary."""
    paused: bool = False
    action: Literal["promote", "abort", "retry"] | None = None
    lossless: LosslessOutcome | None = None
    """None while the canary pods are not ready to answer. With no canary and a stable draft whose
    check is pending (a resource's first draft), the outcome on a stable pod of that draft."""
    stable_sample: judgement.Sample | None = None
    canary_sample: judgement.Sample | None = None
    stable_rolled_out: bool = False
    canary_missing: bool = False
    """The canary's serving objects are gone (a rollback whose status write was lost, a person)."""
    warm_up_s: float = 0.0
    """The metrics' rate window: samples are taken once the canary pods served traffic this long."""


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class ApplyCanary:
    """Create or update the canary variant's objects (one replica; the router scales it)."""

    draft: DraftSpec
    receives_traffic: bool


@dataclass(frozen=True)
class SetWeight:
    """Send `weight` % of traffic to the canary (0 takes it out of the route)."""

    weight: int


@dataclass(frozen=True)
class RolloutStable:
    """Re-render the stable variant with `draft` (after status.draft records it)."""

    draft: DraftSpec


@dataclass(frozen=True)
class DeleteCanary:
    """Remove the canary variant's objects."""


@dataclass(frozen=True)
class ClearAction:
    """Remove the one-shot specops.dev/canary-action annotation."""


Action = ApplyCanary | SetWeight | RolloutStable | DeleteCanary | ClearAction


@dataclass(frozen=True)
class CanaryStep:
    """The next status, the actions to get there (in order), and what to tell people."""

    status: SpeculativeDeploymentStatus
    actions: tuple[Action, ...] = ()
    after_write: tuple[Action, ...] = ()
    """Actions that must wait until the next status is written (they read it)."""
    updates: tuple[ConditionUpdate, ...] = ()
    events: tuple[EventRecord, ...] = ()
    finished: Literal["Promoted", "RolledBack"] | None = None
    source: DraftSource | None = None
    evidence: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.actions or self.after_write or self.updates or self.events)


def _draft(canary: CanaryStatus, spec: SpeculativeDeploymentSpec) -> DraftSpec:
    return drafts.draft_from_status(canary.draft, spec.draft)


# ---------------------------------------------------------------- the step


def step(inputs: CanaryInputs) -> CanaryStep:
    """Advance the canary of one resource by at most one step."""
    status = inputs.status
    canary = status.canary
    if inputs.action == "retry":
        return _retry(inputs)
    if canary is None:
        if inputs.action is not None:  # promote or abort with no canary to act on: never kept for the next
            ignored = step(replace(inputs, action=None))
            message = f"specops.dev/canary-action: {inputs.action} ignored and removed: no canary runs"
            return replace(
                ignored,
                actions=(*ignored.actions, ClearAction()),
                events=(*ignored.events, EventRecord("Warning", Reason.CANARY_ACTION_IGNORED, message)),
            )
        if status.draft.lossless_check == "Pending":
            return _first_draft_check(inputs)
        return _maybe_start(inputs)
    if superseded(inputs.spec, status):
        ended = _supersede(inputs, canary)
        return replace(ended, actions=(*ended.actions, ClearAction())) if inputs.action else ended
    if inputs.action == "abort":
        ended = _rollback(inputs, canary, Reason.CANARY_ABORTED, "aborted by specops.dev/canary-action")
        return replace(ended, actions=(*ended.actions, ClearAction()))
    if inputs.action == "promote":
        ended = _start_promotion(inputs, canary, "promoted by specops.dev/canary-action")
        return replace(ended, actions=(*ended.actions, ClearAction()))
    if inputs.paused:
        return CanaryStep(_with(status, replace_canary(canary, paused=True)))
    if canary.paused:
        canary = replace_canary(canary, paused=False)
    if canary.phase == "LosslessCheck":
        return _lossless_check(inputs, canary)
    if canary.phase == "Progressing":
        return _progress(inputs, canary)
    return _finish_promotion(inputs, canary)


def _retry(inputs: CanaryInputs) -> CanaryStep:
    """specops.dev/canary-action: retry. When spec.draft names the draft a canary rolled back and no
    canary runs, its canary starts again (the rejection is forgotten); otherwise the tick goes on as
    without the annotation. Either way the annotation is removed once acted on."""
    status, spec = inputs.status, inputs.spec
    plain = replace(inputs, action=None)
    if spec_draft_rejected(spec, status) and status.draft.lossless_check != "Pending":
        started = _start(
            replace(plain, status=status.model_copy(update={"rejected_draft": None})),
            spec.draft,
            "Spec",
            "started again by specops.dev/canary-action: retry",
        )
    else:
        started = step(plain)
    return replace(started, actions=(*started.actions, ClearAction()))


def spec_draft_rejected(spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus) -> bool:
    """spec.draft names the draft a canary rolled back, and another draft serves (no canary runs)."""
    spec_key = drafts.draft_key(spec.draft)
    return (
        status.canary is None
        and status.rejected_draft == spec_key
        and spec_key != drafts.draft_key(drafts.stable_draft(spec.draft, status))
    )


def spec_draft_condition(
    spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus
) -> ConditionUpdate:
    """DraftRejected: True while spec.draft names a draft a canary rolled back, so another draft serves."""
    wanted = spec.draft.version
    serving = drafts.stable_draft(spec.draft, status).version
    if spec_draft_rejected(spec, status):
        last = status.last_canary
        why = f" ({last.reason})" if last is not None and last.draft == wanted and last.reason else ""
        return ConditionUpdate(
            cond.DRAFT_REJECTED,
            "True",
            Reason.SPEC_DRAFT_REJECTED,
            f"spec.draft names draft {wanted}, which a canary rolled back{why}; draft {serving} serves. "
            f"`kubectl specops retry` runs its canary again, `kubectl specops undo` sets spec.draft back "
            f"to {serving}",
        )
    if _spec_draft_serves(spec, status):
        return ConditionUpdate(
            cond.DRAFT_REJECTED, "False", Reason.SPEC_DRAFT_SERVING, f"draft {wanted} (spec.draft) serves"
        )
    return ConditionUpdate(
        cond.DRAFT_REJECTED,
        "False",
        Reason.SPEC_DRAFT_PENDING,
        f"spec.draft names draft {wanted}; draft {serving} serves until a canary promotes it",
    )


def _spec_draft_serves(spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus) -> bool:
    return drafts.draft_key(spec.draft) == drafts.draft_key(drafts.stable_draft(spec.draft, status))


def spec_draft_text(spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus) -> str:
    """status.specDraft: spec.draft's version and where it stands (the SpecDraft printer column)."""
    version = spec.draft.version
    if spec_draft_rejected(spec, status):
        return f"{version} rejected"
    if _spec_draft_serves(spec, status):
        return version
    canary = status.canary
    if canary is not None and canary.source == "Spec" and not superseded(spec, status):
        return f"{version} canary"
    return f"{version} pending"


def superseded(spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus) -> bool:
    """Whether spec.draft no longer names what the running canary was started for.

    A spec canary tests spec.draft itself; a retraining candidate's canary started while spec.draft
    named the stable draft (status.observedSpecDraft), so any edit since supersedes it. A promotion
    recorded without the draft it replaces (by an older operator) is left to finish.
    """
    canary = status.canary
    if canary is None or (canary.phase == "Promoting" and canary.replaces is None):
        return False
    spec_key = drafts.draft_key(spec.draft)
    if canary.source == "Spec":
        return spec_key != drafts.draft_key(_draft(canary, spec))
    return status.observed_spec_draft is not None and spec_key != status.observed_spec_draft


def _supersede(inputs: CanaryInputs, canary: CanaryStatus) -> CanaryStep:
    """End a canary spec.draft no longer names: out of traffic and removed, never promoted, not rejected.

    Then the spec's draft is acted on from the stable draft as if no canary had run: nothing more
    when it is the stable draft (or a rejected one), else its own canary starts in this tick.
    """
    status, spec = inputs.status, inputs.spec
    old = _draft(canary, spec)
    promoting = canary.phase == "Promoting" and canary.replaces is not None
    stable_status = canary.replaces if promoting and canary.replaces is not None else status.draft
    stable = drafts.draft_from_status(stable_status, spec.draft)
    spec_key = drafts.draft_key(spec.draft)
    new = spec.draft.version
    if spec_key == drafts.draft_key(stable):
        why = f"spec.draft names the stable draft {new} again"
    elif spec_key == status.rejected_draft:
        why = f"spec.draft names draft {new}, which an earlier canary rolled back; it is not tried again"
    else:
        why = f"spec.draft names draft {new}, whose canary starts from the stable draft {stable.version}"
    message = (
        f"canary of draft {old.version} ({canary.source.lower()}) superseded: {why}; draft {old.version} "
        "is not promoted"
    )[:1000]
    ended = _with(
        status,
        None,
        draft=stable_status,
        last_canary=LastCanaryStatus(
            draft=old.version, result="Superseded", reason=Reason.CANARY_SUPERSEDED, evidence=message[:500]
        ),
    )
    # A retraining candidate waits for the next tick: the spec's draft goes first.
    started = _maybe_start(replace(inputs, status=ended, candidate=None))
    return CanaryStep(
        started.status.model_copy(update={"observed_spec_draft": spec_key}),
        actions=(SetWeight(0), DeleteCanary(), *started.actions),
        # While Promoting, the stable variant had begun to roll onto the superseded draft: back.
        after_write=((RolloutStable(stable),) if promoting else ()) + started.after_write,
        updates=(
            ConditionUpdate(cond.CANARY_ROLLOUT, "False", Reason.CANARY_SUPERSEDED, message),
            *started.updates,
        ),
        events=(EventRecord("Normal", Reason.CANARY_SUPERSEDED, message), *started.events),
        source=canary.source,
        evidence=message,
    )


def replace_canary(canary: CanaryStatus, **changes: object) -> CanaryStatus:
    return canary.model_copy(update=changes)


def _with(
    status: SpeculativeDeploymentStatus, canary: CanaryStatus | None, **changes: object
) -> SpeculativeDeploymentStatus:
    return status.model_copy(update={"canary": canary, **changes})


def _maybe_start(inputs: CanaryInputs) -> CanaryStep:
    status, spec = inputs.status, inputs.spec
    spec_key = drafts.draft_key(spec.draft)
    draft: DraftSpec
    source: DraftSource
    spec_changed = status.observed_spec_draft not in (None, spec_key)
    if spec_changed and spec_key == drafts.draft_key(drafts.stable_draft(spec.draft, status)):
        # spec.draft names the draft serving now (a revert): nothing to canary
        return CanaryStep(_with(status, None, observed_spec_draft=spec_key))
    if spec_changed and spec_key != status.rejected_draft:
        draft, source = spec.draft, "Spec"
    elif inputs.candidate is not None and drafts.draft_key(inputs.candidate) != status.rejected_draft:
        draft, source = inputs.candidate, "Retraining"
    else:
        return CanaryStep(status)
    return _start(inputs, draft, source)


def _start(inputs: CanaryInputs, draft: DraftSpec, source: DraftSource, why: str = "started") -> CanaryStep:
    status, spec_key = inputs.status, drafts.draft_key(inputs.spec.draft)
    if status.draft.lossless_check == "Failed":
        return _replace_failed_draft(inputs, draft, source)
    canary = CanaryStatus(
        phase="LosslessCheck",
        source=source,
        draft=drafts.draft_to_status(draft, source),
        started_at=inputs.now,
        traffic_routing=inputs.routing,
    )
    changes: dict[str, object] = {"observed_spec_draft": spec_key} if source == "Spec" else {}
    message = f"canary of draft {draft.version} ({source.lower()}) {why}: lossless check before any traffic"
    return CanaryStep(
        _with(status, canary, **changes),
        actions=(ApplyCanary(draft, receives_traffic=False),),
        updates=(ConditionUpdate(cond.CANARY_ROLLOUT, "True", Reason.CANARY_STARTED, message),),
        events=(EventRecord("Normal", Reason.CANARY_STARTED, message),),
    )


def _first_draft_check(inputs: CanaryInputs) -> CanaryStep:
    """The first draft of a resource (created, or deleted and created again) has no canary: its
    golden prompts run on a stable pod, and speculation stays off until they pass."""
    status = inputs.status
    outcome = inputs.lossless
    version = status.draft.version
    if outcome is None:
        return CanaryStep(status)  # no stable pod of this draft ready (or the retry is not due): next tick
    if isinstance(outcome, LosslessUnrunnable):
        return _first_check_unrunnable(inputs, outcome)
    if isinstance(outcome, LosslessDiffers):
        failed = status.draft.model_copy(update={"lossless_check": "Failed"})
        message = (
            f"draft {version} is not lossless: {outcome.evidence}; speculation stays off until "
            "spec.draft names another draft"
        )[:1000]
        return CanaryStep(
            _with(status, None, draft=failed),
            updates=(ConditionUpdate(cond.CANARY_ROLLOUT, "False", Reason.NOT_LOSSLESS, message),),
            events=(EventRecord("Warning", Reason.NOT_LOSSLESS, message),),
        )
    passed = status.draft.model_copy(
        update={"lossless_check": "Passed", "lossless_attempts": None, "lossless_retry_at": None}
    )
    message = (
        f"draft {version}: golden prompts at temperature 0 match the reference pod's; speculation may go on"
    )
    return CanaryStep(
        _with(status, None, draft=passed),
        updates=(ConditionUpdate(cond.CANARY_ROLLOUT, "False", Reason.LOSSLESS_CHECK_PASSED, message),)
        if status.draft.lossless_attempts
        else (),
        events=(EventRecord("Normal", Reason.LOSSLESS_CHECK_PASSED, message),),
    )


def first_check_due(status: SpeculativeDeploymentStatus, now: datetime) -> bool:
    """Whether the first draft's check runs this tick: it is pending and no retry wait is running."""
    retry_at = status.draft.lossless_retry_at
    return status.draft.lossless_check == "Pending" and (retry_at is None or now >= retry_at)


def _first_check_unrunnable(inputs: CanaryInputs, outcome: LosslessUnrunnable) -> CanaryStep:
    """The golden prompts could not run on the stable pod: retried after 1, 2, 4 ... intervals (up
    to FIRST_CHECK_MAX_BACKOFF_S); from the FIRST_CHECK_WARN_AFTER-th try a condition says why."""
    status = inputs.status
    attempts = (status.draft.lossless_attempts or 0) + 1
    interval_s = parse_duration(inputs.spec.metrics.interval)
    wait_s = min(interval_s * 2.0 ** (attempts - 1), max(FIRST_CHECK_MAX_BACKOFF_S, interval_s))
    draft = status.draft.model_copy(
        update={"lossless_attempts": attempts, "lossless_retry_at": inputs.now + timedelta(seconds=wait_s)}
    )
    if attempts < FIRST_CHECK_WARN_AFTER:
        return CanaryStep(_with(status, None, draft=draft))
    message = (
        f"the golden prompts of draft {status.draft.version} could not be run on a stable pod "
        f"({attempts} tries): {outcome.message}; speculation stays off, next try in {wait_s:g} s"
    )[:1000]
    update = ConditionUpdate(cond.CANARY_ROLLOUT, "False", Reason.LOSSLESS_CHECK_UNRUNNABLE, message)
    events = (EventRecord("Warning", Reason.LOSSLESS_CHECK_UNRUNNABLE, message),)
    return CanaryStep(
        _with(status, None, draft=draft),
        updates=(update,),
        events=events if attempts == FIRST_CHECK_WARN_AFTER else (),
    )


def _replace_failed_draft(inputs: CanaryInputs, draft: DraftSpec, source: DraftSource) -> CanaryStep:
    """The stable draft failed its check and never speculated: nothing to compare a canary with.
    The new draft takes its place on the stable pods, and is checked there in turn."""
    status, spec = inputs.status, inputs.spec
    changes: dict[str, object] = (
        {"observed_spec_draft": drafts.draft_key(spec.draft)} if source == "Spec" else {}
    )
    replaced = drafts.draft_to_status(draft, source, lossless_check="Pending")
    message = (
        f"draft {draft.version} replaces draft {status.draft.version}, which is not lossless and never "
        "served speculation; it is checked on the stable pods before speculation goes on"
    )
    return CanaryStep(
        _with(status, None, draft=replaced, **changes),
        after_write=(RolloutStable(draft),),
        updates=(ConditionUpdate(cond.CANARY_ROLLOUT, "False", Reason.DRAFT_REPLACED, message),),
        events=(EventRecord("Normal", Reason.DRAFT_REPLACED, message),),
        # In service now, as after a promotion: retraining records a trained draft as current.
        finished="Promoted",
        source=source,
        evidence=message,
    )


def _lossless_check(inputs: CanaryInputs, canary: CanaryStatus) -> CanaryStep:
    outcome = inputs.lossless
    if outcome is None and inputs.canary_missing:
        # Render the canary again rather than wait for pods that will never come.
        draft = _draft(canary, inputs.spec)
        return CanaryStep(_with(inputs.status, canary), actions=(ApplyCanary(draft, receives_traffic=False),))
    if outcome is None:
        return CanaryStep(_with(inputs.status, canary))  # canary pods still starting
    if isinstance(outcome, LosslessUnrunnable):
        attempts = canary.lossless_attempts + 1
        if attempts >= LOSSLESS_ATTEMPTS:
            return _rollback(
                inputs,
                canary,
                Reason.LOSSLESS_CHECK_FAILED,
                f"golden prompts could not be run: {outcome.message}",
            )
        return CanaryStep(_with(inputs.status, replace_canary(canary, lossless_attempts=attempts)))
    if isinstance(outcome, LosslessDiffers):
        return _rollback(inputs, canary, Reason.NOT_LOSSLESS, outcome.evidence)
    canary = replace_canary(
        canary, phase="Progressing", lossless_check="Passed", traffic_started_at=inputs.now
    )
    entered = _enter_step(inputs, canary, 0)
    return replace(
        entered,
        actions=(ApplyCanary(_draft(canary, inputs.spec), receives_traffic=True), *entered.actions),
        events=(
            EventRecord(
                "Normal",
                Reason.LOSSLESS_CHECK_PASSED,
                "golden prompts at temperature 0 match the reference pod's",
            ),
            *entered.events,
        ),
    )


def _enter_step(inputs: CanaryInputs, canary: CanaryStatus, index: int) -> CanaryStep:
    steps = inputs.spec.canary.steps
    weight = steps[index].weight
    achieved = inputs.achievable(weight)
    canary = replace_canary(
        canary,
        step=index,
        weight=achieved,
        requested_weight=weight,
        step_started_at=inputs.now,
        window=CanaryWindow(),
    )
    canary = replace_canary(
        canary, judge_at=_judge_at(inputs, canary), next_weight=_next_weight(inputs, index)
    )
    text = f"step {index + 1}/{len(steps)}: canary weight {achieved}% ({canary.traffic_routing})"
    events = [EventRecord("Normal", Reason.CANARY_STEP_STARTED, text)]
    if achieved != weight:
        replicas = inputs.spec.serving.replicas
        text += f", {weight}% requested"
        events.append(
            EventRecord(
                "Warning",
                Reason.CANARY_WEIGHT_ROUNDED,
                f"step {index + 1}/{len(steps)} asks {weight}% of traffic for the canary; "
                f"{canary.traffic_routing} gives {achieved}% with {replicas} stable "
                f"{'replica' if replicas == 1 else 'replicas'} (a canary pod takes its share of "
                "requests); Gateway API routing (spec.canary.trafficRouting.gatewayAPI) or more "
                "replicas give finer weights",
            )
        )
    return CanaryStep(
        _with(inputs.status, canary),
        actions=(SetWeight(weight),),
        updates=(ConditionUpdate(cond.CANARY_ROLLOUT, "True", Reason.CANARY_PROGRESSING, text),),
        events=tuple(events),
    )


def _next_weight(inputs: CanaryInputs, index: int) -> int:
    """The next step's weight once step `index` passes; 100 when passing it promotes."""
    steps = inputs.spec.canary.steps
    return 100 if index + 1 >= len(steps) else min(100, steps[index + 1].weight)


def _judge_at(inputs: CanaryInputs, canary: CanaryStatus) -> datetime | None:
    """When the step's bake ends: its pause after the step started (or after the warm-up, if later)."""
    if canary.step < 0 or canary.step_started_at is None:
        return None
    pause_s = parse_duration(inputs.spec.canary.steps[canary.step].pause)
    started = canary.step_started_at
    warmed_at = _warmed_at(canary, inputs)
    if warmed_at is not None:
        started = max(started, warmed_at)
    return started + timedelta(seconds=pause_s)


def _sampled(canary: CanaryStatus, inputs: CanaryInputs) -> CanaryStatus:
    window = canary_window.record(canary.window, inputs.stable_sample, inputs.canary_sample)
    return replace_canary(canary, window=window)


def _progress(inputs: CanaryInputs, canary: CanaryStatus) -> CanaryStep:
    spec, now = inputs.spec, inputs.now
    if inputs.canary_missing:
        # Its objects are gone: bring them back at the step's weight; the bake goes on.
        draft = _draft(canary, spec)
        weight = canary.requested_weight if canary.requested_weight is not None else canary.weight
        # New pods: their warm-up starts again (what the old pods of this draft measured still counts).
        canary = replace_canary(canary, traffic_started_at=now)
        canary = replace_canary(canary, judge_at=_judge_at(inputs, canary))
        return CanaryStep(
            _with(inputs.status, canary),
            actions=(ApplyCanary(draft, receives_traffic=True), SetWeight(weight)),
        )
    index = max(0, canary.step)
    if canary.next_weight is None:  # a canary written before these fields existed
        canary = replace_canary(canary, next_weight=_next_weight(inputs, index))
    warmed_at = _warmed_at(canary, inputs)
    if warmed_at is not None and now < warmed_at:
        return CanaryStep(_with(inputs.status, replace_canary(canary, judge_at=_judge_at(inputs, canary))))
    canary = _sampled(canary, inputs)
    pause_s = parse_duration(spec.canary.steps[index].pause)
    bake_started = canary.step_started_at or now
    if warmed_at is not None:
        bake_started = max(bake_started, warmed_at)
    elapsed_s = (now - bake_started).total_seconds()
    canary = replace_canary(canary, judge_at=bake_started + timedelta(seconds=pause_s))
    if elapsed_s < pause_s:
        return CanaryStep(_with(inputs.status, canary))
    canary_window_, stable_window = canary.window.canary, canary.window.stable
    healthy_now = bool(
        canary_window_.samples and canary_window_.last_ok and stable_window.samples and stable_window.last_ok
    )
    bake_limit_s = max(MAX_BAKE_FACTOR * pause_s, MIN_BAKE_EXTENSION_S)
    if (
        healthy_now
        and min(canary_window.usable(canary_window_), canary_window.usable(stable_window)) < MIN_SAMPLES
        and elapsed_s < bake_limit_s
    ):
        # New canary pods are scraped a few intervals late: bake on rather than judge thin evidence.
        extended = bake_started + timedelta(seconds=bake_limit_s)
        return CanaryStep(_with(inputs.status, replace_canary(canary, judge_at=extended)))

    slo = parse_duration(spec.slo.per_token_latency_p99) if spec.slo.per_token_latency_p99 else None
    verdict, evidence = judgement.analyse_windows(
        canary_window.analysis_window(canary_window_),
        canary_window.analysis_window(stable_window),
        confidence=spec.canary.analysis.confidence,
        slo_p99_s=slo,
        baseline_p50_s=inputs.status.baseline.per_token_latency_p50,
    )
    counters = judgement.CanaryCounters(
        failures=canary.counters.failures,
        inconclusives=canary.counters.inconclusives,
        consecutive_errors=canary.counters.consecutive_errors,
    )
    action, counters, reason = judgement.next_action(verdict, counters, spec.canary.analysis)
    canary = replace_canary(
        canary,
        counters=CanaryCounters(
            failures=counters.failures,
            inconclusives=counters.inconclusives,
            consecutive_errors=counters.consecutive_errors,
        ),
        last_analysis=CanaryAnalysisStatus(
            verdict=verdict.value,
            reason=reason,
            p_value=None if evidence.p_value is None else round(evidence.p_value, 4),
            p_within_tolerance=None if evidence.p_non_inferior is None else round(evidence.p_non_inferior, 4),
            canary_alpha=evidence.canary_alpha,
            stable_alpha=evidence.stable_alpha,
            summary=evidence.summary,
            at=now,
        ),
    )
    if action == "rollback":
        return _rollback(inputs, canary, reason, evidence.summary)
    if action == "advance":
        steps = spec.canary.steps
        # The last step, or a 100 % step (nothing left to compare against), ends in promotion.
        if index + 1 >= len(steps) or steps[index + 1].weight >= 100:
            return _start_promotion(inputs, canary, evidence.summary)
        entered = _enter_step(inputs, canary, index + 1)
        return replace(entered, events=(EventRecord("Normal", reason, evidence.summary), *entered.events))
    update = ConditionUpdate(cond.CANARY_ROLLOUT, "True", reason, evidence.summary)
    if action == "hold":
        canary = replace_canary(canary, step_started_at=now, window=CanaryWindow())
        canary = replace_canary(canary, judge_at=now + timedelta(seconds=pause_s))
        return CanaryStep(
            _with(inputs.status, canary),
            updates=(update,),
            events=(EventRecord("Warning", reason, evidence.summary),),
        )
    # pause: metrics unavailable; judge again next tick, never advance or roll back
    return CanaryStep(_with(inputs.status, canary), updates=(update,))


def _start_promotion(inputs: CanaryInputs, canary: CanaryStatus, evidence: str) -> CanaryStep:
    draft = _draft(canary, inputs.spec)
    canary = replace_canary(
        canary, phase="Promoting", weight=100, promotion_evidence=evidence, replaces=inputs.status.draft
    )
    return CanaryStep(
        _with(
            inputs.status, canary, draft=drafts.draft_to_status(draft, canary.source, lossless_check="Passed")
        ),
        actions=(SetWeight(100),),
        after_write=(RolloutStable(draft),),
        updates=(
            ConditionUpdate(
                cond.CANARY_ROLLOUT,
                "True",
                Reason.CANARY_PROMOTING,
                f"rolling stable onto draft {draft.version}",
            ),
        ),
    )


def _finish_promotion(inputs: CanaryInputs, canary: CanaryStatus) -> CanaryStep:
    draft = _draft(canary, inputs.spec)
    if not inputs.stable_rolled_out:
        # Rendering the stable variant again is idempotent; it also repairs a lost write.
        return CanaryStep(_with(inputs.status, canary), actions=(RolloutStable(draft),))
    message = f"draft {draft.version} promoted: {canary.promotion_evidence or ''}".strip()
    previous = canary.replaces if canary.replaces is not None else inputs.status.previous_draft
    return CanaryStep(
        _with(inputs.status, None, previous_draft=previous),
        actions=(SetWeight(0), DeleteCanary()),
        updates=(ConditionUpdate(cond.CANARY_ROLLOUT, "False", Reason.CANARY_PROMOTED, message),),
        events=(EventRecord("Normal", Reason.CANARY_PROMOTED, message),),
        finished="Promoted",
        source=canary.source,
        evidence=message,
    )


def _rollback(inputs: CanaryInputs, canary: CanaryStatus, reason: str, evidence: str) -> CanaryStep:
    draft = _draft(canary, inputs.spec)
    message = f"draft {draft.version} rolled back ({reason}): {evidence}"
    status = _with(
        inputs.status,
        None,
        rejected_draft=drafts.draft_key(draft),
        last_canary=LastCanaryStatus(
            draft=draft.version, result="RolledBack", reason=reason, evidence=evidence[:500]
        ),
    )
    return CanaryStep(
        status,
        actions=(SetWeight(0), DeleteCanary()),
        updates=(ConditionUpdate(cond.CANARY_ROLLOUT, "False", Reason.CANARY_ROLLED_BACK, message[:1000]),),
        events=(EventRecord("Warning", Reason.CANARY_ROLLED_BACK, message[:1000]),),
        finished="RolledBack",
        source=canary.source,
        evidence=message,
    )


def _warmed_at(canary: CanaryStatus, inputs: CanaryInputs) -> datetime | None:
    """When the canary's pods will have served traffic for a full rate window (None: not known)."""
    if canary.traffic_started_at is None:
        return None
    return canary.traffic_started_at + timedelta(seconds=inputs.warm_up_s)
