"""`specops plan`: what speculation buys for a target/draft pair on a GPU, before deploying it.

Evaluates the roofline performance model (`specops.domain.perf`) over batch sizes and draft
lengths and prints the latency ratio c, the best draft length and its predicted speedup per
batch size, and the break-even batch. Without `--draft-params` it compares candidate draft
sizes instead. Defaults: alpha 0.8 (a typical per-token acceptance for a same-family draft
of 5-10 % of the target), the operator's default context length
(`specops.domain.perf.DEFAULT_CONTEXT_TOKENS`, weights only: SPECDEC.md's worked values), bf16,
tensor parallel 1, max draft length 8. `-f sdep.yaml` takes GPU, sizes, precision, tensor
parallel and draft-length bounds from a SpeculativeDeployment, as the operator reads them.

break_even_batch is the smallest batch at which even the best draft length in
[1, max_draft_len] no longer beats plain decoding (speedup <= 1.0): the batch above which
speculation should be off. 1 when it never pays ("never pays"); null when it still pays at
4096 ("pays at every batch up to 4096"). `warnings` names a draft as large as the target, a
latency ratio c >= alpha, and weights that do not fit the GPUs at the tensor parallelism.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from rich.table import Table

from specops.api.models import KIND, DraftLength, GpuSpec, Parameters
from specops.api.units import parse_parameters
from specops.cli_output import console, write_json
from specops.domain.perf import (
    BYTES_PER_PARAM,
    DEFAULT_CONTEXT_TOKENS,
    GPUS,
    ModelSetup,
    best_draft_length,
    best_length_break_even_batch,
    latency_ratio,
    speedup,
)
from specops.domain.profile import ServingProfile

DEFAULT_ALPHA = 0.8
DEFAULT_DTYPE = "bf16"
DEFAULT_MAX_DRAFT_LEN = 8
DEFAULT_BATCHES = (1, 8, 16, 32, 64, 128, 256, 512)
CANDIDATE_DRAFT_PARAMS = (0.5e9, 1e9, 1.5e9, 3e9, 7e9, 8e9, 13e9)


def plan_for(setup: ModelSetup, alpha: float, batches: list[int], max_draft_len: int) -> dict[str, Any]:
    """Per-batch best length, its speedup and the speedup of every length, plus break-even."""
    by_batch = []
    for batch in batches:
        best_length, best_speedup = best_draft_length(setup, alpha, batch, max_draft_len)
        by_batch.append(
            {
                "batch": batch,
                "best_draft_length": best_length,
                "best_speedup": best_speedup,
                "speedup_by_length": {
                    str(g): speedup(setup, alpha, batch, g) for g in range(1, max_draft_len + 1)
                },
            }
        )
    return {
        "draft_params": setup.draft_params,
        "latency_ratio_c": latency_ratio(setup, 1.0),
        "by_batch": by_batch,
        "break_even_batch": best_length_break_even_batch(setup, alpha, max_draft_len),
    }


class ParameterCount(click.ParamType):
    """A parameter count as the CRD writes it ("70B", "1.5B", "500M", "70e9") or a plain number."""

    name = "PARAMS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        text = str(value).strip()
        try:
            return parse_parameters(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                self.fail(f"{text!r}: write e.g. 70B, 1.5B, 500M, 70e9 or 70000000000", param, ctx)
            if number <= 0:
                self.fail(f"{text!r}: must be positive", param, ctx)
            return number


@dataclass(frozen=True)
class PlanInputs:
    """Everything a plan depends on; from options, a SpeculativeDeployment, or both (options win)."""

    gpu: str
    target_params: float
    draft_params: float | None
    active_params: float | None = None  # MoE: parameters active per token (None: all of them)
    alpha: float = DEFAULT_ALPHA
    context_tokens: float = DEFAULT_CONTEXT_TOKENS
    dtype: str = DEFAULT_DTYPE
    tensor_parallel: int = 1
    max_draft_len: int = DEFAULT_MAX_DRAFT_LEN
    source: str | None = None

    @property
    def active(self) -> float:
        """The target parameters each token reads: what a decode step costs."""
        return self.active_params if self.active_params is not None else self.target_params

    def setup_with(self, draft_params: float) -> ModelSetup:
        return ModelSetup(
            gpu=GPUS[self.gpu],
            target_params=self.active,
            draft_params=draft_params,
            bytes_per_param=BYTES_PER_PARAM[self.dtype],
            tensor_parallel=self.tensor_parallel,
            context_tokens=self.context_tokens,
        )


class _SpecFields(BaseModel):
    """The fields of a SpeculativeDeployment's spec that the performance model reads; the rest
    (engines, checkpoints, canary, ...) plan neither needs nor checks."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class PlanTarget(_SpecFields):
    parameters: Parameters
    active_parameters: Parameters | None = None
    precision: Literal["bf16", "fp16", "fp8", "int8", "int4"] = "bf16"


class PlanDraft(_SpecFields):
    parameters: Parameters | None = None
    method: Literal["draftModel", "eagle3", "mtp", "ngram"] = "draftModel"

    @model_validator(mode="after")
    def _sized(self) -> PlanDraft:
        if self.method == "draftModel" and self.parameters is None:
            raise ValueError("a draftModel needs draft.parameters")
        return self

    def parameter_count_for(self, target_active_parameters: float) -> float:
        """As the operator counts it (api.models.DraftSpec): the given size, else about one decoder
        layer of the target for eagle3 and mtp, none for ngram."""
        if self.parameters is not None:
            return parse_parameters(self.parameters)
        return 0.0 if self.method == "ngram" else target_active_parameters / 64.0


class PlanServing(_SpecFields):
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    tensor_parallel: int = Field(default=1, ge=1)


class PlanSpeculation(_SpecFields):
    draft_length: DraftLength = Field(default_factory=DraftLength)


class PlanSpec(_SpecFields):
    """What `plan -f` (and the plugin's break-even) reads of a spec: sizes, precision, GPUs, lengths."""

    target: PlanTarget
    draft: PlanDraft
    serving: PlanServing = Field(default_factory=PlanServing)
    speculation: PlanSpeculation = Field(default_factory=PlanSpeculation)


class SpecError(ValueError):
    """A spec plan cannot read, said in one line with each field's path (spec.draft.parameters: ...)."""


def validation_text(error: ValidationError, prefix: str = "spec") -> str:
    """Pydantic's errors as one line: `spec.a.b: field required; spec.c: ...`."""
    parts = []
    for item in error.errors():
        path = ".".join([prefix, *(str(part) for part in item["loc"])])
        message = str(item["msg"])
        parts.append(f"{path}: {message[:1].lower()}{message[1:]}")
    return "; ".join(parts)


def read_spec(spec: Any) -> PlanSpec:
    """The fields plan reads, validated; SpecError (one line, field paths) when they are missing or bad."""
    try:
        return PlanSpec.model_validate(spec if spec is not None else {})
    except ValidationError as error:
        raise SpecError(validation_text(error)) from None


def inputs_from_spec(spec: PlanSpec) -> dict[str, Any]:
    """What the operator's performance model reads from a spec (active parameters for MoE targets)."""
    active = spec.target.active_parameters
    return {
        "gpu": spec.serving.gpu.type,
        "target_params": parse_parameters(spec.target.parameters),
        "active_params": parse_parameters(active) if active else None,
        "draft_params": spec.draft.parameter_count_for(parse_parameters(active or spec.target.parameters)),
        "dtype": spec.target.precision,
        "tensor_parallel": spec.serving.tensor_parallel,
        "max_draft_len": spec.speculation.draft_length.max,
    }


def read_resource(path: str) -> tuple[str, PlanSpec]:
    """The first SpeculativeDeployment in a YAML file ("-" = stdin): its name and the fields plan reads.

    Every failure is one line (click.ClickException): no such file, not YAML, no resource, or
    the spec's missing and invalid fields by path."""
    shown = "stdin" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except FileNotFoundError:
        raise click.ClickException(f"{shown}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise click.ClickException(
            f"{shown}: cannot read: {getattr(error, 'strerror', None) or error}"
        ) from None
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        problem = getattr(error, "problem", None) or "invalid YAML"
        raise click.ClickException(f"{shown}: not YAML{line}: {problem}") from None
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == KIND:
            name = str((document.get("metadata") or {}).get("name", "?"))
            try:
                return name, read_spec(document.get("spec"))
            except SpecError as error:
                raise click.ClickException(f"{shown}: {error}") from None
    raise click.ClickException(f"{shown}: no {KIND} in it")


def compute_plan(inputs: PlanInputs, batches: list[int]) -> dict[str, Any]:
    """The plan as JSON: the inputs, then one draft's table or every candidate draft size's."""
    common: dict[str, Any] = {
        "gpu": inputs.gpu,
        "target_params": inputs.target_params,
        "active_params": inputs.active,
        "alpha": inputs.alpha,
        "context_tokens": inputs.context_tokens,
        "dtype": inputs.dtype,
        "tensor_parallel": inputs.tensor_parallel,
        "max_draft_len": inputs.max_draft_len,
    }
    if inputs.source is not None:
        common["source"] = inputs.source
    if inputs.draft_params is not None:
        plan = plan_for(inputs.setup_with(inputs.draft_params), inputs.alpha, batches, inputs.max_draft_len)
        return {**common, **plan, "warnings": warnings_for(inputs, plan)}
    candidates = [d for d in CANDIDATE_DRAFT_PARAMS if d < inputs.active]
    plans = [plan_for(inputs.setup_with(d), inputs.alpha, batches, inputs.max_draft_len) for d in candidates]
    return {**common, "candidates": plans, "warnings": warnings_for(inputs, None)}


GPU_MEMORY_BYTES: dict[str, float] = {"H100": 80e9, "H200": 141e9, "A100": 80e9, "L40S": 48e9, "B200": 180e9}
"""Memory of one accelerator (the largest variant sold: A100 80 GB, H100 SXM 80 GB)."""


def warnings_for(inputs: PlanInputs, plan: dict[str, Any] | None) -> list[str]:
    """What makes a plan pointless or impossible, in words: a draft as large as the target, a
    latency ratio at or above alpha, weights larger than the GPUs' memory."""
    found = []
    draft = inputs.draft_params
    if draft is not None and draft >= inputs.active:
        found.append(
            f"the draft ({params_text(draft)}) is as large as the target ({params_text(inputs.active)}"
            f"{' active' if inputs.active_params is not None else ''}) or larger: speculation cannot pay"
        )
    if plan is not None and plan["latency_ratio_c"] >= inputs.alpha:
        found.append(
            f"latency ratio c = {plan['latency_ratio_c']:.3f} is at least alpha {inputs.alpha:.2f}: "
            "speculation never pays"
        )
    weight_bytes = (inputs.target_params + (draft or 0.0)) * BYTES_PER_PARAM[inputs.dtype]
    memory = GPU_MEMORY_BYTES[inputs.gpu] * inputs.tensor_parallel
    if weight_bytes > memory:
        needed = math.ceil(weight_bytes / GPU_MEMORY_BYTES[inputs.gpu])
        found.append(
            f"the weights ({weight_bytes / 1e9:.0f} GB in {inputs.dtype}) do not fit {inputs.tensor_parallel} "
            f"x {inputs.gpu} ({memory / 1e9:.0f} GB): tensor parallel {needed} or more, or a smaller precision"
        )
    return found


def params_text(params: float) -> str:
    return f"{params / 1e9:g}B"


ROOFLINE_MAX_BATCH = 4096
PROFILE_MAX_BATCH = 1024


def _break_even_text(plan: dict[str, Any]) -> str:
    break_even = plan["break_even_batch"]
    if break_even == 1:
        return "never"
    return str(break_even) if break_even is not None else f">{ROOFLINE_MAX_BATCH}"


def break_even_sentence(break_even: int | None, max_batch: int) -> str:
    """What a break-even batch means for speculation, in words."""
    if break_even == 1:
        return "speculation never pays: plain decoding is as fast or faster even at batch 1"
    if break_even is None:
        return f"speculation pays at every batch up to {max_batch}"
    return f"break-even batch: {break_even} (speculation pays below it; switch it off from there)"


LEGEND = (
    "g: draft length (tokens proposed per step); c: latency ratio, draft step time / target step time "
    "at batch 1 (speculation can pay only while alpha > c)"
)


def print_warnings(out: Any, warnings: list[str]) -> None:
    for warning in warnings:
        out.print(f"[bold yellow]warning:[/] {warning}", highlight=False)


def plan_table(plan: dict[str, Any]) -> Table:
    table = Table("batch", "best length g", "speedup", title_justify="left", show_edge=False)
    for column in table.columns:
        column.justify = "right"
    for row in plan["by_batch"]:
        length = row["best_draft_length"]
        table.add_row(str(row["batch"]), "off" if length == 0 else str(length), f"{row['best_speedup']:.2f}x")
    return table


def candidates_table(plans: list[dict[str, Any]], batches: list[int]) -> Table:
    table = Table("draft", "c", *(f"B={b}" for b in batches), "break-even", show_edge=False)
    for column in table.columns:
        column.justify = "right"
    for plan in plans:
        cells = []
        for row in plan["by_batch"]:
            length, best = row["best_draft_length"], row["best_speedup"]
            cells.append("off" if length == 0 else f"g{length} {best:.2f}x")
        table.add_row(
            params_text(plan["draft_params"]),
            f"{plan['latency_ratio_c']:.3f}",
            *cells,
            _break_even_text(plan),
        )
    return table


def print_plan(result: dict[str, Any], batches: list[int], *, to_stderr: bool) -> None:
    out = console(stderr=to_stderr)
    source = f"{result['source']}: " if result.get("source") else ""
    active = result["active_params"]
    moe = f" ({params_text(active)} active)" if active != result["target_params"] else ""
    out.print(
        f"{source}{result['gpu']} x{result['tensor_parallel']}, target {params_text(result['target_params'])}"
        f"{moe} {result['dtype']}, alpha {result['alpha']:.2f}, context {result['context_tokens']:g} tokens",
        highlight=False,
    )
    print_warnings(out, result["warnings"])
    if "candidates" in result:
        out.print(candidates_table(result["candidates"], batches))
        out.print(LEGEND, highlight=False)
        return
    alpha = result["alpha"]
    out.print(
        f"draft {params_text(result['draft_params'])}: latency ratio c = {result['latency_ratio_c']:.3f} "
        f"(speculation can pay only while alpha {alpha:.2f} > c)",
        highlight=False,
    )
    out.print(plan_table(result))
    out.print(break_even_sentence(result["break_even_batch"], ROOFLINE_MAX_BATCH), highlight=False)
    out.print(LEGEND, highlight=False)


def parse_batches(values: tuple[str, ...]) -> list[int]:
    try:
        batches = sorted({int(part) for value in values for part in value.split(",") if part.strip()})
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--batches") from error
    if not batches or batches[0] < 1:
        raise click.BadParameter("batches must be positive integers", param_hint="--batches")
    return batches


@click.command(
    "plan",
    epilog="break_even_batch: the smallest batch at which even the best draft length no longer beats 1.0.",
)
@click.option(
    "-f", "--filename", "resource", help="plan for a SpeculativeDeployment in this YAML file ('-' = stdin)"
)
@click.option(
    "--profile",
    "profile_reference",
    metavar="NAME|FILE",
    help="report from a serving profile (shipped, or written by specops profile) instead of the roofline",
)
@click.option(
    "--gpu", type=click.Choice(sorted(GPUS), case_sensitive=False), help="accelerator (required without -f)"
)
@click.option(
    "--target-params",
    type=ParameterCount(),
    help="e.g. 70B, 1.5B or 70e9; a MoE's total (required without -f)",
)
@click.option(
    "--active-params",
    type=ParameterCount(),
    help="MoE targets: parameters active per token, e.g. 22B (default: --target-params)",
)
@click.option("--draft-params", type=ParameterCount(), help="e.g. 7B; omit to compare candidate draft sizes")
@click.option(
    "--alpha",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help=f"per-token acceptance (default {DEFAULT_ALPHA}, typical for a same-family draft; with --profile the profile's)",
)
@click.option(
    "--context-tokens",
    type=click.FloatRange(min=0.0),
    default=DEFAULT_CONTEXT_TOKENS,
    show_default=True,
    help="context per request whose KV cache each step reads (the operator's default; 0 = weights only)",
)
@click.option("--dtype", type=click.Choice(sorted(BYTES_PER_PARAM)), help=f"default {DEFAULT_DTYPE}")
@click.option("--tensor-parallel", type=click.IntRange(min=1), help="default 1")
@click.option("--max-draft-len", type=click.IntRange(min=1), help=f"default {DEFAULT_MAX_DRAFT_LEN}")
@click.option(
    "--batches",
    multiple=True,
    default=[",".join(map(str, DEFAULT_BATCHES))],
    show_default=True,
    help="batch sizes, e.g. --batches 1,32,128 (repeatable)",
)
@click.option("--json", "json_path", metavar="PATH", help="write the plan as JSON to PATH ('-' = stdout)")
@click.pass_context
def plan_command(
    ctx: click.Context,
    resource: str | None,
    profile_reference: str | None,
    gpu: str | None,
    target_params: float | None,
    active_params: float | None,
    draft_params: float | None,
    alpha: float | None,
    context_tokens: float,
    dtype: str | None,
    tensor_parallel: int | None,
    max_draft_len: int | None,
    batches: tuple[str, ...],
    json_path: str | None,
) -> None:
    """Predict speculative decoding speedup by batch size and draft length (roofline model).

    Without a draft size it compares candidate draft sizes. With -f it reads GPU, model sizes,
    precision, tensor parallel and draft-length bounds from the resource; options override them.
    """
    if profile_reference is not None:
        ignored = [
            f"--{name.replace('_', '-')}" if name != "resource" else "-f"
            for name in PROFILE_IGNORES
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        ]
        if ignored:
            raise click.UsageError(
                f"--profile plans from the profile's measured step times: {', '.join(ignored)} would be ignored"
            )
        _plan_from_profile(profile_reference, alpha, batches, json_path)
        return
    if alpha is None:
        alpha = DEFAULT_ALPHA
    values: dict[str, Any] = {}
    if resource is not None:
        name, spec = read_resource(resource)
        values = {**inputs_from_spec(spec), "source": name}
    explicit = {
        "gpu": gpu,
        "target_params": target_params,
        "active_params": active_params,
        "draft_params": draft_params,
        "dtype": dtype,
        "tensor_parallel": tensor_parallel,
        "max_draft_len": max_draft_len,
    }
    values.update({key: value for key, value in explicit.items() if value is not None})
    values.setdefault("draft_params", None)
    if target_params is not None and active_params is None:
        values["active_params"] = None  # a target given here is not the file's MoE
    active = values.get("active_params")
    if active is not None and values.get("target_params") is not None and active > values["target_params"]:
        raise click.BadParameter("more than the target's parameters", param_hint="--active-params")
    for required in ("gpu", "target_params"):
        if required not in values:
            raise click.UsageError(f"--{required.replace('_', '-')} is required (or -f sdep.yaml)")
    inputs = PlanInputs(alpha=alpha, context_tokens=context_tokens, **values)
    batch_sizes = parse_batches(batches)
    result = compute_plan(inputs, batch_sizes)
    print_plan(result, batch_sizes, to_stderr=json_path == "-")
    write_json(result, json_path)


PROFILE_IGNORES = (
    "resource",
    "gpu",
    "target_params",
    "active_params",
    "draft_params",
    "context_tokens",
    "dtype",
    "tensor_parallel",
    "max_draft_len",
)
"""The roofline's inputs: a serving profile's measured step times replace every one of them."""


def main(argv: list[str]) -> int:
    """`specops plan ARGS` as a function (exit status), for scripts and tests."""
    try:
        plan_command.main(argv, prog_name="specops plan", standalone_mode=False)
    except click.ClickException as error:
        error.show()
        return error.exit_code
    return 0


def plan_from_profile(profile: ServingProfile, alpha: float, batches: list[int]) -> dict[str, Any]:
    """The same report as the roofline's, read from measured step times (lengths as profiled)."""
    by_batch = []
    for batch in batches:
        best_length, best_speedup = profile.best_length(alpha, batch)
        by_batch.append(
            {
                "batch": batch,
                "best_draft_length": best_length,
                "best_speedup": best_speedup,
                "speedup_by_length": {str(g): profile.speedup(alpha, g, batch) for g in profile.lengths},
            }
        )
    return {
        "profile": profile.name,
        "alpha": alpha,
        "by_batch": by_batch,
        "break_even_batch": profile.break_even_batch(alpha),
    }


def _plan_from_profile(
    reference: str, alpha: float | None, batches: tuple[str, ...], json_path: str | None
) -> None:
    from specops import profiles
    from specops.domain.profile import ProfileError

    try:
        profile = profiles.resolve(reference)
    except (OSError, ProfileError, ValueError) as error:
        raise click.BadParameter(str(error), param_hint="--profile") from error
    if alpha is None:
        alpha = profile.alpha if profile.alpha is not None else DEFAULT_ALPHA
    plan = plan_from_profile(profile, alpha, parse_batches(batches))
    out = sys.stderr if json_path == "-" else sys.stdout
    print(f"profile {profile.name}, alpha {alpha:.2f} (measured step times, not the roofline)", file=out)
    print(f"{'batch':>7}  {'best length':>11}  {'speedup':>8}", file=out)
    for row in plan["by_batch"]:
        length = row["best_draft_length"]
        shown = "off" if length == 0 else str(length)
        print(f"{row['batch']:>7}  {shown:>11}  {row['best_speedup']:>7.2f}x", file=out)
    print(break_even_sentence(plan["break_even_batch"], PROFILE_MAX_BATCH), file=out)
    write_json(plan, json_path)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
