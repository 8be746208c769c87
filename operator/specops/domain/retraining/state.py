"""Retraining rounds: the state kept in status.retraining, triggers and backoff, round transitions, conditions.

A round is one training run that produces a new draft for the target version in
service. It starts when the target's version changes (the draft is then stale) or
when acceptance stays below ``slo.minAcceptance`` for ``triggers.acceptanceBelowSLO.for``
(at most once per ``cooldown``). Only one round runs at a time; a failed round is
retried after an exponential, capped backoff, and after ``MAX_CONSECUTIVE_FAILURES``
failures of the same setup specops stops until that setup (target version, draft or
spec.retraining) changes, so a broken template never becomes a Job factory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from specops.api.conditions import DRAFT_STALE, RETRAINING, ConditionUpdate, Reason, format_time
from specops.api.models import SpeculativeDeploymentSpec
from specops.api.status import ActiveRoundStatus, RetrainingStatus, TrainedDraftStatus
from specops.api.units import parse_duration
from specops.domain.retraining.naming import (
    ACCEPTANCE_BELOW_SLO,
    BACKOFF_BASE_S,
    BACKOFF_CAP_S,
    MAX_CONSECUTIVE_FAILURES,
    TARGET_VERSION_CHANGED,
    TriggerReason,
    output_version,
)

# ---------------------------------------------------------------- state kept in status.retraining


@dataclass(frozen=True)
class ActiveRound:
    """The round whose Job runs now; enough to find the Job again after a restart."""

    job_name: str
    api_version: str
    kind: str
    reason: TriggerReason
    round_number: int
    target_version: str
    output_version: str
    started_at: datetime


@dataclass(frozen=True)
class TrainedDraft:
    """A draft a finished round published, waiting for its canary (or for a person)."""

    draft_version: str
    checkpoint_uri: str
    target_version: str
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RetrainingState:
    """Everything about retraining the operator must remember, as kept in status.retraining."""

    draft_target_version: str | None = None
    """Target version the draft in service was trained or validated for."""
    rounds: int = 0
    """Rounds started so far; numbers the next round and its Job name."""
    active: ActiveRound | None = None
    trained: TrainedDraft | None = None
    last_finished_at: datetime | None = None
    last_result: Literal["Succeeded", "Failed", "Superseded"] | None = None
    last_message: str = ""
    consecutive_failures: int = 0
    failure_key: str | None = None
    """Setup digest (``setup_key``) the consecutive failures were counted for."""
    alpha_below_since: datetime | None = None

    @classmethod
    def from_status(cls, status: RetrainingStatus | None, *, default_target_version: str) -> RetrainingState:
        """The state kept in status.retraining; a resource seen for the first time adopts its draft as current."""
        data = status or RetrainingStatus()
        active = data.active
        trained = data.trained
        return cls(
            draft_target_version=data.draft_target_version or default_target_version,
            rounds=data.rounds,
            active=None
            if active is None
            else ActiveRound(
                job_name=active.job_name,
                api_version=active.api_version,
                kind=active.kind,
                reason=active.reason,
                round_number=active.round,
                target_version=active.target_version,
                output_version=active.output_version,
                started_at=active.started_at,
            ),
            trained=None
            if trained is None
            else TrainedDraft(
                draft_version=trained.draft_version,
                checkpoint_uri=trained.checkpoint_uri,
                target_version=trained.target_version,
                metrics=dict(trained.metrics),
            ),
            last_finished_at=data.last_finished_at,
            last_result=data.last_result,
            last_message=data.last_message,
            consecutive_failures=data.consecutive_failures,
            failure_key=data.failure_key,
            alpha_below_since=data.alpha_below_since,
        )

    def to_status(self) -> RetrainingStatus:
        """The typed status.retraining block."""
        active = self.active
        trained = self.trained
        return RetrainingStatus(
            draft_target_version=self.draft_target_version,
            rounds=self.rounds,
            active=None
            if active is None
            else ActiveRoundStatus(
                job_name=active.job_name,
                api_version=active.api_version,
                kind=active.kind,
                reason=active.reason,
                round=active.round_number,
                target_version=active.target_version,
                output_version=active.output_version,
                started_at=active.started_at,
            ),
            trained=None
            if trained is None
            else TrainedDraftStatus(
                draft_version=trained.draft_version,
                checkpoint_uri=trained.checkpoint_uri,
                target_version=trained.target_version,
                metrics=dict(trained.metrics),
            ),
            last_finished_at=self.last_finished_at,
            last_result=self.last_result,
            last_message=self.last_message,
            consecutive_failures=self.consecutive_failures,
            failure_key=self.failure_key,
            alpha_below_since=self.alpha_below_since,
        )


def setup_key(spec: SpeculativeDeploymentSpec) -> str:
    """Digest of what a round trains with; failures are only counted against the same setup."""
    setup = {
        "target": spec.target.version,
        "draft": spec.draft.model_dump(mode="json", by_alias=True),
        "retraining": spec.retraining.model_dump(mode="json", by_alias=True),
    }
    return hashlib.sha256(json.dumps(setup, sort_keys=True).encode("utf-8")).hexdigest()[:16]


# ---------------------------------------------------------------- trigger decision


@dataclass(frozen=True)
class Trigger:
    """A round to start now."""

    reason: TriggerReason
    target_version: str
    round_number: int
    output_version: str
    message: str


def draft_stale(spec: SpeculativeDeploymentSpec, state: RetrainingState) -> bool:
    """The draft in service was trained for another target version than the one serving now."""
    return state.draft_target_version is not None and state.draft_target_version != spec.target.version


def backoff_seconds(consecutive_failures: int) -> float:
    """Wait before the next attempt: 10 min, 20 min, 40 min ... capped at 12 h."""
    if consecutive_failures <= 0:
        return 0.0
    return min(BACKOFF_BASE_S * 2.0 ** (consecutive_failures - 1), BACKOFF_CAP_S)


def _failures_for(spec: SpeculativeDeploymentSpec, state: RetrainingState) -> int:
    return state.consecutive_failures if state.failure_key == setup_key(spec) else 0


def observe_acceptance(
    state: RetrainingState, alpha: float | None, min_acceptance: float, now: datetime
) -> RetrainingState:
    """Track since when alpha has stayed below the SLO; no measurement resets the clock."""
    if alpha is None or alpha >= min_acceptance:
        return replace(state, alpha_below_since=None) if state.alpha_below_since else state
    if state.alpha_below_since is None:
        return replace(state, alpha_below_since=now)
    return state


def retraining_trigger(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, *, now: datetime
) -> Trigger | None:
    """The round to start now, or None.

    Order of the rules: disabled, a round running, a trained draft still waiting for
    its canary, failures (backoff, then give up) all say no; then a stale draft starts
    a round (no cooldown: the draft no longer matches its target), then acceptance
    below the SLO for ``for`` starts one if ``cooldown`` has passed since the last round.
    """
    retraining = spec.retraining
    if not retraining.enabled or state.active is not None:
        return None
    if state.trained is not None and state.trained.target_version == spec.target.version:
        return None
    failures = _failures_for(spec, state)
    if failures >= MAX_CONSECUTIVE_FAILURES:
        return None
    since_last = None if state.last_finished_at is None else (now - state.last_finished_at).total_seconds()
    if failures and since_last is not None and since_last < backoff_seconds(failures):
        return None
    round_number = state.rounds + 1
    version = output_version(spec.draft.version, spec.target.version, round_number)
    if draft_stale(spec, state) and retraining.triggers.target_version_change:
        return Trigger(
            TARGET_VERSION_CHANGED,
            spec.target.version,
            round_number,
            version,
            f"target version changed from {state.draft_target_version} to {spec.target.version}",
        )
    acceptance = retraining.triggers.acceptance_below_slo
    if acceptance is None or state.alpha_below_since is None:
        return None
    below_for = (now - state.alpha_below_since).total_seconds()
    if below_for < parse_duration(acceptance.for_):
        return None
    if since_last is not None and since_last < parse_duration(acceptance.cooldown):
        return None
    return Trigger(
        ACCEPTANCE_BELOW_SLO,
        spec.target.version,
        round_number,
        version,
        f"acceptance below {spec.slo.min_acceptance:g} for {below_for / 60:.0f} min",
    )


# ---------------------------------------------------------------- round transitions


def start_round(
    state: RetrainingState, trigger: Trigger, manifest: Mapping[str, Any], now: datetime
) -> RetrainingState:
    """Record the round whose rendered ``manifest`` is being created."""
    return replace(
        state,
        rounds=trigger.round_number,
        active=ActiveRound(
            job_name=str(manifest["metadata"]["name"]),
            api_version=str(manifest["apiVersion"]),
            kind=str(manifest["kind"]),
            reason=trigger.reason,
            round_number=trigger.round_number,
            target_version=trigger.target_version,
            output_version=trigger.output_version,
            started_at=now,
        ),
    )


@dataclass(frozen=True)
class Running:
    message: str = ""


@dataclass(frozen=True)
class Succeeded:
    draft_version: str
    checkpoint_uri: str
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Failed:
    message: str


Outcome = Running | Succeeded | Failed


def finish_round(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, outcome: Succeeded | Failed, now: datetime
) -> RetrainingState:
    """Close the active round: keep the trained draft for its canary, or count the failure."""
    active = state.active
    if active is None:
        return state
    if isinstance(outcome, Succeeded):
        return replace(
            state,
            active=None,
            trained=TrainedDraft(
                outcome.draft_version, outcome.checkpoint_uri, active.target_version, outcome.metrics
            ),
            last_finished_at=now,
            last_result="Succeeded",
            last_message=f"round {active.round_number} trained draft {outcome.draft_version}",
            consecutive_failures=0,
            failure_key=None,
            alpha_below_since=None,
        )
    return _count_failure(
        spec, replace(state, active=None), f"round {active.round_number}: {outcome.message}", now
    )


def _count_failure(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, message: str, now: datetime
) -> RetrainingState:
    key = setup_key(spec)
    return replace(
        state,
        last_finished_at=now,
        last_result="Failed",
        last_message=message,
        consecutive_failures=_failures_for(spec, state) + 1,
        failure_key=key,
    )


def superseded(spec: SpeculativeDeploymentSpec, state: RetrainingState) -> bool:
    """Whether the running round trains for a target version the spec no longer names, while a
    target change starts a round of its own: its draft would be stale on arrival, and waiting for
    it (GPU hours) only delays the round that matters."""
    active = state.active
    return (
        active is not None
        and active.target_version != spec.target.version
        and spec.retraining.enabled
        and spec.retraining.triggers.target_version_change
    )


def supersede_round(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, now: datetime
) -> RetrainingState:
    """Close the running round as superseded by the spec's target version: not a failure (no
    backoff, the failure count stands), and the round for the new target may start at once."""
    active = state.active
    if active is None:
        return state
    return replace(
        state,
        active=None,
        last_finished_at=now,
        last_result="Superseded",
        last_message=(
            f"round {active.round_number} trained for target {active.target_version}, superseded by "
            f"{spec.target.version}"
        ),
    )


def draft_to_canary(spec: SpeculativeDeploymentSpec, state: RetrainingState) -> TrainedDraft | None:
    """The trained draft to roll out behind a canary now (autoCanary, and trained for this target)."""
    trained = state.trained
    if not spec.retraining.auto_canary or trained is None or state.active is not None:
        return None
    return trained if trained.target_version == spec.target.version else None


def accept_trained_draft(state: RetrainingState, target_version: str) -> RetrainingState:
    """A draft validated for ``target_version`` now serves (canary promoted): it is current again."""
    return replace(state, draft_target_version=target_version, trained=None, alpha_below_since=None)


def reject_trained_draft(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, message: str, now: datetime
) -> RetrainingState:
    """The trained draft's canary rolled back: a failed round, subject to backoff like any other."""
    return _count_failure(
        spec, replace(state, trained=None), f"canary rejected the trained draft: {message}", now
    )


# ---------------------------------------------------------------- conditions


def retraining_conditions(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, now: datetime
) -> tuple[ConditionUpdate, ...]:
    """DraftStale and Retraining conditions from the state (Retraining only when enabled)."""
    stale = draft_stale(spec, state)
    conditions = [
        ConditionUpdate(
            DRAFT_STALE,
            "True" if stale else "False",
            TARGET_VERSION_CHANGED if stale else Reason.DRAFT_CURRENT,
            f"draft {spec.draft.version} was trained for target version {state.draft_target_version}, "
            f"serving {spec.target.version}"
            if stale
            else f"draft {spec.draft.version} matches target version {spec.target.version}",
        )
    ]
    if spec.retraining.enabled:
        conditions.append(_retraining_condition(spec, state, now))
    return tuple(conditions)


def _retraining_condition(
    spec: SpeculativeDeploymentSpec, state: RetrainingState, now: datetime
) -> ConditionUpdate:
    if state.active is not None:
        active = state.active
        return ConditionUpdate(
            RETRAINING,
            "True",
            Reason.RETRAINING_STARTED,
            f"round {active.round_number} ({active.reason}) runs in {active.kind} {active.job_name}",
        )
    if state.trained is not None:
        return ConditionUpdate(
            RETRAINING,
            "False",
            Reason.RETRAINING_SUCCEEDED,
            f"trained draft {state.trained.draft_version} is ready",
        )
    failures = _failures_for(spec, state)
    if failures >= MAX_CONSECUTIVE_FAILURES:
        return ConditionUpdate(
            RETRAINING,
            "False",
            Reason.RETRAINING_GAVE_UP,
            f"{failures} rounds failed in a row; change spec.retraining, the draft or the target to retry. "
            f"Last: {state.last_message}",
        )
    if failures and state.last_finished_at is not None:
        retry_at = state.last_finished_at + timedelta(seconds=backoff_seconds(failures))
        if retry_at > now:
            return ConditionUpdate(
                RETRAINING,
                "False",
                Reason.RETRAINING_BACKOFF,
                f"{state.last_message}; next attempt not before {format_time(retry_at)}",
            )
    if state.last_result == "Failed":
        return ConditionUpdate(RETRAINING, "False", Reason.RETRAINING_FAILED, state.last_message)
    return ConditionUpdate(RETRAINING, "False", Reason.RETRAINING_IDLE, "no round running")
