"""The SpeculativeDeployment's status as a typed document.

Every block the operator writes is a model here, so the CRD (generated from these
models) types all of status and `kubectl explain sdep.status...` documents it. The
operator reads status only with `SpeculativeDeploymentStatus.model_validate` and
writes it only from `model_dump(by_alias=True, mode="json")`: times are datetimes in
Python and RFC 3339 on the wire, latencies are seconds in Python and duration text
("4.99ms") on the wire. Status written by earlier versions of this schema loads as is.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from specops.api.base import ApiModel
from specops.api.units import DurationText, Timestamp

Phase = Literal["Pending", "Baseline", "Fixed", "Dynamic", "Canary", "Degraded", "Invalid"]
ControlPhase = Literal["Baseline", "Fixed", "Dynamic"]
LosslessCheck = Literal["Pending", "Passed", "Failed"]
DraftSource = Literal["Spec", "Retraining"]


class Condition(ApiModel):
    """A standard Kubernetes condition: lastTransitionTime moves only when status flips."""

    type: str = Field(description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="UpperCamelCase reason of the last transition.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="Generation the condition reflects.")


# ---------------------------------------------------------------- control loop


class PodsApplied(ApiModel):
    desired: int = Field(default=0, description="Ready serving pods that should run the current setting.")
    applied: int = Field(default=0, description="Pods confirmed to run it.")


class CalibrationStatistics(ApiModel):
    """Decayed sufficient statistics of the calibration fit (bounded: 31 + 2 x 11 numbers)."""

    xtx: list[float] = Field(
        default_factory=list, max_length=64, description="Upper triangle of X'WX, row-major (21 numbers)."
    )
    xty: list[float] = Field(default_factory=list, max_length=16, description="X'Wy (6 numbers).")
    yty: float = Field(default=0.0, description="y'Wy.")
    weight: float = Field(default=0.0, description="Sum of the decayed sample weights.")
    on_counts: list[float] = Field(
        default_factory=list,
        max_length=16,
        description="Decayed samples with speculation on, per batch octave (1, 2, 4, ... 1024).",
    )
    off_counts: list[float] = Field(
        default_factory=list, max_length=16, description="Decayed samples with speculation off, per octave."
    )
    updated_at: float | None = Field(
        default=None, description="When the statistics were last decayed (seconds since the Unix epoch)."
    )


class BandAnchorStatus(ApiModel):
    """What one batch band measured directly."""

    batch: int = Field(description="Upper edge of the band (running requests per pod).")
    plain_seconds: float | None = Field(default=None, description="Measured plain step, seconds.")
    k: int = Field(default=0, description="Draft length the round below was measured at.")
    round_seconds: float | None = Field(default=None, description="Measured speculative round at k, seconds.")
    k0_seconds: float | None = Field(
        default=None,
        description="Measured per-token latency of a speculating pod at K=0 (plain plus K=0's cost), seconds.",
    )


class CalibrationStatus(ApiModel):
    """What the deployment has learned of its own speedup curve, and how sure it is."""

    model_source: Literal["prior", "calibrated", "profile"] = Field(
        default="prior",
        description="Model the decisions use: prior (the roofline, nothing measured yet), "
        "calibrated (the roofline corrected by this deployment's own measurements), "
        "profile (a measured serving profile).",
    )
    prior_source: Literal["roofline", "profile"] = Field(
        default="roofline",
        description="What the fit starts from: the roofline of the spec, or the serving profile of "
        "spec.speculation.calibration.profile.",
    )
    profile_name: str | None = Field(default=None, description="Name of that serving profile.")
    samples: int = Field(default=0, description="Measurements fitted so far.")
    effective_samples: float | None = Field(
        default=None, description="Samples still weighing after the half-life decay."
    )
    break_even_batch: int | None = Field(
        default=None,
        description="Fitted running requests per pod from which no draft length pays, at the "
        "current alpha; empty when speculation pays up to 1024 (see breakEvenKnown).",
    )
    break_even_known: bool = Field(
        default=False, description="Whether breakEvenBatch was computed (false before the Dynamic phase)."
    )
    prior_break_even_batch: int | None = Field(
        default=None,
        description="The roofline prior's break-even at the same alpha (empty: none up to 1024).",
    )
    announced_break_even_batch: int | None = Field(
        default=None,
        description="Break-even at the last CalibrationMovedBreakEven Event (or the first computed).",
    )
    relative_fit_error: float | None = Field(
        default=None, description="Weighted RMS of the fit's relative residuals over the samples remembered."
    )
    anchors: list[BandAnchorStatus] = Field(
        default_factory=list,
        max_length=32,
        description="Each batch band's direct measurements (they set the curve's level there).",
    )
    break_even_band: list[int] = Field(
        default_factory=list,
        max_length=2,
        description="Where the fitted speedup stays within 2 % of 1 over a range of batches: [low, high] "
        "(then breakEvenBatch is not shown as one number).",
    )
    statistics: CalibrationStatistics = Field(
        default_factory=CalibrationStatistics, description="The fit's persisted sufficient statistics."
    )


class ScheduleBand(ApiModel):
    """One band of a draft-length schedule: batches up to maxBatch draft k tokens."""

    max_batch: int | None = Field(
        default=None, description="Upper edge of the band (running requests per pod); empty: no bound."
    )
    k: int = Field(ge=0, description="Draft length the engine uses in this band (0: no drafting).")


class RevisionStatus(ApiModel):
    """A configuration revision: what a pod runs."""

    digest: str = Field(description="The specops.dev/revision pod label (and specops_revision series label).")
    mode: Literal["plain", "spec"] = Field(
        description="plain: started without speculation; spec: speculating."
    )
    method: str | None = Field(default=None, description="draftModel, eagle3, mtp or ngram.")
    draft: str | None = Field(default=None, description="The draft the pods load (its identity).")
    schedule: list[ScheduleBand] = Field(
        default_factory=list, max_length=32, description="Batch bands to draft length, ascending."
    )
    description: str = Field(default="", description="The revision in words.")


class RolloutStatus(ApiModel):
    """A revision rolling out to the stable pods, pod by pod."""

    target: str = Field(description="Digest of the revision rolling out.")
    started_at: Timestamp = Field(description="When it started.")
    updated: int = Field(default=0, description="Pods running the target revision.")
    ready: int = Field(default=0, description="Of those, ready.")
    replicas: int = Field(default=0, description="Pods wanted.")


class HoldbackStatus(ApiModel):
    pods: int = Field(default=1, ge=1, description="Pods running plain (the holdback Deployment's).")
    since: Timestamp | None = Field(default=None, description="When the holdback began.")
    cost: float | None = Field(
        default=None,
        ge=0,
        description="Predicted per-token latency the fleet gives up while holding back, as a fraction "
        "of what it would be with every pod speculating: (predicted speedup - 1) x pods / replicas.",
    )
    weight: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="Percent of the traffic the holdback pods carry: the HTTPRoute weight of the holdback "
        "Service, moved every interval toward the faster pods; behind the shared Service, their even share.",
    )


class SpeculationStatus(ApiModel):
    state: Literal["on", "off"] = Field(
        default="off", description="Whether the stable pods run a speculating revision."
    )
    draft_length: int = Field(
        default=0, description="Largest draft length of the schedule in force (0: plain)."
    )
    schedule: str | None = Field(default=None, description="The schedule in force, in words.")
    revision: RevisionStatus | None = Field(default=None, description="The revision the stable pods run.")
    proposed: RevisionStatus | None = Field(
        default=None, description="The revision the learned curve favours (may equal the one in force)."
    )
    predicted_gain: float | None = Field(
        default=None, description="Predicted gain of the proposed revision over the one in force."
    )
    reason: str | None = Field(default=None, description="Reason of the last decision.")
    message: str | None = Field(default=None, description="Why a change was or was not made.")
    predicted_speedup: float | None = Field(
        default=None, description="Modelled speedup over plain of the revision in force, on the batches seen."
    )
    measured_speedup: float | None = Field(default=None, description="Baseline p50 TPOT / current p50 TPOT.")
    smoothed_alpha: float | None = Field(default=None, description="Smoothed alpha the model used.")
    control_phase: ControlPhase | None = Field(
        default=None,
        description="Baseline (plain pods, measuring), Fixed (the first speculating revision soaks), then "
        "Dynamic (revisions follow the learned curve).",
    )
    phase_since: Timestamp | None = Field(default=None, description="When the current control phase began.")
    last_change_time: Timestamp | None = Field(default=None, description="When the last revision rolled out.")
    last_decision_time: Timestamp | None = Field(default=None, description="Last decision.")
    pods: PodsApplied = Field(
        default_factory=PodsApplied, description="Stable pods on the revision in force."
    )
    rollout: RolloutStatus | None = Field(default=None, description="The revision rolling out now.")
    k0_cost: float | None = Field(
        default=None,
        description="Measured per-token cost of K=0 inside a speculating engine against plain (empty: "
        "not measured yet; 0.05 is assumed).",
    )
    batch_seconds: list[float] = Field(
        default_factory=list,
        max_length=32,
        description="Decayed seconds the pods spent per batch band (the load a revision is judged on).",
    )
    calibration: CalibrationStatus = Field(
        default_factory=CalibrationStatus, description="The learned speedup model and its confidence."
    )
    holdback: HoldbackStatus | None = Field(
        default=None,
        description="One pod held back plain beside the speculating ones, measuring plain speed where "
        "the load is (empty: none).",
    )
    acceptance_collapses: int = Field(
        default=0,
        ge=0,
        description="Stable pods found accepting nothing while their neighbours on the same draft accepted "
        "normally (AcceptanceCollapsed Events), each deleted so a fresh engine replaced it.",
    )


class BaselineStatus(ApiModel):
    per_token_latency_p50: DurationText | None = Field(default=None, description="Baseline TPOT p50 (off).")
    per_token_latency_p95: DurationText | None = Field(default=None, description="Baseline TPOT p95 (off).")
    per_token_latency_p99: DurationText | None = Field(default=None, description="Baseline TPOT p99 (off).")
    tokens_per_second: float | None = Field(default=None, description="Baseline output tokens per second.")
    samples: int = Field(default=0, description="Measurements averaged.")


class ObservedStatus(ApiModel):
    alpha: float | None = Field(default=None, description="Per-token acceptance alpha.")
    acceptance_rate: float | None = Field(default=None, description="Accepted / drafted tokens.")
    batch: float | None = Field(default=None, description="Running requests per pod.")
    per_token_latency_p99: DurationText | None = Field(default=None, description="Current TPOT p99.")
    request_rate: float | None = Field(default=None, description="Completed requests per second.")
    at: Timestamp | None = Field(default=None, description="Time of the measurement.")


# ---------------------------------------------------------------- drafts


class DraftStatus(ApiModel):
    model: str | None = Field(default=None, description="Draft model name.")
    version: str | None = Field(default=None, description="Its version.")
    method: str | None = Field(default=None, description="How it drafts (draftModel, eagle3, mtp, ngram).")
    kind: str | None = Field(default=None, description="Its kind (standalone, expertDistilled).")
    parameters: str | None = Field(default=None, description="Its parameter count.")
    uri: str | None = Field(default=None, description="Where its checkpoint lives.")
    source: DraftSource | None = Field(default=None, description="Where it came from: Spec or Retraining.")
    lossless_check: LosslessCheck | None = Field(
        default=None,
        description="The golden-prompt check of this draft: Pending (speculation stays off until it ran), "
        "Passed, or Failed (speculation stays off). A promoted canary passed it; unset on drafts "
        "recorded before the check existed.",
    )
    lossless_attempts: int | None = Field(
        default=None,
        description="While the first draft's check is Pending: tries whose golden prompts could not be "
        "run on a stable pod (errors, timeouts). Each retry waits twice as long as the last.",
    )
    lossless_retry_at: Timestamp | None = Field(
        default=None, description="When the first draft's check is tried again after such a try."
    )


# ---------------------------------------------------------------- canary


class CanaryVariantWindow(ApiModel):
    """One variant's readings in the current step, summarised: no raw samples, a few hundred bytes."""

    samples: int = Field(
        default=0, description="Readings counted in this step (from the variant's first good read on)."
    )
    failed: int = Field(default=0, description="Of those, reads that failed.")
    last_ok: bool = Field(default=True, description="Whether the latest read succeeded.")
    alpha: float | None = Field(default=None, description="Median per-token acceptance alpha of the step.")
    p99: DurationText | None = Field(default=None, description="Median of the per-interval TPOT p99.")
    alpha_bins: str = Field(
        default="",
        max_length=1024,
        description="Acceptance readings as `value*count` bins, ascending (`*1` left out), at most 32 "
        "bins (the two closest merge past that): what the Mann-Whitney test runs on.",
    )
    p99_bins: str = Field(
        default="", max_length=1024, description="TPOT p99 readings (seconds), as alphaBins."
    )
    p50_bins: str = Field(
        default="", max_length=1024, description="TPOT p50 readings (seconds), as alphaBins."
    )


class CanaryWindow(ApiModel):
    """The step's evidence so far, per variant (bounded: status never holds raw samples)."""

    stable: CanaryVariantWindow = Field(
        default_factory=CanaryVariantWindow, description="The stable variant's readings."
    )
    canary: CanaryVariantWindow = Field(
        default_factory=CanaryVariantWindow, description="The canary variant's readings."
    )


class CanaryCounters(ApiModel):
    failures: int = Field(
        default=0, description="Failed analyses so far (limit: canary.analysis.failureLimit)."
    )
    inconclusives: int = Field(
        default=0, description="Inconclusive analyses so far (limit: canary.analysis.inconclusiveLimit)."
    )
    consecutive_errors: int = Field(
        default=0,
        description="Analyses in a row without metrics (limit: canary.analysis.consecutiveErrorLimit).",
    )


class CanaryAnalysisStatus(ApiModel):
    verdict: Literal["Pass", "Fail", "Inconclusive", "Error"] = Field(description="Outcome of the analysis.")
    reason: str = Field(default="", description="What the outcome led to (UpperCamelCase).")
    p_value: float | None = Field(
        default=None,
        description="One-sided Mann-Whitney p-value of 'canary acceptance is lower than stable' (against "
        "plain stable pods: of 'canary per-token latency is higher').",
    )
    p_within_tolerance: float | None = Field(
        default=None,
        description="One-sided p-value of 'canary acceptance is above stable's less the tolerance' "
        "(the non-inferiority test).",
    )
    canary_alpha: float | None = Field(default=None, description="Median alpha of the canary window.")
    stable_alpha: float | None = Field(default=None, description="Median alpha of the stable window.")
    summary: str = Field(default="", description="The evidence in one sentence.")
    at: Timestamp | None = Field(default=None, description="When the analysis ran.")


class CanaryStatus(ApiModel):
    """A canary of a new draft in progress; cleared when it is promoted or rolled back."""

    phase: Literal["LosslessCheck", "Progressing", "Promoting"] = Field(
        description="LosslessCheck (no traffic yet), Progressing (stepped traffic and analysis), "
        "Promoting (stable rolls onto the new draft)."
    )
    source: DraftSource = Field(default="Spec", description="Why it runs: a spec.draft change or retraining.")
    draft: DraftStatus = Field(default_factory=DraftStatus, description="The draft under test.")
    started_at: Timestamp = Field(description="When the canary started.")
    step: int = Field(default=-1, description="Index into spec.canary.steps (-1 before the first step).")
    weight: int = Field(default=0, description="Canary share of traffic in percent, as achieved.")
    requested_weight: int | None = Field(default=None, description="The step's weight as asked for.")
    step_started_at: Timestamp | None = Field(default=None, description="When this step's bake began.")
    traffic_started_at: Timestamp | None = Field(
        default=None,
        description="When the canary's pods began to serve traffic: samples start a full rate window later.",
    )
    traffic_routing: Literal["GatewayAPI", "ReplicaRatio"] = Field(
        default="ReplicaRatio",
        description="How traffic is split: Gateway API backend weights, or replicas behind the shared Service.",
    )
    counters: CanaryCounters = Field(default_factory=CanaryCounters, description="Analysis outcomes counted.")
    lossless_attempts: int = Field(default=0, description="Tries of the golden prompts that could not run.")
    lossless_check: Literal["Passed"] | None = Field(default=None, description="Passed once the gate passed.")
    window: CanaryWindow = Field(
        default_factory=CanaryWindow, description="This step's readings of both variants, summarised."
    )
    judge_at: Timestamp | None = Field(
        default=None,
        description="When this step is judged: its bake's end (later while the window is still too thin, "
        "or after a hold).",
    )
    next_weight: int | None = Field(
        default=None, description="Canary weight of the next step once this one passes (100: promotion)."
    )
    last_analysis: CanaryAnalysisStatus | None = Field(default=None, description="The latest analysis.")
    paused: bool = Field(default=False, description="Held by the specops.dev/canary-paused annotation.")
    promotion_evidence: str | None = Field(default=None, description="Why it is being promoted.")
    replaces: DraftStatus | None = Field(
        default=None,
        description="While Promoting: the stable draft the promotion replaces, served again if spec.draft "
        "stops naming the canary's draft before the promotion ends.",
    )


class LastCanaryStatus(ApiModel):
    draft: str = Field(description="Version of the draft the canary tested.")
    result: Literal["Promoted", "RolledBack", "Superseded"] = Field(
        description="How it ended; Superseded: spec.draft stopped naming its draft, so it was stopped "
        "unpromoted (and its draft not rejected)."
    )
    reason: str = Field(default="", description="Why (UpperCamelCase).")
    evidence: str = Field(default="", description="The evidence, at most 500 characters.")


# ---------------------------------------------------------------- retraining


class ActiveRoundStatus(ApiModel):
    """The round whose Job runs now: enough to find the Job again after a restart."""

    job_name: str = Field(description="Name of the training object.")
    api_version: str = Field(default="batch/v1", description="Its apiVersion.")
    kind: str = Field(default="Job", description="Its kind (Job, JobSet, TrainJob, PyTorchJob).")
    reason: Literal["TargetVersionChanged", "AcceptanceBelowSLO"] = Field(description="What started it.")
    round: int = Field(default=0, description="Round number.")
    target_version: str = Field(default="", description="Target version it trains for.")
    output_version: str = Field(default="", description="Version the trained draft will carry.")
    started_at: Timestamp = Field(description="When it started.")


class TrainedDraftStatus(ApiModel):
    """A draft a finished round published, waiting for its canary (or for a person)."""

    draft_version: str = Field(description="Version of the trained draft.")
    checkpoint_uri: str = Field(description="Where its checkpoint lives.")
    target_version: str = Field(default="", description="Target version it was trained for.")
    metrics: dict[str, float] = Field(default_factory=dict, description="Numbers the trainer reported.")


class RetrainingStatus(ApiModel):
    draft_target_version: str | None = Field(
        default=None, description="Target version the draft in service was trained or validated for."
    )
    rounds: int = Field(default=0, description="Rounds started so far; numbers the next round and its Job.")
    active: ActiveRoundStatus | None = Field(default=None, description="The round running now.")
    trained: TrainedDraftStatus | None = Field(default=None, description="A trained draft not yet canaried.")
    last_finished_at: Timestamp | None = Field(default=None, description="When the last round ended.")
    last_result: Literal["Succeeded", "Failed", "Superseded"] | None = Field(
        default=None,
        description="How it ended; Superseded: the target changed while it ran, so it was stopped "
        "(not a failure) and a round for the new target started.",
    )
    last_message: str = Field(default="", description="Its outcome in one sentence.")
    consecutive_failures: int = Field(default=0, description="Failed rounds in a row for the same setup.")
    failure_key: str | None = Field(
        default=None,
        description="Digest of the setup (target, draft, spec.retraining) those failures count for.",
    )
    alpha_below_since: Timestamp | None = Field(
        default=None, description="Since when acceptance has stayed below slo.minAcceptance."
    )


# ---------------------------------------------------------------- the whole document


class SpeculativeDeploymentStatus(ApiModel):
    observed_generation: int | None = Field(default=None, description="Generation last reconciled.")
    phase: Phase | None = Field(default=None, description="Where the resource is in its lifecycle.")
    endpoint: str | None = Field(
        default=None,
        description="The in-cluster URL clients call (the shared Service on the engine's API port).",
    )
    draft: DraftStatus = Field(default_factory=DraftStatus, description="Draft serving the stable variant.")
    spec_draft: str | None = Field(
        default=None,
        description="spec.draft's version and where it stands: `v4` (it serves), `v4 canary` (its canary "
        "runs), `v4 rejected` (a canary rolled it back; status.draft serves) or `v4 pending`.",
    )
    previous_draft: DraftStatus | None = Field(
        default=None,
        description="The draft that served before status.draft, recorded when a canary promoted it "
        "(`kubectl specops undo` sets spec.draft back to it).",
    )
    observed_spec_draft: str | None = Field(
        default=None,
        description="The spec.draft (version@uri) the operator last acted on; a change starts a canary.",
    )
    last_canary: LastCanaryStatus | None = Field(
        default=None, description="Outcome of the last finished canary."
    )
    rejected_draft: str | None = Field(
        default=None,
        description="The last draft (version@uri) a canary rolled back; not retried until it changes.",
    )
    speculation: SpeculationStatus = Field(
        default_factory=SpeculationStatus, description="Control loop state."
    )
    baseline: BaselineStatus = Field(
        default_factory=BaselineStatus, description="Baseline without speculation."
    )
    observed: ObservedStatus = Field(default_factory=ObservedStatus, description="Latest measurement.")
    canary: CanaryStatus | None = Field(default=None, description="Canary progress.")
    retraining: RetrainingStatus | None = Field(default=None, description="Retraining progress.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.")

    def to_wire(self) -> dict[str, Any]:
        """The JSON form written to the status subresource (unset fields left out)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)

    @classmethod
    def from_wire(cls, data: Any) -> SpeculativeDeploymentStatus:
        """Status as read from the API server; a missing status is the empty document."""
        return cls.model_validate(data or {})
