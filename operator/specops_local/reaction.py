"""Reaction benchmark: how fast drafting stops on every pod once batches pass break-even.

One SpeculativeDeployment (the dense example, several pods, the Triton backend) speculates at low
load in the Dynamic phase, its engines started with a draft-length schedule that gives K=0 at
heavy batches. The engines serve a measured profile (``WORLD``: break-even near batch 100 at
alpha 0.8), not the roofline the operator starts from. At t0 every simulated engine's load jumps past break-even (its running-requests
gauge moves at that instant); the benchmark polls the K each engine drafts every 20 ms and
records when all of them read 0: the engines apply their schedule at every iteration, so no
decision and no restart sits on this path. Then the load falls back, drafting resumes, and the
next run starts after a random pause so the scrape, poll and decision clocks meet t0 at a
different phase each time.

Each run also records when each stage of the observation path saw the change: Prometheus (every
engine's gauge scraped), the operator's metrics snapshot (its poller), the first engine and every
engine at K=0, and status (status.observed.batch past break-even: what the learning sees).

    python -m specops_local.reaction [--runs N] [--json OUT] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx

from specops.api.models import API_VERSION, KIND, SpeculativeDeployment
from specops.domain import perf
from specops.domain.metrics import PROFILES
from specops.domain.revision_step import config_from_spec
from specops.profiles import load_builtin
from specops_local.sim import MAX_RUNNING_REQUESTS, LoadPoint
from specops_local.stack import LocalStack, fast_resource, interrupt_cancels, local_stack, log_to_file

NAME = "llama-70b-chat"
EXAMPLE = "dense-70b-7b.yaml"
REPLICAS = 4
ALPHA = 0.8
LOW = LoadPoint(batch=16, alpha=ALPHA)
HIGH = LoadPoint(batch=300, alpha=ALPHA)  # the engine runs at most 256 at once: past break-even (~251)
BACKEND = "triton"
WORLD = "llama70b-small-draft-4xh100"
# Spec values chosen so that the Dynamic phase comes quickly; then the first speculating revision
# stays (a revision change at most every hour): the runs time the engines' reaction under one
# schedule, not the loop's tuning of it (after a run at 256, a learned schedule may draft K=1 in
# the band that ends there).
SPEC = {"interval": "1s", "baseline": "2s", "soak": "2s", "minInterval": "1h"}
TARGET_MEDIAN_S = 3.0
HPA_SYNC_PERIOD_S = 15.0  # kube-controller-manager --horizontal-pod-autoscaler-sync-period default
KEDA_POLLING_INTERVAL_S = 30.0  # ScaledObject pollingInterval default
POLL_S = 0.02
OFF_DEADLINE_S = 20.0
ON_DEADLINE_S = 30.0


class BenchFailed(Exception):
    """A run did not reach the state it waits for within its deadline."""


@dataclass(frozen=True)
class RunTiming:
    """Seconds after t0 at which each stage saw the load past break-even (None: not seen)."""

    run: int
    prometheus_s: float | None  # every pod's batch gauge above break-even in Prometheus
    snapshot_s: float | None  # the operator's in-memory metrics snapshot shows it
    first_pod_s: float | None  # the first engine at its schedule's K for the heavy batch
    all_pods_s: float  # every engine at its schedule's K for the heavy batch: the reaction time
    status_s: float | None  # status.observed.batch past break-even
    back_on_s: float  # after the load fell again, every engine drafting (K>0) again
    high_k: int = 0  # the largest K the engines drafted at the heavy batch (0 where the schedule says so)


@dataclass(frozen=True)
class ReactionReport:
    runs: list[RunTiming]
    replicas: int
    scrape_interval_s: float
    decision_interval_s: float
    break_even_batch: int | None
    off_threshold_batch: int | None

    @property
    def reaction_s(self) -> list[float]:
        return [run.all_pods_s for run in self.runs]

    @property
    def median_s(self) -> float:
        return statistics.median(self.reaction_s)

    @property
    def p90_s(self) -> float:
        return percentile(self.reaction_s, 0.9)

    @property
    def max_s(self) -> float:
        return max(self.reaction_s)

    @property
    def met(self) -> bool:
        return self.median_s <= TARGET_MEDIAN_S

    def stage_medians(self) -> dict[str, float | None]:
        def median_of(values: list[float | None]) -> float | None:
            seen = [v for v in values if v is not None]
            return round(statistics.median(seen), 3) if seen else None

        return {
            "prometheus_s": median_of([r.prometheus_s for r in self.runs]),
            "snapshot_s": median_of([r.snapshot_s for r in self.runs]),
            "first_pod_s": median_of([r.first_pod_s for r in self.runs]),
            "all_pods_s": median_of([r.all_pods_s for r in self.runs]),
            "status_s": median_of([r.status_s for r in self.runs]),
            "back_on_s": median_of([r.back_on_s for r in self.runs]),
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "benchmark": "reaction",
            "runs": [asdict(run) for run in self.runs],
            "median_s": round(self.median_s, 3),
            "p90_s": round(self.p90_s, 3),
            "max_s": round(self.max_s, 3),
            "scrape_interval_s": self.scrape_interval_s,
            "decision_interval_s": self.decision_interval_s,
            "target_median_s": TARGET_MEDIAN_S,
            "met": self.met,
            "stage_medians_s": self.stage_medians(),
            "replicas": self.replicas,
            "load": {"low_batch": LOW.batch, "high_batch": HIGH.batch, "alpha": ALPHA},
            "break_even_batch": self.break_even_batch,
            "off_threshold_batch": self.off_threshold_batch,
            "spec": SPEC,
            "poll_interval_s": POLL_S,
            "for_scale": {
                "hpa_sync_period_s": HPA_SYNC_PERIOD_S,
                "keda_polling_interval_s": KEDA_POLLING_INTERVAL_S,
            },
        }


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


# ---------------------------------------------------------------- probes


async def until(
    condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str, every_s: float = 0.05
) -> float:
    """Poll ``condition`` until true; the loop time it became true. BenchFailed after the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await condition():
        if loop.time() > deadline:
            raise BenchFailed(f"{what}: not within {timeout_s:.0f} s")
        await asyncio.sleep(every_s)
    return loop.time()


def draft_tokens(stack: LocalStack) -> list[int]:
    """The K each ready stable engine drafted at its last iteration (its schedule at its batch)."""
    return [pod.k for pod in stack.pods(NAME, "stable") if pod.ready]


def following(stack: LocalStack, batch: float) -> list[bool]:
    """Per ready stable engine: it carries ``batch`` and drafts the K its own schedule gives there."""
    return [
        pod.batch >= batch and pod.k == pod.k_at(pod.batch) for pod in stack.pods(NAME, "stable") if pod.ready
    ]


def operator_batch(stack: LocalStack) -> float | None:
    """The batch in the operator's latest metrics snapshot (read from its memory, for diagnosis only)."""
    run = stack.operator.run
    services = getattr(run.memo, "services", None) if run is not None else None
    poller = services.metrics.poller(stack.prometheus.url, BACKEND) if services is not None else None
    if poller is None:
        return None
    measurement = poller.latest.measurements.get((stack.namespace, NAME, "stable"))
    return None if measurement is None else measurement.batch


async def speculation_status(stack: LocalStack) -> dict[str, Any]:
    body = await stack.kube.get(API_VERSION, KIND, stack.namespace, NAME) or {}
    speculation: dict[str, Any] = body.get("status", {}).get("speculation", {})
    return speculation


async def prometheus_min_batch(stack: LocalStack) -> float | None:
    """The smallest running batch over the resource's pods, as Prometheus has it now."""
    promql = f'min({PROFILES[BACKEND].batch_gauge}{{specops_deployment="{NAME}"}})'
    with contextlib.suppress(httpx.HTTPError, RuntimeError):
        vector = await stack.prometheus.query(promql)
        if vector:
            return float(vector[0]["value"][1])
    return None


async def ready_to_start(stack: LocalStack) -> bool:
    """Every engine drafting, the operator seeing low load, the Dynamic phase, no rollout running."""
    lengths = draft_tokens(stack)
    if len(lengths) != REPLICAS or not all(n > 0 for n in lengths):
        return False
    batch = operator_batch(stack)
    if batch is None or batch > LOW.batch + 1:
        return False
    speculation = await speculation_status(stack)
    if speculation.get("controlPhase") != "Dynamic" or speculation.get("state") != "on":
        return False
    return not speculation.get("rollout")


# ---------------------------------------------------------------- one run


async def one_run(stack: LocalStack, number: int, saturated_batch: float) -> RunTiming:
    """Switch the load past break-even at t0 and time every stage until all pods stop speculating."""
    loop = asyncio.get_running_loop()
    seen: dict[str, float] = {}

    async def watch_prometheus() -> None:
        while "prometheus" not in seen:
            batch = await prometheus_min_batch(stack)
            if batch is not None and batch >= saturated_batch:
                seen["prometheus"] = loop.time()
            await asyncio.sleep(0.05)

    async def watch_status() -> None:
        while "status" not in seen:
            body = await stack.kube.get(API_VERSION, KIND, stack.namespace, NAME) or {}
            batch = (body.get("status") or {}).get("observed", {}).get("batch")
            if batch is not None and batch >= saturated_batch:
                seen["status"] = loop.time()
            await asyncio.sleep(0.05)

    t0 = loop.time()
    stack.set_load(NAME, HIGH)
    watchers = [
        asyncio.create_task(watch_prometheus(), name="bench: prometheus"),
        asyncio.create_task(watch_status(), name="bench: status"),
    ]
    high_ks: list[int] = []
    try:
        deadline = t0 + OFF_DEADLINE_S
        while True:
            now = loop.time()
            lengths = draft_tokens(stack)
            batch = operator_batch(stack)
            if "snapshot" not in seen and batch is not None and batch >= saturated_batch:
                seen["snapshot"] = now
            follow = following(stack, saturated_batch)
            if "first_pod" not in seen and any(follow):
                seen["first_pod"] = now
            if follow and all(follow):
                high_ks = lengths
                all_off = now
                break
            if now > deadline:
                speculation = await speculation_status(stack)
                raise BenchFailed(
                    f"run {number}: engines not at their schedule's K after {OFF_DEADLINE_S:.0f} s: K {lengths}; the "
                    f"schedule in force: {speculation.get('schedule')} ({speculation.get('reason')}: "
                    f"{speculation.get('message')})"
                )
            await asyncio.sleep(POLL_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*watchers), timeout=3.0)
    finally:
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)

    t_low = loop.time()
    stack.set_load(NAME, LOW)

    async def all_on() -> bool:
        lengths = draft_tokens(stack)
        return bool(lengths) and all(n > 0 for n in lengths)

    back_on = await until(all_on, ON_DEADLINE_S, f"run {number}: drafting again", every_s=POLL_S)

    def since_t0(key: str) -> float | None:
        return round(seen[key] - t0, 3) if key in seen else None

    return RunTiming(
        run=number,
        prometheus_s=since_t0("prometheus"),
        snapshot_s=since_t0("snapshot"),
        first_pod_s=since_t0("first_pod"),
        all_pods_s=round(all_off - t0, 3),
        status_s=since_t0("status"),
        back_on_s=round(back_on - t_low, 3),
        high_k=max(high_ks, default=0),
    )


def off_threshold(setup: perf.ModelSetup, margin: float, max_length: int) -> int | None:
    """Smallest batch at which even the best length is modelled below 1 + margin (where a schedule's band gets K=0)."""
    for batch in range(1, 4097):
        if perf.best_draft_length(setup, ALPHA, batch, max_length)[1] < 1.0 + margin:
            return batch
    return None


async def run_reaction(
    runs: int = 7, *, workdir: Path, out: TextIO | None = None, seed: int = 7
) -> ReactionReport:
    out = out if out is not None else sys.stdout
    say: Callable[[str], None] = lambda text: print(text, file=out, flush=True)  # noqa: E731
    jitter = random.Random(seed)
    world = load_builtin(WORLD)
    async with local_stack(
        workdir, load=LOW, pod_options=lambda owner, variant: {"serving_profile": world}
    ) as stack:
        task = asyncio.current_task()
        assert task is not None
        with interrupt_cancels(task, lambda: say("\nInterrupted: stopping everything...")):
            body = fast_resource(
                EXAMPLE,
                prometheus_url=stack.prometheus.url,
                namespace=stack.namespace,
                replicas=REPLICAS,
                interval=SPEC["interval"],
                baseline=SPEC["baseline"],
                soak=SPEC["soak"],
                min_interval=SPEC["minInterval"],
                backend=BACKEND,
            )
            await stack.kube.create(body)
            spec = SpeculativeDeployment.model_validate(body).spec
            config = config_from_spec(spec, spec.draft)
            saturated = min(HIGH.batch, MAX_RUNNING_REQUESTS)
            say(
                f"{NAME}: {REPLICAS} {BACKEND} pods, decisions every {SPEC['interval']}, scrape every "
                f"{stack.scrape_interval_s:g} s, baseline {SPEC['baseline']}, "
                f"soak {SPEC['soak']}; load {LOW.batch:.0f} -> {HIGH.batch:.0f} requests per pod "
                f"({saturated:.0f} running), alpha {ALPHA}"
            )
            say("waiting for the Dynamic phase at low load ...")
            await until(lambda: ready_to_start(stack), 90.0, "Dynamic phase, speculating")
            timings: list[RunTiming] = []
            for number in range(1, runs + 1):
                await until(lambda: ready_to_start(stack), 60.0, f"run {number}: ready")
                await asyncio.sleep(jitter.uniform(0.0, 1.0))  # a random phase against the 1 s clocks
                timing = await one_run(stack, number, saturated)
                timings.append(timing)
                say(
                    f"run {number}: all {REPLICAS} engines at their schedule's K ({timing.high_k}) for the heavy "
                    f"batch after {timing.all_pods_s:.2f} s "
                    f"(drafting again {timing.back_on_s:.1f} s after the load fell)"
                )
    return ReactionReport(
        runs=timings,
        replicas=REPLICAS,
        scrape_interval_s=stack.scrape_interval_s,
        decision_interval_s=stack.decision_interval_s,
        break_even_batch=perf.best_length_break_even_batch(config.setup, ALPHA, config.max_k),
        off_threshold_batch=off_threshold(config.setup, config.margin, config.max_k),
    )


# ---------------------------------------------------------------- report


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(report: ReactionReport) -> str:
    header = ["run", "prometheus", "snapshot", "first pod", "ALL PODS", "K", "status", "back on"]
    rows = [
        [
            str(r.run),
            fmt(r.prometheus_s),
            fmt(r.snapshot_s),
            fmt(r.first_pod_s),
            fmt(r.all_pods_s),
            str(r.high_k),
            fmt(r.status_s),
            fmt(r.back_on_s),
        ]
        for r in report.runs
    ]
    medians = report.stage_medians()
    rows.append(
        [
            "median",
            *(fmt(medians[k]) for k in ("prometheus_s", "snapshot_s", "first_pod_s", "all_pods_s")),
            "",
            *(fmt(medians[k]) for k in ("status_s", "back_on_s")),
        ]
    )
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in table]
    verdict = "met" if report.met else "NOT met"
    return "\n".join(
        [
            "Reaction: seconds after the batch passed break-even until each stage saw it",
            "(prometheus: every engine's gauge scraped; snapshot: the operator's poller has it; first pod / "
            "ALL PODS: at the K their own schedule gives for the heavy batch (K: that K, 0 where the "
            "schedule stops drafting); status: status.observed.batch; back on: after the load fell, every "
            "engine drafting again)",
            *lines,
            "",
            f"all {report.replicas} engines at their schedule's K: median {report.median_s:.2f} s, "
            f"p90 {report.p90_s:.2f} s, max {report.max_s:.2f} s over {len(report.runs)} runs "
            f"(scrape {report.scrape_interval_s:g} s, decisions every {report.decision_interval_s:g} s, "
            f"pods polled every {POLL_S * 1000:.0f} ms)",
            f"target median <= {TARGET_MEDIAN_S:g} s: {verdict}",
            f"modelled break-even (no draft length pays): batch {report.break_even_batch}; a schedule's "
            f"band gets K=0 from batch {report.off_threshold_batch} (best speedup < 1 + margin)",
            f"spec: interval {SPEC['interval']}, reconfigure.minInterval {SPEC['minInterval']}, "
            f"baseline {SPEC['baseline']}, soak {SPEC['soak']}",
            f"for scale: the HPA re-evaluates every {HPA_SYNC_PERIOD_S:g} s and KEDA polls its triggers every "
            f"{KEDA_POLLING_INTERVAL_S:g} s by default",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specops local reaction", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="repetitions (default 7, about 1.5 min)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--workdir", type=Path, help="keep Prometheus data and logs here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if shutil.which("prometheus") is None:
        print("Debian's prometheus is not installed: make prometheus (or: sudo apt-get install prometheus)")
        return 2
    started = time.monotonic()
    with contextlib.ExitStack() as cleanup:
        workdir = args.workdir or Path(
            cleanup.enter_context(tempfile.TemporaryDirectory(prefix="specops-bench-"))
        )
        workdir.mkdir(parents=True, exist_ok=True)
        cleanup.enter_context(log_to_file(workdir / "operator.log"))
        try:
            report = asyncio.run(run_reaction(args.runs, workdir=workdir))
        except BenchFailed as error:
            print(f"reaction benchmark failed: {error}")
            return 1
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("Stopped.")
            return 130
    print()
    print(render(report))
    print(f"(wall time {time.monotonic() - started:.0f} s)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.as_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
