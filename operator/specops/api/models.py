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

ENGINE_URI_PATTERN = r"^(pvc|s3|gs|file)://.+$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_ENGINE_DRAFT_LEN = 32

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


class TargetEngine(ApiModel):
    uri: str = Field(
        pattern=ENGINE_URI_PATTERN,
        max_length=1024,
        description="Where the target's compiled TensorRT-LLM engine lives: pvc://CLAIM/PATH is mounted "
        "read-only; s3://, gs:// and file:// are fetched by the engine fetcher init container.",
    )
    max_draft_len: int = Field(
        default=8,
        ge=1,
        le=MAX_ENGINE_DRAFT_LEN,
        description="The engine's build-time max_draft_len: no request may draft more tokens than this.",
    )


class DraftEngine(ApiModel):
    uri: str = Field(
        pattern=ENGINE_URI_PATTERN,
        max_length=1024,
        description="Where the draft's compiled engine lives (same schemes as the target's).",
    )


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
        default="bf16", description="Weight precision of the target engine (bytes per parameter)."
    )
    engine: TargetEngine = Field(description="The target's compiled engine.")

    @property
    def parameter_count(self) -> float:
        return parse_parameters(self.parameters)

    @property
    def active_parameter_count(self) -> float:
        if self.active_parameters is None:
            return self.parameter_count
        return parse_parameters(self.active_parameters)


class DraftSpec(ApiModel):
    model: str = Field(min_length=1, max_length=253, description="Name of the draft model.")
    version: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
        description="Version of the draft. A change rolls the new draft out behind a canary.",
    )
    kind: Literal["standalone", "expertDistilled", "eagle"] = Field(
        default="standalone",
        description="standalone: a small model of the same family; expertDistilled: distilled from a MoE "
        "target's expert routing; eagle: an EAGLE head on the target's hidden states.",
    )
    parameters: Parameters = Field(description='Draft parameter count, e.g. "7B" or "1e9".')
    engine: DraftEngine = Field(description="The draft's compiled engine.")

    @property
    def parameter_count(self) -> float:
        return parse_parameters(self.parameters)


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
        description='Requests of the Triton container besides GPUs, e.g. {cpu: "8", memory: 64Gi}.',
    )
    limits: dict[str, Quantity] | None = Field(
        default=None, max_length=16, description="Limits of the Triton container besides GPUs."
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
        )
    )

    backend: Literal["triton-trtllm", "trtllm-serve", "vllm", "sglang"] = Field(
        default="triton-trtllm",
        description="Serving engine. Only triton-trtllm is served by this version (speculation tuned per "
        "request at run time); trtllm-serve, vllm and sglang are reserved and refused with Ready=False.",
        json_schema_extra=immutable("serving.backend is immutable: create a new SpeculativeDeployment"),
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description="Serving image (Triton with the TensorRT-LLM backend). Empty: the operator's "
        "configured default image.",
    )
    replicas: int = Field(default=1, ge=0, le=1000, description="Serving replicas of the stable variant.")
    gpu: GpuSpec = Field(default_factory=GpuSpec, description="GPUs per replica.")
    tensor_parallel: int = Field(default=1, ge=1, le=16, description="Tensor parallel degree of the engines.")
    engine_fetcher_image: str | None = Field(
        default=None,
        max_length=512,
        description="Image of the init container that copies s3://, gs:// or file:// engines into the "
        "pod (it runs `fetch-engine SRC DST`). Not needed for pvc:// engines.",
    )
    service_account_name: str | None = Field(
        default=None,
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        description="Service account of the serving pods (e.g. for object-store credentials).",
    )
    resources: ServingResources | None = Field(
        default=None, description="CPU, memory and other resources of the Triton container, besides GPUs."
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
        description="Extra environment of the Triton container (specops' own variables win).",
    )
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=16,
        description="Extra core/v1 Volumes of the serving pods (names must differ from specops' own).",
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=16, description="Mounts of serving.volumes in the Triton container."
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
        default=4, ge=1, le=MAX_ENGINE_DRAFT_LEN, description="Draft length of the Fixed phase."
    )
    min: int = Field(
        default=1, ge=1, le=MAX_ENGINE_DRAFT_LEN, description="Lowest draft length the loop may pick."
    )
    max: int = Field(
        default=8,
        ge=1,
        le=MAX_ENGINE_DRAFT_LEN,
        description="Highest draft length the loop may pick; at most target.engine.maxDraftLen.",
    )


class Rollout(ApiModel):
    baseline: PhaseDuration = Field(
        default="10m",
        description="How long speculation stays off at first to record baseline per-token latency.",
    )
    soak: PhaseDuration = Field(
        default="30m",
        description="How long the initial draft length runs before the loop tunes it (Fixed phase).",
    )


class BatchGuard(ApiModel):
    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra=cel_rules(
            (
                "!has(self.offAbove) || !has(self.onBelow) || self.onBelow < self.offAbove",
                "onBelow must be lower than offAbove",
                ".onBelow",
            ),
        )
    )

    off_above: int | None = Field(
        default=None,
        ge=1,
        le=100000,
        description="Override: speculation off when running requests per pod exceed this. "
        "Empty: the performance model decides.",
    )
    on_below: int | None = Field(
        default=None,
        ge=0,
        le=100000,
        description="Override: speculation back on when running requests per pod fall below this.",
    )
    margin: float = Field(
        default=0.02, ge=0.0, le=1.0, description="Speculation goes off when predicted speedup < 1 + margin."
    )
    hysteresis: float = Field(
        default=0.05,
        ge=0.0,
        le=2.0,
        description="Speculation comes back only when predicted speedup > 1 + margin + hysteresis.",
    )
    min_dwell: DwellDuration = Field(default="1m", description="Minimum time between two on/off switches.")


class Exploration(ApiModel):
    max_probe_fraction: float = Field(
        default=0.02,
        ge=0.0,
        le=0.2,
        description="Probes (brief spells at another setting, so the model measures what it would "
        "otherwise assume) take at most this share of the time. 0 disables probing.",
    )
    min_spacing: ProbeSpacingDuration = Field(
        default="3m",
        description="Least time between the end of one probe and the next (a batch region never "
        "measured at all waits only one probe).",
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
        description="Switch speculation off when measurements show it slower than plain at the "
        "current load, whatever the model predicts.",
    )
    profile: CalibrationProfile | None = Field(
        default=None,
        description="A measured serving profile to start from instead of the roofline: the prior the "
        "deployment's own measurements then correct. A missing or invalid one falls back to the roofline "
        "(condition CalibrationProfile=False).",
    )


class SpeculationSpec(ApiModel):
    mode: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="auto: the control loop decides; on: always speculate (length still tuned); off: never.",
    )
    draft_length: DraftLength = Field(default_factory=DraftLength, description="Bounds of the draft length.")
    rollout: Rollout = Field(default_factory=Rollout, description="Baseline and soak phases before tuning.")
    batch_guard: BatchGuard = Field(
        default_factory=BatchGuard,
        description="When speculation switches off and on as batches grow and shrink.",
    )
    exploration: Exploration = Field(
        default_factory=Exploration, description="Bounds of the probes that keep the learned model honest."
    )
    calibration: Calibration = Field(
        default_factory=Calibration, description="Learning the real speedup curve from measurements."
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


class PrometheusSource(ApiModel):
    url: str = Field(
        default="http://prometheus-operated.monitoring.svc:9090",
        pattern=r"^https?://.+$",
        max_length=1024,
        description="Base URL of the Prometheus that scrapes the serving pods.",
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
                "self.speculation.draftLength.max <= self.target.engine.maxDraftLen",
                "speculation.draftLength.max must not exceed target.engine.maxDraftLen",
                ".speculation.draftLength.max",
            ),
            (
                "self.target.engine.uri.startsWith('pvc://') && self.draft.engine.uri.startsWith('pvc://')"
                " || has(self.serving.engineFetcherImage)",
                "serving.engineFetcherImage is required when an engine uri is not pvc://",
                ".serving.engineFetcherImage",
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
        if length.max > self.target.engine.max_draft_len:
            raise ValueError("speculation.draftLength.max: must not exceed target.engine.maxDraftLen")
        if self.serving.gpu.count % self.serving.tensor_parallel:
            raise ValueError("serving.tensorParallel: must divide serving.gpu.count")
        weights = [step.weight for step in self.canary.steps]
        if any(b <= a for a, b in pairwise(weights)):
            raise ValueError("canary.steps: weights must be strictly increasing")
        guard = self.speculation.batch_guard
        if guard.off_above is not None and guard.on_below is not None and guard.on_below >= guard.off_above:
            raise ValueError("speculation.batchGuard.onBelow: must be lower than offAbove")
        fetch_needed = not (
            self.target.engine.uri.startswith("pvc://") and self.draft.engine.uri.startswith("pvc://")
        )
        if fetch_needed and not self.serving.engine_fetcher_image:
            raise ValueError("serving.engineFetcherImage: required when an engine uri is not pvc://")
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
