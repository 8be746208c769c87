"""`specops profile`: measure a live engine's speedup curve before going live, as a serving profile.

For every concurrency N and draft length g asked for, N workers send greedy requests through
the ensemble's generate endpoint with `num_draft_tokens = g` (the specops BLS takes it per
request) for `--duration`, so the engine decodes a batch of about N. Per-token latency is
the engine's own (the mean of the BLS's `specops_time_per_output_token_seconds` histogram
over the cell, from the metrics port), else the client's wall time / tokens per request
(which includes HTTP overhead); the tokens emitted per verification step (E) come from the
BLS's counters (`specops_spec_decode_accepted_tokens_total` / `..._steps_total`, the
difference over the cell). A cell gives

    plain_ms[N]    = per-token latency at g = 0
    round_ms[g][N] = per-token latency at g x E (one round emits E tokens)

and the profile's alpha is inverted from the measured E. The output is the serving profile
format of docs/profiles.md, with the raw cells under `measured` (ignored by the loader).
Requests run to `--max-tokens` (the engine must not stop early at an end token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from specops.api.units import parse_duration
from specops.domain.acceptance import alpha_from_mean_accepted_length
from specops.domain.perf import expected_tokens
from specops.domain.profile import ServingProfile

ENSEMBLE = "ensemble"
PROMPT = "Explain speculative decoding in one paragraph."
COUNTERS = (
    "specops_spec_decode_accepted_tokens_total",
    "specops_spec_decode_steps_total",
    "specops_time_per_output_token_seconds_sum",
    "specops_time_per_output_token_seconds_count",
)


@dataclass(frozen=True)
class Cell:
    """One (concurrency, draft length) measurement."""

    concurrency: int
    draft_length: int
    requests: int
    tokens: int
    per_token_s: float  # the engine's own per-token latency where it reports one, else the client's
    client_per_token_s: float  # wall time per token as the client saw it (includes HTTP overhead)
    tokens_per_step: float | None  # E, from the engine's counters; None when not measured

    @property
    def alpha(self) -> float | None:
        if self.draft_length <= 0 or self.tokens_per_step is None:
            return None
        e = min(max(self.tokens_per_step, 1.0), self.draft_length + 1.0)
        return alpha_from_mean_accepted_length(e, self.draft_length)


def _numbers(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return sorted(set(values))


def parse_counters(text: str) -> dict[str, float]:
    """The sums of the BLS counters in a Prometheus text exposition (every draft's series)."""
    sums = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in sums:
            try:
                sums[name] += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return sums


async def _counters(client: httpx.AsyncClient, metrics_url: str | None) -> dict[str, float] | None:
    if metrics_url is None:
        return None
    try:
        response = await client.get(metrics_url)
    except httpx.HTTPError:
        return None
    return parse_counters(response.text) if response.status_code == 200 else None


async def measure_cell(
    client: httpx.AsyncClient,
    url: str,
    metrics_url: str | None,
    concurrency: int,
    draft_length: int,
    duration_s: float,
    max_tokens: int,
) -> Cell:
    """Run `concurrency` workers for `duration_s`; every request decodes `max_tokens` tokens."""
    generate = f"{url}/v2/models/{ENSEMBLE}/generate"
    body = {"text_input": PROMPT, "max_tokens": max_tokens, "temperature": 0.0}
    body["num_draft_tokens"] = draft_length
    latencies: list[float] = []
    before = await _counters(client, metrics_url)
    deadline = time.monotonic() + duration_s

    async def worker() -> None:
        while time.monotonic() < deadline:
            started = time.monotonic()
            response = await client.post(generate, json=body)
            if response.status_code != 200:
                raise RuntimeError(f"generate answered HTTP {response.status_code}: {response.text[:200]}")
            latencies.append(time.monotonic() - started)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    after = await _counters(client, metrics_url)
    tokens_per_step = None
    client_s = sum(latencies) / (len(latencies) * max_tokens)
    per_token = client_s
    if before is not None and after is not None:
        delta = {name: after[name] - before[name] for name in COUNTERS}
        accepted, steps, tpot_sum, tpot_count = (delta[name] for name in COUNTERS)
        if draft_length > 0 and steps > 0:
            tokens_per_step = 1.0 + accepted / steps
        if tpot_count > 0 and tpot_sum > 0:
            per_token = tpot_sum / tpot_count
    tokens = len(latencies) * max_tokens
    return Cell(concurrency, draft_length, len(latencies), tokens, per_token, client_s, tokens_per_step)


def build_profile(name: str, cells: list[Cell], alpha: float | None = None) -> dict[str, Any]:
    """The serving profile of the cells (every concurrency needs a g = 0 cell), plus the raw cells."""
    batches = sorted({c.concurrency for c in cells})
    lengths = sorted({c.draft_length for c in cells if c.draft_length > 0})
    by = {(c.concurrency, c.draft_length): c for c in cells}
    missing = [b for b in batches if (b, 0) not in by]
    if missing or not lengths:
        raise ValueError("a profile needs length 0 and at least one draft length at every concurrency")
    measured = [a for c in cells if (a := c.alpha) is not None]
    if alpha is None:
        if not measured:
            raise ValueError(
                "acceptance was not measured (no BLS counters on the metrics port): pass --alpha"
            )
        alpha = sum(measured) / len(measured)

    def round_ms(cell: Cell) -> float:
        e = (
            cell.tokens_per_step
            if cell.tokens_per_step is not None
            else expected_tokens(alpha, cell.draft_length)
        )
        return cell.per_token_s * e * 1e3

    profile = {
        "name": name,
        "batches": batches,
        "plain_ms": [round(by[(b, 0)].per_token_s * 1e3, 4) for b in batches],
        "round_ms": {str(g): [round(round_ms(by[(b, g)]), 4) for b in batches] for g in lengths},
        "alpha": round(alpha, 4),
        "source": "specops profile: measured at fixed concurrency through the ensemble's generate endpoint",
        "measured": [
            {
                "concurrency": c.concurrency,
                "num_draft_tokens": c.draft_length,
                "requests": c.requests,
                "tokens": c.tokens,
                "per_token_ms": round(c.per_token_s * 1e3, 4),
                "client_per_token_ms": round(c.client_per_token_s * 1e3, 4),
                "tokens_per_step": None if c.tokens_per_step is None else round(c.tokens_per_step, 4),
            }
            for c in cells
        ],
    }
    ServingProfile.from_dict(profile)  # what is written must load
    return profile


def table(profile: ServingProfile) -> str:
    """Per batch: plain ms, and the realised speedup of each length at the profile's alpha."""
    alpha = profile.alpha if profile.alpha is not None else 0.8
    lengths = profile.lengths
    head = f"{'batch':>6} {'plain ms':>9} " + " ".join(f"{'g=' + str(g):>6}" for g in lengths) + "   best"
    lines = [head]
    for batch, plain in zip(profile.batches, profile.plain_ms, strict=True):
        speeds = [profile.speedup(alpha, g, batch) for g in lengths]
        best_g, best_s = profile.best_length(alpha, batch)
        best = "off" if best_g == 0 else f"g={best_g} {best_s:.2f}x"
        lines.append(f"{batch:>6g} {plain:>9.2f} " + " ".join(f"{s:>6.2f}" for s in speeds) + f"   {best}")
    found = profile.break_even_batch(alpha)
    lines.append(f"alpha {alpha:.2f}; break-even batch: {'none up to 1024' if found is None else found}")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    url = args.url if "://" in args.url else f"http://{args.url}"
    url = url.rstrip("/")
    metrics_url = args.metrics_url
    if metrics_url is None and not args.no_metrics:
        host = url.split("://", 1)[1].rsplit(":", 1)[0]
        metrics_url = f"http://{host}:8002/metrics"
    elif metrics_url is not None and "://" not in metrics_url:
        metrics_url = f"http://{metrics_url}/metrics"
    duration = parse_duration(args.duration)
    cells: list[Cell] = []
    plan = [(n, g) for n in args.concurrency for g in sorted(set(args.lengths) | {0})]
    timeout = httpx.Timeout(max(60.0, 4 * duration))
    limits = httpx.Limits(max_connections=max(args.concurrency) + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        for index, (n, g) in enumerate(plan, 1):
            cell = await measure_cell(client, url, metrics_url, n, g, duration, args.max_tokens)
            cells.append(cell)
            bar = "#" * round(30 * index / len(plan))
            print(
                f"\r[{bar:<30}] {index}/{len(plan)} concurrency {n} length {g}: "
                f"{cell.per_token_s * 1e3:.2f} ms/token",
                end="" if index < len(plan) else "\n",
                file=sys.stderr,
                flush=True,
            )
    return build_profile(args.name, cells, args.alpha)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="specops profile",
        description="Measure a live Triton endpoint's per-token latency by concurrency and draft length "
        "and write a serving profile (docs/profiles.md).",
    )
    parser.add_argument("--url", required=True, help="HOST:PORT of Triton's HTTP endpoint")
    parser.add_argument(
        "--metrics-url", default=None, help="HOST:PORT of its metrics endpoint (default: the same host, 8002)"
    )
    parser.add_argument(
        "--no-metrics", action="store_true", help="do not read acceptance (then pass --alpha)"
    )
    parser.add_argument("--concurrency", type=_numbers, default=_numbers("1,2,4,8,16,32"))
    parser.add_argument("--lengths", type=_numbers, default=_numbers("0,1,2,3,4,6,8"))
    parser.add_argument("--duration", default="30s", help="per cell, e.g. 30s")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--alpha", type=float, default=None, help="acceptance, when not measured")
    parser.add_argument("--name", default="measured")
    parser.add_argument("--out", required=True, help="profile JSON to write ('-' for stdout)")
    args = parser.parse_args(argv)
    if min(args.concurrency) < 1:
        parser.error("--concurrency values must be >= 1")
    try:
        profile = asyncio.run(run(args))
    except (httpx.HTTPError, RuntimeError, ValueError) as error:
        print(f"specops profile: {error}", file=sys.stderr)
        return 1
    text = json.dumps(profile, indent=1) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
    print(table(ServingProfile.from_dict(profile)), file=sys.stderr if args.out == "-" else sys.stdout)
    return 0 if all(math.isfinite(v) for v in profile["plain_ms"]) else 1
