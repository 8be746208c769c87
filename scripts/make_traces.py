"""Derive the policy benchmark's load traces from the Azure LLM inference trace 2023.

    .venv/bin/python scripts/make_traces.py [--data /work/shared/data/azure-llm-2023] [--seed 7]

Writes operator/specops/bench/traces/*.csv (header t_seconds,batch,alpha). Deterministic for
a given seed and input. Method:

1. Arrivals: the conversation trace's requests (arrival time, ContextTokens, GeneratedTokens),
   times relative to the first. To set the load to m(t) times the original mean rate we
   superimpose COPIES copies of the hour, each cyclically shifted by a random offset, and keep a
   request with probability m(t) / trend / COPIES, where trend is the original's rate over a
   10-minute window relative to its mean (a larger population of independent users). That keeps the real minute-scale burstiness and the
   real output-length mix while m(t) alone sets the slow load shape.
2. Batch: a continuous-batching replica of the 70B target on one H100 (the `perf` roofline,
   weights only, speculation off). A request runs from its arrival, through its prefill
   (compute-bound, 2 * params * ContextTokens / FLOP/s), until its GeneratedTokens are decoded at
   the current per-token latency `target_step_time(batch)`. Every decoding request gains tokens
   at the same rate, so the simulation is exact and event-driven. The batch column is the
   time-averaged number of running requests over each interval. It is treated as given by the
   benchmark (the policy's own effect on decode speed is not fed back).
3. Alpha: a plausible slow drift (a sine over tens of minutes, as the traffic mix changes) plus
   an Ornstein-Uhlenbeck wander, clipped to [0.3, 0.95].

Load levels are set relative to the break-even batch of the 70B/7B H100 case at alpha 0.8 (where
no draft length 1..8 pays any more: `perf.best_length_break_even_batch`).
"""

from __future__ import annotations

import argparse
import csv
import heapq
import math
import random
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from specops.domain.perf import GPUS, ModelSetup, best_length_break_even_batch, target_step_time  # noqa: E402

SETUP = ModelSetup(GPUS["H100"], 70e9, 7e9)
OUT_DIR = ROOT / "operator" / "specops" / "bench" / "traces"
WARM_UP_S = 600.0
MAX_RUNNING = 384
COPIES = 16  # independent shifted copies superimposed, each thinned to m(t) / trend / COPIES


@dataclass(frozen=True)
class Request:
    t: float
    context_tokens: int
    generated_tokens: int


def load_requests(path: Path) -> tuple[list[Request], float]:
    """Requests with times relative to the first, and the span of the trace in seconds."""
    rows = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            stamp = datetime.strptime(row["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f")
            rows.append((stamp, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
    rows.sort()
    first = rows[0][0]
    requests = [Request((s - first).total_seconds(), c, max(1, g)) for s, c, g in rows]
    return requests, requests[-1].t + 1.0


def rate_trend(requests: list[Request], span: float) -> list[float]:
    """The original arrival rate over a centred 10-minute window, relative to its mean, per second."""
    per_second = [0] * int(span + 1)
    for r in requests:
        per_second[int(r.t)] += 1
    n = len(per_second)
    half = 300
    window = sum(per_second[k % n] for k in range(-half, half))
    mean = len(requests) / n
    trend = []
    for t in range(n):
        trend.append(window / (2 * half) / mean)
        window += per_second[(t + half) % n] - per_second[(t - half) % n]
    return trend


def scaled_arrivals(
    requests: list[Request], span: float, multiplier: Callable[[float], float], rng: random.Random
) -> list[Request]:
    """Arrivals over [-WARM_UP_S, span) at `multiplier(t)` times the original mean rate.

    The original's slow trend (10-minute window) is divided out, its faster burstiness kept.
    """
    trend = rate_trend(requests, span)
    copies = max(COPIES, math.ceil(max(multiplier(t) for t in range(0, int(span))) / min(trend)))
    out = []
    for j in range(copies):
        offset = 0.0 if j == 0 else rng.uniform(0.0, span)
        for request in requests:
            t = (request.t + offset) % span
            for t_out in (t, t - span):
                if t_out < -WARM_UP_S:
                    continue
                keep = multiplier(max(0.0, t_out)) / trend[int(request.t)] / copies
                if rng.random() < keep:
                    out.append(Request(t_out, request.context_tokens, request.generated_tokens))
    out.sort(key=lambda r: r.t)
    return out


def running_requests(arrivals: list[Request], span: float, interval: float) -> list[float]:
    """Time-averaged running requests per interval over [0, span), continuous batching.

    At most MAX_RUNNING requests run at once (the engine's max batch size); later arrivals wait
    in a FIFO queue and are not counted, as engines report running and waiting separately.
    """
    flops = SETUP.gpu.bf16_flops * SETUP.efficiency
    n_intervals = int(span // interval)
    area = [0.0] * n_intervals

    def accumulate(t0: float, t1: float, count: int) -> None:
        a = max(t0, 0.0)
        while a < t1:
            k = int(a // interval)
            if k >= n_intervals:
                return
            b = min(t1, (k + 1) * interval)
            area[k] += count * (b - a)
            a = b

    t = -WARM_UP_S
    virtual = 0.0  # tokens decoded by a request that has been decoding since t = -WARM_UP_S
    prefilling: list[tuple[float, int]] = []  # heap of (prefill done time, generated tokens)
    finishing: list[float] = []  # heap of the virtual time at which each decoding request finishes
    waiting: deque[Request] = deque()
    running = 0
    i_arrival = 0

    def admit(now: float) -> None:
        nonlocal running
        while waiting and running < MAX_RUNNING:
            r = waiting.popleft()
            running += 1
            done = now + 2.0 * SETUP.target_params * r.context_tokens / flops
            heapq.heappush(prefilling, (done, r.generated_tokens))

    while t < span:
        tpot = target_step_time(SETUP, max(1, running))
        next_arrival = arrivals[i_arrival].t if i_arrival < len(arrivals) else math.inf
        next_prefill = prefilling[0][0] if prefilling else math.inf
        next_finish = t + (finishing[0] - virtual) * tpot if finishing else math.inf
        t_next = max(t, min(next_arrival, next_prefill, next_finish, span))
        accumulate(t, t_next, running)
        virtual += (t_next - t) / tpot
        t = t_next
        if t_next == next_finish:
            heapq.heappop(finishing)
            running -= 1
        elif t_next == next_prefill:
            _, tokens = heapq.heappop(prefilling)
            heapq.heappush(finishing, virtual + tokens)
        elif t_next == next_arrival:
            waiting.append(arrivals[i_arrival])
            i_arrival += 1
        admit(t)
    return [a / interval for a in area]


def alpha_series(
    n: int, interval: float, rng: random.Random, base: float, drift: float, period_s: float, wander: float
) -> list[float]:
    """Slow sinusoidal drift plus an Ornstein-Uhlenbeck wander (time constant 120 s)."""
    phase = rng.uniform(0.0, 2 * math.pi)
    decay = math.exp(-interval / 120.0)
    ou = 0.0
    out = []
    for k in range(n):
        ou = ou * decay + rng.gauss(0.0, wander * math.sqrt(1 - decay * decay))
        value = base + drift * math.sin(2 * math.pi * k * interval / period_s + phase) + ou
        out.append(min(0.95, max(0.3, value)))
    return out


def write_trace(path: Path, interval: float, batch: list[float], alpha: list[float]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["t_seconds", "batch", "alpha"])
        for k, (b, a) in enumerate(zip(batch, alpha, strict=True)):
            writer.writerow([f"{k * interval:g}", f"{b:.2f}", f"{a:.4f}"])


def calibrate(requests: list[Request], span: float, target_batch: float, seed: int) -> float:
    """Constant multiplier whose mean running requests is `target_batch` (secant on Little's law)."""
    m = 1.0
    for _ in range(4):
        level = m

        def constant(_t: float, level: float = level) -> float:
            return level

        batch = running_requests(scaled_arrivals(requests, span, constant, random.Random(seed)), span, 60.0)
        m *= target_batch / (sum(batch) / len(batch))
    return m


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/azure-llm-2023"))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)

    requests, span = load_requests(args.data / "AzureLLMInferenceTrace_conv.csv")
    break_even = best_length_break_even_batch(SETUP, 0.8, 8)
    assert break_even is not None
    per_unit = calibrate(requests, span, 100.0, args.seed) / 100.0  # multiplier per running request
    print(f"break-even batch {break_even}; multiplier per running request {per_unit:.4f}")

    at_break_even = calibrate(requests, span, break_even, args.seed)
    burst_rng = random.Random(args.seed + 1)
    bursts = []
    t_burst = burst_rng.uniform(60.0, 300.0)
    while t_burst < span:
        length = burst_rng.uniform(60.0, 240.0)
        bursts.append((t_burst, t_burst + length))
        t_burst += length + burst_rng.uniform(120.0, 420.0)

    def bursty(t: float) -> float:
        level = 1.1 if any(a <= t < b for a, b in bursts) else 0.25
        return level * break_even * per_unit

    def diurnal(t: float) -> float:
        night, peak = 0.15, 1.1
        return (night + (peak - night) * (1 - math.cos(2 * math.pi * t / span)) / 2) * break_even * per_unit

    specs: dict[str, tuple[float, Callable[[float], float], dict[str, float]]] = {
        "steady_low": (15.0, lambda _t: 0.12 * break_even * per_unit, {"base": 0.8, "drift": 0.04}),
        "diurnal_ramp": (15.0, diurnal, {"base": 0.78, "drift": 0.05}),
        "bursty": (5.0, bursty, {"base": 0.8, "drift": 0.03}),
        "noisy_break_even": (10.0, lambda _t: at_break_even, {"base": 0.8, "drift": 0.03}),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for k, (name, (interval, multiplier, alpha_shape)) in enumerate(specs.items()):
        rng = random.Random(args.seed * 1000 + k)
        batch = running_requests(scaled_arrivals(requests, span, multiplier, rng), span, interval)
        alpha = alpha_series(len(batch), interval, rng, period_s=1800.0, wander=0.02, **alpha_shape)
        write_trace(args.out / f"{name}.csv", interval, batch, alpha)
        print(
            f"{name}: {len(batch)} intervals of {interval:g} s, batch {min(batch):.0f}..{max(batch):.0f}, "
            f"mean {sum(batch) / len(batch):.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
