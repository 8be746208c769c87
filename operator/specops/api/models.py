"""The SpeculativeDeployment resource: pydantic models of spec and status.

These models are the single source of the API. `make crds` generates the CRD's
structural openAPIV3Schema from them (descriptions, defaults, enums, bounds and
the CEL rules attached below), and the operator validates every body it reads
with the same models, so a resource that slipped past an older CRD still gets a
clear `InvalidSpec` condition instead of a crash.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from specops.api.base import ApiModel, cel_rules, immutable
from specops.api.status import SpeculativeDeploymentStatus
from specops.api.units import (
    DURATION_MAX_LENGTH,
    DURATION_PATTERN,
    PARAMETERS_PATTERN,
    parse_duration,
    parse_parameters,
)

GROUP = "specops.dev"
VERSION = "v1alpha1"
KIND = "SpeculativeDeployment"
PLURAL = "speculativedeployments"
SINGULAR = "speculativedeployment"
SHORT_NAMES = ["sdep"]
API_VERSION = f"{GROUP}/{VERSION}"

CHECKPOINT_URI_PATTERN = r"^((pvc|s3|gs)://\S+|hf://[^\s@]+/[^\s@]+@[^\s@]+)$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_ENGINE_DRAFT_LEN = 16
"""The longest draft any supported engine is started with here (SGLang captures a CUDA graph per
step count; TensorRT-LLM and vLLM size buffers by it): docs/serving.md."""
BACKENDS = ("triton", "trtllm-serve", "vllm", "sglang")

Parameters = Annotated[str, Field(pattern=PARAMETERS_PATTERN, max_length=32)]

RESOURCE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""metadata.name: a DNS-1123 subdomain. Every such name yields valid child names (domain/names.py)."""
RESOURCE_NAME_MAX = 253
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
"""A Kubernetes label value (keys are checked when the pods render: a CEL rule over map keys is costly)."""
DATA_URI_PATTERN = r"^(s3|gs|pvc|file|https|hf)://[^\s]+$"
TEMPLATE_KINDS = (
    ("batch/v1", "Job"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
    ("kubeflow.org/v1", "PyTorchJob"),
)
"""The training kinds specops creates and reads (domain/retraining/jobs.py SUPPORTED_KINDS)."""


def _duration_within(minimum: str, maximum: str) -> Any:
    low, high = parse_duration(minimum), parse_duration(maximum)

    def check(value: str) -> str:
        seconds = parse_duration(value)
        if not low <= seconds <= high:
            raise ValueError(f"{value!r} must be between {minimum} and {maximum}")
        return value

    return AfterValidator(check)


def _duration_field(minimum: str, maximum: str) -> Any:
    """Schema of a duration between ``minimum`` and ``maximum`` (inclusive); the model checks the same.

    The CEL rule uses Kubernetes' ``duration()``, which reads the same forms ("90s", "1h30m", "250ms").
    """
    rule = f"duration(self) >= duration('{minimum}') && duration(self) <= duration('{maximum}')"
    return Field(
        pattern=DURATION_PATTERN,
        max_length=DURATION_MAX_LENGTH,
        json_schema_extra=cel_rules((rule, f"must be between {minimum} and {maximum}")),
    )


# Bounds of every duration (docs/api.md lists them and says why).
Interval = Annotated[str, _duration_field("1s", "1h"), _duration_within("1s", "1h")]
PhaseDuration = Annotated[str, _duration_field("0s", "24h"), _duration_within("0s", "24h")]
DwellDuration = Annotated[str, _duration_field("0s", "24h"), _duration_within("0s", "24h")]
PauseDuration = Annotated[str, _duration_field("0s", "24h"), _duration_within("0s", "24h")]
LatencyObjective = Annotated[str, _duration_field("1ms", "1m"), _duration_within("1ms", "1m")]
TriggerDuration = Annotated[str, _duration_field("1m", "168h"), _duration_within("1m", "168h")]
CooldownDuration = Annotated[str, _duration_field("0s", "720h"), _duration_within("0s", "720h")]
ProbeSpacingDuration = Annotated[str, _duration_field("0s", "24h"), _duration_within("0s", "24h")]
HalfLifeDuration = Annotated[str, _duration_field("1m", "168h"), _duration_within("1m", "168h")]


# ---------------------------------------------------------------- target / draft


def _checkpoint_uri(value: str) -> str:
    if not re.fullmatch(CHECKPOINT_URI_PATTERN, value):
        raise ValueError(
            f"{value!r}: must be pvc://CLAIM/PATH, s3://..., gs://... or hf://ORG/NAME@REVISION "
            "(a revision is required for hf://)"
        )
    return value


CheckpointUri = Annotated[
    str,
    AfterValidator(_checkpoint_uri),
    Field(max_length=1024, json_schema_extra={"pattern": CHECKPOINT_URI_PATTERN}),
]


def when_present(rule: str, *paths: str) -> str:
    """``rule`` checked only when every field on ``paths`` is set: a missing required field is
    reported once, by its own "Required value", not again by each rule that reads it."""
    guards: list[str] = []
    for path in paths:
        parts = path.split(".")
        for end in range(2, len(parts) + 1):
            guard = f"!has({'.'.join(parts[:end])})"
            if guard not in guards:
                guards.append(guard)
    return " || ".join([*guards, f"({rule})"])


def parameters_cel(path: str) -> str:
    """CEL that reads a parameter count ("70B", "1.5B", "500M", "70e9") as a number."""
    scaled = " : ".join(
        f"{path}.endsWith('{suffix}') ? double({path}.substring(0, size({path}) - 1)) * {factor}"
        for suffix, factor in (("K", "1e3"), ("M", "1e6"), ("B", "1e9"), ("T", "1e12"))
    )
    return f"({scaled} : double({path}))"


class TargetSpec(ApiModel):
    model: str = Field(
        min_length=1,
        max_length=253,
        description="Name of the target model; fixed for the life of the resource.",
        json_schema_extra=immutable("target.model is immutable: create a new SpeculativeDeployment"),
    )
    version: str = Field(
        min_length=1,
        max_length=63,
        description="Version of the target. A change marks the draft stale and, with retraining enabled, "
        "starts a draft retraining round.",
    )
    architecture: Literal["dense", "moe"] = Field(
        default="dense",
        description="dense or moe (mixture of experts). A MoE target works best with an expert-distilled draft.",
        json_schema_extra=immutable("target.architecture is immutable"),
    )
    parameters: Parameters = Field(
        description='Total parameter count, e.g. "70B" or "70e9"; feeds the performance model.',
    )
    active_parameters: Parameters | None = Field(
        default=None,
        description='MoE only: parameters active per token, e.g. "22B". Defaults to parameters.',
    )
    precision: Literal["bf16", "fp16", "fp8", "int8", "int4"] = Field(
        default="bf16", description="Weight precision of the target's weights (bytes per parameter)."
    )
    uri: CheckpointUri = Field(
        description="The target's checkpoint (Hugging Face format): pvc://CLAIM/PATH is mounted read-only; "
        "s3://, gs:// and hf://ORG/NAME@REVISION are copied in by serving.checkpointFetcherImage.",
    )

    @property
    def parameter_count(self) -> float:
        return parse_parameters(self.parameters)

    @property
    def active_parameter_count(self) -> float:
        if self.active_parameters is None:
            return self.parameter_count
        return parse_parameters(self.active_parameters)


class DraftSpec(ApiModel):
    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!(self.method == 'mtp' || self.method == 'ngram') || !has(self.uri)",
                "mtp and ngram load no draft checkpoint: remove draft.uri",
                ".uri",
            ),
            (
                "!(self.method == 'draftModel' || self.method == 'eagle3') || has(self.uri)",
                "draftModel and eagle3 need the draft checkpoint in draft.uri",
                ".uri",
            ),
            (
                "self.method != 'draftModel' || has(self.parameters)",
                "a draftModel needs its parameter count (draft.parameters) for the performance model",
                ".parameters",
            ),
        )
    )

    model: str = Field(min_length=1, max_length=253, description="Name of the draft model.")
    version: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Version of the draft. A change rolls the new draft out behind a canary.",
    )
    method: Literal["draftModel", "eagle3", "mtp", "ngram"] = Field(
        default="draftModel",
        description="draftModel: a separate small model; eagle3: an EAGLE-3 checkpoint; mtp: the target's own "
        "multi-token-prediction heads (no draft checkpoint); ngram: prompt lookup (no model).",
    )
    kind: Literal["standalone", "expertDistilled"] = Field(
        default="standalone",
        description="standalone: a small model of the same family; expertDistilled: distilled from a MoE "
        "target's expert routing (a draftModel or eagle3 checkpoint).",
    )
    parameters: Parameters | None = Field(
        default=None,
        description='Draft parameter count, e.g. "1B"; required for draftModel. eagle3 defaults to a '
        "single decoder layer's share of the target, mtp and ngram to none.",
    )
    uri: CheckpointUri | None = Field(
        default=None,
        description="The draft's checkpoint (draftModel, eagle3); same schemes as target.uri. mtp and ngram "
        "take none.",
    )

    @model_validator(mode="after")
    def _method_fields(self) -> DraftSpec:
        if self.method in ("mtp", "ngram") and self.uri is not None:
            raise ValueError("draft.uri: mtp and ngram load no draft checkpoint: remove draft.uri")
        if self.method in ("draftModel", "eagle3") and self.uri is None:
            raise ValueError("draft.uri: draftModel and eagle3 need the draft checkpoint in draft.uri")
        if self.method == "draftModel" and self.parameters is None:
            raise ValueError("draft.parameters: a draftModel needs its parameter count")
        return self

    def parameter_count_for(self, target_active_parameters: float) -> float:
        """The draft's parameters as the performance model sees them: draft.parameters when given;
        else about one decoder layer of the target for eagle3 and mtp (1/64), and none for ngram."""
        if self.parameters is not None:
            return parse_parameters(self.parameters)
        if self.method == "ngram":
            return 0.0
        return target_active_parameters / 64.0


# ---------------------------------------------------------------- serving


class GpuSpec(ApiModel):
    type: Literal["H100", "H200", "A100", "L40S", "B200"] = Field(
        default="H100", description="Accelerator type per replica; feeds the roofline performance model."
    )
    count: int = Field(default=1, ge=1, le=16, description="GPUs per replica (nvidia.com/gpu request).")


QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
"""Kubernetes' resource.Quantity, as its own CRDs spell it."""


def _quantity(value: int | str) -> int | str:
    if isinstance(value, str) and not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} is not a quantity (e.g. 500m, 4, 16Gi)")
    return value


GPU_RESOURCE_NAME = "nvidia.com/gpu"

Quantity = Annotated[
    int | str,
    AfterValidator(_quantity),
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]


class ServingResources(ApiModel):
    """core/v1 ResourceRequirements without GPUs (serving.gpu.count sets nvidia.com/gpu)."""

    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!has(self.requests) || !('nvidia.com/gpu' in self.requests)",
                "set GPUs with serving.gpu.count, not serving.resources",
                ".requests",
            ),
            (
                "!has(self.limits) || !('nvidia.com/gpu' in self.limits)",
                "set GPUs with serving.gpu.count, not serving.resources",
                ".limits",
            ),
        )
    )

    requests: dict[str, Quantity] | None = Field(
        default=None,
        max_length=16,
        description='Requests of the engine container besides GPUs, e.g. {cpu: "8", memory: 64Gi}.',
    )
    limits: dict[str, Quantity] | None = Field(
        default=None, max_length=16, description="Limits of the engine container besides GPUs."
    )

    @model_validator(mode="after")
    def _no_gpus(self) -> ServingResources:
        if GPU_RESOURCE_NAME in (self.requests or {}) or GPU_RESOURCE_NAME in (self.limits or {}):
            raise ValueError("serving.resources: set GPUs with serving.gpu.count, not serving.resources")
        return self


class Toleration(ApiModel):
    """core/v1 Toleration."""

    key: str | None = Field(
        default=None, max_length=317, description="Taint key; empty with Exists: all taints."
    )
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value (Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; empty: every effect."
    )
    toleration_seconds: int | None = Field(
        default=None, description="NoExecute only: how long the pod stays bound after the taint appears."
    )


ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"


class KeySelector(ApiModel):
    """core/v1 SecretKeySelector / ConfigMapKeySelector."""

    name: str = Field(
        pattern=DNS_LABEL_PATTERN, max_length=253, description="Name of the Secret or ConfigMap."
    )
    key: str = Field(min_length=1, max_length=253, description="The key to read.")
    optional: bool | None = Field(
        default=None, description="Whether the Secret/ConfigMap or key may be absent."
    )


class FieldSelector(ApiModel):
    field_path: str = Field(min_length=1, max_length=256, description="Pod field, e.g. status.podIP.")


class EnvVarSource(ApiModel):
    """core/v1 EnvVarSource: exactly one of its fields."""

    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            (
                "(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0)"
                " + (has(self.fieldRef) ? 1 : 0) == 1",
                "set exactly one of secretKeyRef, configMapKeyRef, fieldRef",
            ),
        )
    )

    secret_key_ref: KeySelector | None = Field(
        default=None, description="A key of a Secret (never read by specops)."
    )
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: FieldSelector | None = Field(default=None, description="A field of the pod.")

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        if (
            sum(ref is not None for ref in (self.secret_key_ref, self.config_map_key_ref, self.field_ref))
            != 1
        ):
            raise ValueError("valueFrom: set exactly one of secretKeyRef, configMapKeyRef, fieldRef")
        return self


class EnvVar(ApiModel):
    """core/v1 EnvVar."""

    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            ("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both"),
        )
    )

    name: str = Field(pattern=ENV_NAME_PATTERN, max_length=253, description="Variable name.")
    value: str | None = Field(default=None, max_length=32768, description="Literal value.")
    value_from: EnvVarSource | None = Field(
        default=None, description="Value from a Secret, ConfigMap or pod field."
    )

    @model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: set value or valueFrom, not both")
        return self


class VolumeMount(ApiModel):
    """core/v1 VolumeMount (the common fields)."""

    name: str = Field(
        pattern=DNS_LABEL_PATTERN, max_length=63, description="Name of a volume in serving.volumes."
    )
    mount_path: str = Field(
        pattern=r"^/.*$", max_length=4096, description="Where to mount it in the container."
    )
    sub_path: str | None = Field(default=None, max_length=4096, description="Path inside the volume.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")


class LocalObjectReference(ApiModel):
    name: str = Field(pattern=DNS_LABEL_PATTERN, max_length=253, description="Name of the Secret.")


class ServingSpec(ApiModel):
    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            (
                "self.gpu.count % self.tensorParallel == 0",
                "tensorParallel must divide gpu.count",
                ".tensorParallel",
            ),
            (
                "!has(self.maxSurge) || !has(self.maxUnavailable) || self.maxSurge + self.maxUnavailable >= 1",
                "maxSurge and maxUnavailable cannot both be 0: a rollout could never start",
                ".maxUnavailable",
            ),
        )
    )

    backend: Literal["triton", "trtllm-serve", "vllm", "sglang"] = Field(
        default="triton",
        description="Serving engine: triton (Triton with TensorRT-LLM's LLM API model), trtllm-serve, vllm or "
        "sglang. Each starts with its own speculative config and applies the draft-length schedule itself.",
        json_schema_extra=immutable("serving.backend is immutable: create a new SpeculativeDeployment"),
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description="Serving image. Empty: the operator's default for the backend (docs/serving.md).",
    )
    replicas: int = Field(default=1, ge=0, le=1000, description="Serving replicas of the stable variant.")
    gpu: GpuSpec = Field(default_factory=GpuSpec, description="GPUs per replica.")
    tensor_parallel: int = Field(default=1, ge=1, le=16, description="Tensor parallel degree of the engine.")
    max_surge: int = Field(
        default=1,
        ge=0,
        le=100,
        description="Pods started above serving.replicas while a revision rolls out (needs that many spare "
        "replicas' GPUs). With 0, maxUnavailable must be at least 1.",
    )
    max_unavailable: int = Field(
        default=0,
        ge=0,
        le=100,
        description="Serving pods that may be down at once while a revision rolls out; 0 keeps full capacity.",
    )
    checkpoint_fetcher_image: str | None = Field(
        default=None,
        max_length=512,
        description="Image of the init container that copies s3://, gs:// or hf:// checkpoints into the pod "
        "(it runs `fetch-checkpoint SRC DST`). Not needed for pvc:// checkpoints.",
    )
    service_account_name: str | None = Field(
        default=None,
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        description="Service account of the serving pods (e.g. for object-store credentials).",
    )
    resources: ServingResources | None = Field(
        default=None, description="CPU, memory and other resources of the engine container, besides GPUs."
    )
    node_selector: dict[str, LabelValue] | None = Field(
        default=None, max_length=32, description="Node labels the serving pods (stable and canary) require."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=32,
        description="Tolerations added to the serving pods' own nvidia.com/gpu:NoSchedule toleration.",
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="core/v1 Affinity of the serving pods (nodeAffinity, podAffinity, podAntiAffinity).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    topology_spread_constraints: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=8,
        description="core/v1 TopologySpreadConstraints of the serving pods.",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=8, description="Secrets to pull the serving image with."
    )
    priority_class_name: str | None = Field(
        default=None,
        pattern=DNS_LABEL_PATTERN,
        max_length=253,
        description="PriorityClass of the serving pods.",
    )
    pod_labels: dict[str, LabelValue] | None = Field(
        default=None, max_length=32, description="Extra labels on the serving pods (specops' own labels win)."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment of the engine container (specops' own variables win).",
    )
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=16,
        description="Extra core/v1 Volumes of the serving pods (names must differ from specops' own).",
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=16, description="Mounts of serving.volumes in the engine container."
    )
    pod_annotations: dict[str, str] | None = Field(
        default=None, max_length=32, description="Extra annotations on the serving pods (specops' own win)."
    )


# ---------------------------------------------------------------- speculation


class DraftLength(ApiModel):
    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            ("self.min <= self.initial && self.initial <= self.max", "initial must be between min and max"),
        )
    )

    initial: int = Field(
        default=4,
        ge=1,
        le=MAX_ENGINE_DRAFT_LEN,
        description="K of the first speculating revision, up to the break-even batch the prior predicts.",
    )
    min: int = Field(
        default=1, ge=1, le=MAX_ENGINE_DRAFT_LEN, description="Lowest draft length the loop may pick."
    )
    max: int = Field(
        default=8,
        ge=1,
        le=MAX_ENGINE_DRAFT_LEN,
        description="Highest draft length the loop may pick; the engines are started with at most "
        f"{MAX_ENGINE_DRAFT_LEN}.",
    )


class Rollout(ApiModel):
    baseline: PhaseDuration = Field(
        default="5m",
        description="How long the pods first run plain (started without speculation) so plain speed at "
        "the deployment's own load is measured before the first speculating revision; 0s: speculate at once.",
    )
    soak: PhaseDuration = Field(
        default="10m",
        description="How long the first speculating revision runs before the loop may propose another.",
    )


class ProfileConfigMapRef(ApiModel):
    name: str = Field(
        pattern=DNS_LABEL_PATTERN, max_length=253, description="ConfigMap name (same namespace)."
    )
    key: str = Field(default="profile.json", max_length=253, description="Key holding the profile JSON.")


class CalibrationProfile(ApiModel):
    config_map_ref: ProfileConfigMapRef = Field(
        description="ConfigMap holding a serving profile measured offline (specops profile; docs/profiles.md)."
    )


class Calibration(ApiModel):
    enabled: bool = Field(
        default=True,
        description="Decide from the roofline corrected by this deployment's own measurements; "
        "false: the roofline alone.",
    )
    half_life: HalfLifeDuration = Field(
        default="30m", description="A measurement's weight in the fit halves every this long."
    )
    slowdown_guard: bool = Field(
        default=True,
        description="Replace a revision measured slower than plain on the load seen at once (even "
        "mid-rollout or mid-soak); false: it waits for the soak and reconfigure.minInterval.",
    )
    profile: CalibrationProfile | None = Field(
        default=None,
        description="A measured serving profile to start from instead of the roofline: the prior the "
        "deployment's own measurements then correct. A missing or invalid one falls back to the roofline "
        "(condition CalibrationProfile=False).",
    )


class Reconfigure(ApiModel):
    min_gain: float = Field(
        default=0.03,
        ge=0.0,
        le=1.0,
        description="A new revision (schedule or plain) rolls out only when its predicted gain over the one "
        "serving, weighted by the batches the deployment saw, exceeds this fraction and, where rollouts take "
        "pods down (serving.maxUnavailable > 0), the share of pod-time its restarts cost over minInterval.",
    )
    min_interval: CooldownDuration = Field(
        default="30m",
        description="Least time between two revision rollouts of one resource (each restarts every pod).",
    )
    margin: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="A batch band speculates only where the predicted speedup exceeds 1 + margin; "
        "heavier bands get K=0.",
    )


class SpeculationSpec(ApiModel):
    mode: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="auto: the loop picks plain or the best schedule; on: always speculate (the schedule is "
        "still tuned, K=0 allowed at heavy batches); off: plain pods.",
    )
    draft_length: DraftLength = Field(default_factory=DraftLength, description="Bounds of the draft length.")
    rollout: Rollout = Field(default_factory=Rollout, description="Baseline and soak phases before tuning.")
    calibration: Calibration = Field(
        default_factory=Calibration, description="Learning the real speedup curve from measurements."
    )
    reconfigure: Reconfigure = Field(
        default_factory=Reconfigure,
        description="When a new configuration revision (schedule, or plain) is rolled out to the pods.",
    )


# ---------------------------------------------------------------- SLO and metrics


class SloSpec(ApiModel):
    per_token_latency_p99: LatencyObjective | None = Field(
        default=None, description='Per-token (inter-token) latency p99 objective, e.g. "45ms".'
    )
    min_acceptance: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Floor on per-token acceptance alpha (not vLLM's accepted/drafted rate).",
    )


DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
"""The Prometheus a resource reads when neither it nor the operator (SPECOPS_PROMETHEUS_URL) names one."""
HEADER_NAME_PATTERN = r"^[A-Za-z0-9][-A-Za-z0-9_.]*$"
"""An HTTP header name (the RFC 9110 token characters that header names use in practice)."""
RESERVED_HEADERS = ("authorization", "host", "content-length", "accept-encoding", "user-agent")


class SecretKeyRef(ApiModel):
    """A key of a Secret in the resource's namespace (core/v1 SecretKeySelector without ``optional``)."""

    name: str = Field(pattern=DNS_LABEL_PATTERN, max_length=253, description="Name of the Secret.")
    key: str = Field(
        min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$", description="The key to read."
    )


class PrometheusBasicAuth(ApiModel):
    username: SecretKeyRef = Field(description="Secret key holding the user name.")
    password: SecretKeyRef = Field(description="Secret key holding the password.")


class PrometheusCa(ApiModel):
    """Where the CA bundle (PEM) is: a ConfigMap key or a Secret key, in the resource's namespace."""

    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            ("has(self.configMap) != has(self.secret)", "set exactly one of configMap, secret"),
        )
    )

    config_map: SecretKeyRef | None = Field(default=None, description="ConfigMap key holding the CA (PEM).")
    secret: SecretKeyRef | None = Field(default=None, description="Secret key holding the CA (PEM).")

    @model_validator(mode="after")
    def _exactly_one(self) -> PrometheusCa:
        if (self.config_map is None) == (self.secret is None):
            raise ValueError("metrics.prometheus.tlsConfig.ca: set exactly one of configMap, secret")
        return self


class PrometheusTls(ApiModel):
    ca: PrometheusCa | None = Field(
        default=None, description="CA that signs Prometheus' certificate. Empty: the system's CAs."
    )
    server_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$",
        description="Name to verify the certificate against. Empty: the URL's host.",
    )


class HttpHeader(ApiModel):
    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!self.name.matches('(?i)^(" + "|".join(RESERVED_HEADERS) + ")$')",
                "Authorization, Host, Content-Length, Accept-Encoding and User-Agent are set by specops "
                "(credentials: bearerTokenSecret or basicAuth)",
                ".name",
            ),
        )
    )

    name: str = Field(pattern=HEADER_NAME_PATTERN, max_length=128, description="Header name.")
    value: str = Field(max_length=1024, pattern=r"^[^\r\n]*$", description="Header value (not a secret).")

    @model_validator(mode="after")
    def _not_reserved(self) -> HttpHeader:
        if self.name.lower() in RESERVED_HEADERS:
            raise ValueError(
                f"header {self.name!r} is set by specops (credentials: bearerTokenSecret or basicAuth)"
            )
        return self


class PrometheusSource(ApiModel):
    """The Prometheus that scrapes the serving pods, and how to authenticate to it.

    Secrets and ConfigMaps are read from the resource's namespace; their contents never appear in
    status, Events or logs (docs/metrics.md, "Prometheus")."""

    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!(has(self.bearerTokenSecret) && has(self.basicAuth))",
                "set bearerTokenSecret or basicAuth, not both",
            ),
        )
    )

    url: str | None = Field(
        default=None,
        pattern=r"^https?://.+$",
        max_length=1024,
        description="Base URL of the Prometheus query API. Empty: the operator's default "
        f"(chart value prometheus.url; else {DEFAULT_PROMETHEUS_URL}).",
    )
    bearer_token_secret: SecretKeyRef | None = Field(
        default=None, description="Send the token in this Secret key as `Authorization: Bearer`."
    )
    basic_auth: PrometheusBasicAuth | None = Field(
        default=None, description="HTTP basic auth, user name and password from Secret keys."
    )
    tls_config: PrometheusTls | None = Field(default=None, description="TLS settings for an https:// URL.")
    headers: list[HttpHeader] = Field(
        default_factory=list,
        max_length=16,
        description="Extra request headers, e.g. X-Scope-OrgID (a Mimir or Cortex tenant). "
        "Not for credentials: use bearerTokenSecret or basicAuth.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @model_validator(mode="after")
    def _one_credential(self) -> PrometheusSource:
        if self.bearer_token_secret is not None and self.basic_auth is not None:
            raise ValueError("metrics.prometheus: set bearerTokenSecret or basicAuth, not both")
        names = [header.name.lower() for header in self.headers]
        if len(set(names)) != len(names):
            raise ValueError("metrics.prometheus.headers: each header name once")
        return self

    @property
    def uses_namespace_objects(self) -> bool:
        """Whether a Secret or ConfigMap of the resource's namespace is read to query it."""
        return (
            self.bearer_token_secret is not None
            or self.basic_auth is not None
            or (self.tls_config is not None and self.tls_config.ca is not None)
        )


class MetricsSpec(ApiModel):
    prometheus: PrometheusSource = Field(default_factory=PrometheusSource, description="Prometheus to query.")
    interval: Interval = Field(
        default="15s", description="How often metrics are read and decisions made (1s to 1h)."
    )


# ---------------------------------------------------------------- canary


class CanaryStep(ApiModel):
    weight: int = Field(ge=1, le=100, description="Percent of traffic sent to the canary in this step.")
    pause: PauseDuration = Field(
        default="10m", description="Bake time of this step before the next analysis."
    )


def _default_steps() -> list[CanaryStep]:
    return [CanaryStep(weight=w) for w in (5, 10, 25, 50, 100)]


class HttpRouteRef(ApiModel):
    http_route: str = Field(
        pattern=DNS_LABEL_PATTERN, max_length=63, description="Name of the Gateway API HTTPRoute to manage."
    )


class TrafficRouting(ApiModel):
    gateway_api: HttpRouteRef | None = Field(
        default=None,
        alias="gatewayAPI",
        description="Split traffic with real backend weights on this HTTPRoute. Empty: replica-ratio split.",
    )


class CanaryAnalysis(ApiModel):
    confidence: float = Field(
        default=0.95, ge=0.5, le=0.999, description="Confidence of the statistical test."
    )
    failure_limit: int = Field(
        default=2, ge=0, le=100, description="Failed analyses tolerated before rollback."
    )
    inconclusive_limit: int = Field(
        default=3, ge=0, le=100, description="Inconclusive analyses tolerated before rollback."
    )
    consecutive_error_limit: int = Field(
        default=4, ge=0, le=100, description="Consecutive metric errors tolerated before pausing judgement."
    )


class ConfigMapKeyRef(ApiModel):
    name: str = Field(pattern=DNS_LABEL_PATTERN, max_length=253, description="ConfigMap name.")
    key: str = Field(default="prompts.txt", max_length=253, description="Key holding one prompt per line.")


class GoldenPrompts(ApiModel):
    prompts: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=64,
        description="Prompts for the lossless check (greedy, temperature 0).",
    )
    config_map_ref: ConfigMapKeyRef | None = Field(default=None, description="Prompts kept in a ConfigMap.")
    max_tokens: int = Field(default=64, ge=1, le=4096, description="Tokens generated per golden prompt.")
    max_divergence: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Share of golden-prompt tokens that may differ from the plain reference (0: token for "
        "token). Some kernels are batch-variant; docs/canary.md says when a small rate is acceptable.",
    )


MAX_CANARY_STEPS = 20


def _increasing_weights_rule() -> str:
    """Pairwise comparisons up to maxItems: portable CEL (no isSorted(), no two-variable macros)."""
    pairs = [
        f"(size(self.steps) <= {i + 1} || self.steps[{i}].weight < self.steps[{i + 1}].weight)"
        for i in range(MAX_CANARY_STEPS - 1)
    ]
    return "!has(self.steps) || " + " && ".join(pairs)


class CanarySpec(ApiModel):
    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            (_increasing_weights_rule(), "canary step weights must be strictly increasing", ".steps"),
        )
    )

    steps: list[CanaryStep] = Field(
        default_factory=_default_steps,
        min_length=1,
        max_length=MAX_CANARY_STEPS,
        description="Traffic weights in increasing order, each held for its pause.",
        json_schema_extra={"default": [{"weight": w, "pause": "10m"} for w in (5, 10, 25, 50, 100)]},
    )
    traffic_routing: TrafficRouting = Field(
        default_factory=TrafficRouting, description="How traffic is split."
    )
    analysis: CanaryAnalysis = Field(default_factory=CanaryAnalysis, description="Judgement of each step.")
    golden_prompts: GoldenPrompts = Field(
        default_factory=GoldenPrompts, description="Lossless check run before any traffic."
    )


# ---------------------------------------------------------------- retraining


class AcceptanceTrigger(ApiModel):
    for_: TriggerDuration = Field(
        default="30m", alias="for", description="How long acceptance must stay below the SLO to trigger."
    )
    cooldown: CooldownDuration = Field(
        default="24h", description="Minimum time between two triggered retrainings."
    )


class RetrainingTriggers(ApiModel):
    target_version_change: bool = Field(default=True, description="Retrain when target.version changes.")
    acceptance_below_slo: AcceptanceTrigger | None = Field(
        default=None,
        alias="acceptanceBelowSLO",
        description="Retrain when acceptance stays below slo.minAcceptance.",
    )


class OnPolicyKnobs(ApiModel):
    target_assisted_rollout: bool = Field(default=True, description="Roll out with target assistance.")
    replay_rejected: bool = Field(default=True, description="Replay positions the verifier rejected.")
    rejected_weight: float = Field(default=2.0, ge=0.0, le=100.0, description="Weight of rejected positions.")


class RetrainingData(ApiModel):
    uri: str = Field(
        pattern=DATA_URI_PATTERN,
        max_length=1024,
        description="Real prompts to train on: s3://, gs://, pvc://, file://, https:// or hf:// (the trainer "
        "reads it).",
    )


class RetrainingSpec(ApiModel):
    enabled: bool = Field(default=False, description="Whether specops starts retraining jobs.")
    triggers: RetrainingTriggers = Field(
        default_factory=RetrainingTriggers, description="What starts a round."
    )
    method: Literal["sft", "onPolicy"] = Field(default="onPolicy", description="Training method.")
    on_policy: OnPolicyKnobs = Field(
        default_factory=OnPolicyKnobs, description="On-policy distillation knobs."
    )
    data: RetrainingData | None = Field(default=None, description="Training prompts.")
    image: str | None = Field(default=None, max_length=512, description="Trainer image.")
    template: dict[str, Any] | None = Field(
        default=None,
        description="The trainer's template: a batch/v1 Job, a JobSet (jobset.x-k8s.io/v1alpha2), a TrainJob "
        "(trainer.kubeflow.org/v1alpha1) or a PyTorchJob (kubeflow.org/v1). Empty: a batch/v1 Job running "
        "retraining.image. See docs/retraining.md for what specops injects.",
        json_schema_extra={
            "x-kubernetes-preserve-unknown-fields": True,
            "properties": {
                "apiVersion": {
                    "type": "string",
                    "maxLength": 253,
                    "description": "batch/v1, jobset.x-k8s.io/v1alpha2, trainer.kubeflow.org/v1alpha1 or "
                    "kubeflow.org/v1.",
                },
                "kind": {
                    "type": "string",
                    "maxLength": 63,
                    "description": "Job, JobSet, TrainJob or PyTorchJob (with the matching apiVersion).",
                },
            },
            **cel_rules(
                (
                    "has(self.apiVersion) && has(self.kind) && ("
                    + " || ".join(
                        f"(self.apiVersion == '{a}' && self.kind == '{k}')" for a, k in TEMPLATE_KINDS
                    )
                    + ")",
                    "retraining.template must be one of: " + ", ".join(f"{a} {k}" for a, k in TEMPLATE_KINDS),
                    ".kind",
                ),
            ),
        },
    )
    auto_canary: bool = Field(default=True, description="Canary the trained draft automatically.")
    while_stale: Literal["keepIfAcceptanceHolds", "off"] = Field(
        default="keepIfAcceptanceHolds",
        description="While the draft is stale for a new target version: keep speculating while the control "
        "loop still measures a gain (keepIfAcceptanceHolds), or switch speculation off (off).",
    )


# ---------------------------------------------------------------- spec


class SpeculativeDeploymentSpec(ApiModel):
    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            (
                when_present(
                    "self.target.uri.startsWith('pvc://') && (!has(self.draft.uri) || "
                    "self.draft.uri.startsWith('pvc://')) || has(self.serving.checkpointFetcherImage)",
                    "self.target.uri",
                    "self.draft",
                    "self.serving",
                ),
                "serving.checkpointFetcherImage is required when a checkpoint uri is not pvc://",
                ".serving.checkpointFetcherImage",
            ),
            (
                when_present(
                    parameters_cel("self.draft.parameters")
                    + " < "
                    + parameters_cel("self.target.parameters"),
                    "self.draft.parameters",
                    "self.target.parameters",
                ),
                "draft.parameters must be smaller than target.parameters: a draft as large as the target "
                "can never pay",
                ".draft.parameters",
            ),
            (
                when_present("self.draft.uri != self.target.uri", "self.draft.uri", "self.target.uri"),
                "draft.uri names the target's own checkpoint",
                ".draft.uri",
            ),
        )
    )

    target: TargetSpec = Field(description="The model whose outputs users get.")
    draft: DraftSpec = Field(description="The small model that proposes tokens for the target to verify.")
    serving: ServingSpec = Field(default_factory=ServingSpec, description="Pods, GPUs and engine.")
    speculation: SpeculationSpec = Field(
        default_factory=SpeculationSpec, description="How the control loop runs speculation."
    )
    slo: SloSpec = Field(default_factory=SloSpec, description="Service level objectives.")
    metrics: MetricsSpec = Field(default_factory=MetricsSpec, description="Where measurements come from.")
    canary: CanarySpec = Field(default_factory=CanarySpec, description="How a new draft is rolled out.")
    retraining: RetrainingSpec = Field(
        default_factory=RetrainingSpec, description="Draft retraining when the target changes."
    )

    @model_validator(mode="after")
    def _cross_fieldcel_rules(self) -> SpeculativeDeploymentSpec:
        """The CRD's CEL rules again, for resources that got past an older or missing CRD."""
        length = self.speculation.draft_length
        if not length.min <= length.initial <= length.max:
            raise ValueError("speculation.draftLength: initial must be between min and max")
        if self.serving.gpu.count % self.serving.tensor_parallel:
            raise ValueError("serving.tensorParallel: must divide serving.gpu.count")
        if self.serving.max_surge + self.serving.max_unavailable < 1:
            raise ValueError("serving.maxUnavailable: maxSurge and maxUnavailable cannot both be 0")
        weights = [step.weight for step in self.canary.steps]
        if any(b <= a for a, b in pairwise(weights)):
            raise ValueError("canary.steps: weights must be strictly increasing")
        uris = [self.target.uri, *([self.draft.uri] if self.draft.uri else [])]
        if any(not uri.startswith("pvc://") for uri in uris) and not self.serving.checkpoint_fetcher_image:
            raise ValueError("serving.checkpointFetcherImage: required when a checkpoint uri is not pvc://")
        if (
            self.draft.parameters is not None
            and parse_parameters(self.draft.parameters) >= self.target.parameter_count
        ):
            raise ValueError(
                "draft.parameters: must be smaller than target.parameters (a draft as large as the target "
                "can never pay)"
            )
        if self.draft.uri is not None and self.draft.uri == self.target.uri:
            raise ValueError("draft.uri: names the target's own checkpoint")
        return self

    def seconds(self, duration: str) -> float:
        return parse_duration(duration)


class SpeculativeDeployment(ApiModel):
    """The whole resource as the operator reads it."""

    api_version: str = Field(default=API_VERSION, description="specops.dev/v1alpha1")
    kind: str = Field(default=KIND, description="SpeculativeDeployment")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: SpeculativeDeploymentSpec = Field(description="Desired state.")
    status: SpeculativeDeploymentStatus = Field(
        default_factory=SpeculativeDeploymentStatus, description="Observed state."
    )
