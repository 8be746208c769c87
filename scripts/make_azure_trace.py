"""Derive the `azure_conv` policy-benchmark trace from the Azure LLM inference trace 2023.

    .venv/bin/python scripts/make_azure_trace.py [--data /work/shared/data/azure-llm-2023]
        [--scale 1] [--replicas 1] [--interval 10] [--tpot-ms 50] [--seed 11]

Writes operator/specops/bench/traces/azure_conv.csv (header t_seconds,batch,alpha); reads only
the local copy of `AzureLLMInferenceTrace_conv.csv` and is deterministic for a given input
and options. Unlike `make_traces.py`, the load shape is the trace's own, unreshaped:

1. Each request (arrival, GeneratedTokens) is running from its arrival until its output is
   decoded at a fixed per-token time (`--tpot-ms`, 50 ms: a 70B target on one H100 at a
   moderate batch; the roofline's plain step at batch 1 is 42 ms).
2. Per interval, the mean number of running requests is the time they spend running inside it
   divided by its length: Little's law (L = lambda x W) applied per interval, with the real
   arrivals for lambda and output tokens x per-token time for W.
3. Scale: the recorded arrivals times `--scale` (1), spread evenly over `--replicas` pods (1):
   one pod serves the sampled service as recorded, about 59 running requests on average
   (10-90 % range 47-71, extremes 23 and 88). That load sits across the break-even batches of
   the shipped early-break-even profiles (63 and 78) with the real minute-scale swings, and well
   under the roofline's (251). Only scale / replicas matters.
4. Alpha is synthetic (the trace records no acceptance): an Ornstein-Uhlenbeck wander around
   0.78 (sd 0.03, 5-minute correlation), clipped to [0.5, 0.95].

The first and last partial intervals are dropped.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "operator" / "specops" / "bench" / "traces" / "azure_conv.csv"
DATA = Path("/work/shared/data/azure-llm-2023")
SOURCE = "AzureLLMInferenceTrace_conv.csv"


def read_requests(path: Path) -> list[tuple[float, int]]:
    """(seconds since the first arrival, generated tokens) per request, in arrival order."""
    with path.open(newline="") as handle:
        rows = [
            (datetime.fromisoformat(row["TIMESTAMP"][:26]), int(row["GeneratedTokens"]))
            for row in csv.DictReader(handle)
        ]
    rows.sort()
    first = rows[0][0]
    return [((t - first).total_seconds(), tokens) for t, tokens in rows]


def running_per_interval(
    requests: list[tuple[float, int]], interval_s: float, tpot_s: float, per_pod: float
) -> list[float]:
    """Mean running requests per pod in each full interval (Little's law per interval)."""
    end = max(t for t, _ in requests)
    count = int(end // interval_s)
    busy = [0.0] * count
    for arrival, tokens in requests:
        finish = arrival + tokens * tpot_s
        first = int(arrival // interval_s)
        for k in range(first, min(count, int(finish // interval_s) + 1)):
            lo, hi = k * interval_s, (k + 1) * interval_s
            busy[k] += max(0.0, min(hi, finish) - max(lo, arrival))
    return [b / interval_s * per_pod for b in busy]


def alpha_series(count: int, interval_s: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    mean, sd, tau = 0.78, 0.03, 300.0
    keep = math.exp(-interval_s / tau)
    value, out = mean, []
    for _ in range(count):
        value = mean + keep * (value - mean) + sd * math.sqrt(1 - keep * keep) * rng.gauss(0.0, 1.0)
        out.append(min(0.95, max(0.5, value)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--tpot-ms", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    requests = read_requests(args.data / SOURCE)
    batches = running_per_interval(requests, args.interval, args.tpot_ms / 1e3, args.scale / args.replicas)
    # the first interval starts with an empty replica: drop the first minute of warm-up
    warm_up = math.ceil(60.0 / args.interval)
    batches = batches[warm_up:]
    alphas = alpha_series(len(batches), args.interval, args.seed)
    with args.out.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["t_seconds", "batch", "alpha"])
        for k, (batch, alpha) in enumerate(zip(batches, alphas, strict=True)):
            writer.writerow([f"{k * args.interval:g}", f"{batch:.2f}", f"{alpha:.4f}"])
    mean = sum(batches) / len(batches)
    print(f"{args.out}: {len(batches)} intervals, batch mean {mean:.1f}, min {min(batches):.1f}, "
          f"max {max(batches):.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
