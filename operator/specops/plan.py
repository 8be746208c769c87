"""`specops plan`: what speculation buys for a target/draft pair on a GPU, before deploying it.

Evaluates the roofline performance model (`specops.domain.perf`) over batch sizes and draft
lengths and prints the latency ratio c, the best draft length and its predicted speedup per
batch size, and the break-even batch. Without `--draft-params` it compares candidate draft
sizes instead. Defaults: alpha 0.8 (a typical per-token acceptance for a same-family draft
of 5-10 % of the target), 2048 context tokens (KV cache read per step; 0 gives SPECDEC.md's
weights-only worked values), bf16, tensor parallel 1, max draft length 8.

break_even_batch is the smallest batch at which even the best draft length in
[1, max_draft_len] no longer beats plain decoding (speedup <= 1.0): the batch above which
speculation should be off. null when it still pays at 4096.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from specops.cli_output import write_json
from specops.domain.perf import (
    BYTES_PER_PARAM,
    GPUS,
    ModelSetup,
    best_draft_length,
    best_length_break_even_batch,
    latency_ratio,
    speedup,
)
from specops.domain.profile import ServingProfile

DEFAULT_ALPHA = 0.8
DEFAULT_CONTEXT_TOKENS = 2048
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


def _parse_batches(values: list[str]) -> list[int]:
    batches = sorted({int(part) for value in values for part in value.split(",") if part.strip()})
    if not batches or batches[0] < 1:
        raise argparse.ArgumentTypeError("batches must be positive integers")
    return batches


def _params_text(params: float) -> str:
    return f"{params / 1e9:g}B"


def _format_plan(plan: dict[str, Any], alpha: float) -> str:
    lines = [
        f"draft {_params_text(plan['draft_params'])}: latency ratio c = {plan['latency_ratio_c']:.3f} "
        f"(speculation can pay only while alpha {alpha:.2f} > c)",
        f"{'batch':>7}  {'best length':>11}  {'speedup':>8}",
    ]
    for row in plan["by_batch"]:
        length = row["best_draft_length"]
        shown = "off" if length == 0 else str(length)
        lines.append(f"{row['batch']:>7}  {shown:>11}  {row['best_speedup']:>7.2f}x")
    break_even = plan["break_even_batch"]
    lines.append(
        f"break-even batch: {break_even}" if break_even is not None else "break-even batch: none up to 4096"
    )
    return "\n".join(lines)


def _format_candidates(plans: list[dict[str, Any]], batches: list[int]) -> str:
    header = f"{'draft':>7}  {'c':>6}  " + "  ".join(f"{'B=' + str(b):>9}" for b in batches) + "  break-even"
    lines = [header, "-" * len(header)]
    for plan in plans:
        cells = []
        for row in plan["by_batch"]:
            length, best = row["best_draft_length"], row["best_speedup"]
            cell = "off" if length == 0 else f"g{length} {best:.2f}x"
            cells.append(f"{cell:>9}")
        break_even = plan["break_even_batch"]
        lines.append(
            f"{_params_text(plan['draft_params']):>7}  {plan['latency_ratio_c']:>6.3f}  "
            + "  ".join(cells)
            + f"  {break_even if break_even is not None else '>4096':>10}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="specops plan",
        description="Predict speculative decoding speedup by batch size and draft length (roofline model).",
        epilog="break_even_batch: smallest batch at which even the best draft length no longer beats 1.0.",
    )
    parser.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help="report from a serving profile (e.g. written by specops profile) instead of the roofline",
    )
    parser.add_argument("--gpu", choices=sorted(GPUS))
    parser.add_argument("--target-params", type=float, help="e.g. 70e9")
    parser.add_argument("--draft-params", type=float, help="e.g. 7e9; omit to compare candidate draft sizes")
    parser.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="per-token acceptance (default 0.8, typical; with --profile the profile's)",
    )
    parser.add_argument(
        "--context-tokens",
        type=float,
        default=DEFAULT_CONTEXT_TOKENS,
        help="context per request whose KV cache each step reads (default 2048; 0 = weights only)",
    )
    parser.add_argument("--dtype", choices=("bf16", "fp8", "int4"), default="bf16")
    parser.add_argument("--tensor-parallel", type=int, default=1)
    parser.add_argument("--max-draft-len", type=int, default=8)
    parser.add_argument(
        "--batches",
        nargs="+",
        default=[",".join(map(str, DEFAULT_BATCHES))],
        help="e.g. 1 32 128 or 1,32,128",
    )
    parser.add_argument("--json", dest="json_path", help="write the plan as JSON to PATH ('-' for stdout)")
    args = parser.parse_args(argv)
    if args.profile is not None:
        return _plan_from_profile(parser, args)
    if args.gpu is None or args.target_params is None:
        parser.error("--gpu and --target-params are required (or give --profile)")
    if args.alpha is None:
        args.alpha = DEFAULT_ALPHA
    if not 0.0 <= args.alpha <= 1.0:
        parser.error("--alpha must be within [0, 1]")
    if args.max_draft_len < 1 or args.tensor_parallel < 1:
        parser.error("--max-draft-len and --tensor-parallel must be at least 1")
    try:
        batches = _parse_batches(args.batches)
    except (ValueError, argparse.ArgumentTypeError) as error:
        parser.error(f"--batches: {error}")

    def setup_with(draft_params: float) -> ModelSetup:
        return ModelSetup(
            gpu=GPUS[args.gpu],
            target_params=args.target_params,
            draft_params=draft_params,
            bytes_per_param=BYTES_PER_PARAM[args.dtype],
            tensor_parallel=args.tensor_parallel,
            context_tokens=args.context_tokens,
        )

    common = {
        "gpu": args.gpu,
        "target_params": args.target_params,
        "alpha": args.alpha,
        "context_tokens": args.context_tokens,
        "dtype": args.dtype,
        "tensor_parallel": args.tensor_parallel,
        "max_draft_len": args.max_draft_len,
    }
    result: dict[str, Any]
    if args.draft_params is not None:
        plan = plan_for(setup_with(args.draft_params), args.alpha, batches, args.max_draft_len)
        text = _format_plan(plan, args.alpha)
        result = {**common, **plan}
    else:
        candidates = [d for d in CANDIDATE_DRAFT_PARAMS if d < args.target_params]
        plans = [plan_for(setup_with(d), args.alpha, batches, args.max_draft_len) for d in candidates]
        text = _format_candidates(plans, batches)
        result = {**common, "candidates": plans}

    header = (
        f"{args.gpu} x{args.tensor_parallel}, target {_params_text(args.target_params)} {args.dtype}, "
        f"alpha {args.alpha:.2f}, context {args.context_tokens:g} tokens"
    )
    out = sys.stderr if args.json_path == "-" else sys.stdout
    print(header, file=out)
    print(text, file=out)
    write_json(result, args.json_path)
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


def _plan_from_profile(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from specops import profiles
    from specops.domain.profile import ProfileError

    try:
        profile = profiles.resolve(args.profile)
    except (OSError, ProfileError, ValueError) as error:
        parser.error(f"--profile: {error}")
    alpha = args.alpha if args.alpha is not None else profile.alpha
    if alpha is None:
        alpha = DEFAULT_ALPHA
    if not 0.0 <= alpha <= 1.0:
        parser.error("--alpha must be within [0, 1]")
    try:
        batches = _parse_batches(args.batches)
    except (ValueError, argparse.ArgumentTypeError) as error:
        parser.error(f"--batches: {error}")
    plan = plan_from_profile(profile, alpha, batches)
    out = sys.stderr if args.json_path == "-" else sys.stdout
    print(f"profile {profile.name}, alpha {alpha:.2f} (measured step times, not the roofline)", file=out)
    print(f"{'batch':>7}  {'best length':>11}  {'speedup':>8}", file=out)
    for row in plan["by_batch"]:
        length = row["best_draft_length"]
        shown = "off" if length == 0 else str(length)
        print(f"{row['batch']:>7}  {shown:>11}  {row['best_speedup']:>7.2f}x", file=out)
    found = plan["break_even_batch"]
    print(f"break-even batch: {found if found is not None else 'none up to 1024'}", file=out)
    write_json(plan, args.json_path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
