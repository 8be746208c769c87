"""`specops bench scale --resources N`: the operator, as its own process, running N SpeculativeDeployments.

The operator runs as `specops run` would in a pod (its own process, production handlers), against
the emulated API server, with Debian's Prometheus scraping one simulated engine per resource (the
dense example's backend, Triton's LLM API model) at a 15 s interval (scrape and decision). This
process hosts only the emulated API server; the
simulated pods and their controller run in `--farms` pod farm processes (`specops_local.pod_farm`,
each serving the Deployments that hash to its shard, over the API server's HTTP API), or in this
process with ``--farms 0``. To fit 2,000 pods on a small machine, the pods do not each run a
background ticker: one task per farm advances every pod's performance model every 10 s, a batch
at a time. Each pod still listens on its own two ports (the engine's HTTP API, metrics) and
starts from the rendered command, args and config files, so discovery, scraping and a revision
rollout (a pod restart, ready ``pod_farm.RESTART_S`` later) are the production paths.

Measured (docs/scale.md explains each figure):
- initial_reconcile_seconds: from creating the N resources until every one is serving;
- cycle_cpu_seconds: the operator process's CPU time per control cycle (one interval), in steady
  state: once every resource's metrics flow (new pods first have no rate window), one interval on;
- promql_queries_per_cycle: instant queries Prometheus answered per cycle (from its own counters);
- api_requests_per_second: requests the API server answered, in steady state (the operator's:
  the pod farms' own requests are left out, as in-process calls were before);
- peak_rss_mib: the operator process's peak resident memory (VmHWM).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specops.api.crd import build_crd
from specops.api.units import parse_duration
from specops.cli_output import write_json
from specops.domain.phases import ACTIVE_PHASES
from specops_local.cluster import EmulatedCluster, emulated_cluster
from specops_local.pod_farm import (
    ADVANCE_BATCH,
    ADVANCE_EVERY_S,
    RESTART_S,
    advance_pods,
    farm_pod_options,
)
from specops_local.prometheus import PrometheusProcess, free_port, run_prometheus
from specops_local.remote_cluster import USER_AGENT as FARM_AGENT
from specops_local.serving import ServingController
from specops_local.sim import LoadPoint
from specops_local.stack import EXAMPLES, interrupt_cancels, operator_environment

EXAMPLE = "dense-70b-7b.yaml"
SERVING_POLL_S = 2.0
READY_POLL_S = 2.0
T = TypeVar("T")
"""How often the benchmark looks whether every resource is reconciled (a scan of every resource)."""
RSS_EVERY_S = 10.0
"""How often the operator's memory is noted while the resources come up."""
MEMORY_EVERY_S = 60.0
"""How often the operator's memory is noted over the whole run: whether it levels off or keeps growing."""
OPERATOR_START_TIMEOUT_S = 60.0
FARM_START_TIMEOUT_S = 60.0
STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class ScaleResult:
    resources: int
    initial_reconcile_seconds: float
    cycle_cpu_seconds: float
    promql_queries_per_cycle: float
    api_requests_per_second: float
    peak_rss_mib: float
    # What the fleet was doing in the window, beside the six figures: the CPU per cycle moves with
    # it more than with most changes, so two runs compare only where these are alike.
    status_writes_per_resource_cycle: float
    length_steps_per_resource_cycle: float
    """Revision changes (RevisionProposed/MeasuredSlowdown Events: a schedule rolled out) per
    resource and cycle."""
    resources_stepping_at_start: int
    """Resources whose last decision changed their revision when the window began."""
    unchanged_share: float
    """The share of the window's ticks whose control inputs had not moved since the resource's last
    step (domain.control_step's fast path: nothing decided again)."""
    machine_reference_cpu_seconds: float
    """The CPU a fixed piece of Python took right after the window, the stack still running
    (`machine_reference`): how fast the machine was then. The same code's cycle read 1.16-1.65
    CPU-s at 2,000 on different days and hours, and in one of those runs the whole stack took half as
    much CPU again as in another for the same reconcile: two runs compare only where this is
    alike too."""
    machine_cpu: str
    """The processor as the kernel names it, and its clock (`machine_cpu`): a VM may name only
    its family. The same code read 1.16-1.65 CPU-s a cycle at 2,000 on one kind of host, 0.46 on
    another (an AMD EPYC at 2.6 GHz, reference 0.054): runs on different processors compare by
    their references at best."""


DEFAULT_ROLLOUT = "30s"
"""Each resource's Baseline and Fixed phases in the benchmark (10 and 30 minutes by default in a
spec): short, so that the fleet is measured in the Dynamic phase, where a deployment spends its
life (calibration, revisions, break-even), not in Baseline."""


def scale_resource(
    index: int, namespace: str, prometheus_url: str, interval: str, rollout: str = DEFAULT_ROLLOUT
) -> dict[str, Any]:
    """The dense example with one replica, a local Prometheus, the given interval and rollout phases."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load((EXAMPLES / EXAMPLE).read_text()))
    body["metadata"] = {"name": f"scale-{index:04d}", "namespace": namespace}
    spec = body["spec"]
    spec["serving"]["replicas"] = 1
    spec["metrics"] = {"prometheus": {"url": prometheus_url}, "interval": interval}
    spec.setdefault("speculation", {})["rollout"] = {"baseline": rollout, "soak": rollout}
    return body


# ------------------------------------------------------------------ the operator process


def _cpu_times(pid: int) -> tuple[float, float, float, float]:
    """A process's user and system CPU seconds, then its reaped children's, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    user, system, children_user, children_system = (int(fields[i]) / ticks for i in (11, 12, 13, 14))
    return user, system, children_user, children_system


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its reaped children."""
    return sum(_cpu_times(pid))


def _cpu_split(pid: int) -> tuple[float, float]:
    """A process's own user and system CPU seconds (system time is the kernel's work for it: its
    sockets' sends and receives, its polls)."""
    user, system, _, _ = _cpu_times(pid)
    return user, system


def _context_switches(pid: int) -> int:
    """A process's voluntary context switches so far, over all its threads: each is a wait that
    blocked (for an event loop, mostly a poll that found nothing ready yet)."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        for line in status.read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                total += int(line.split()[1])
    return total


def _memory_mib(pid: int, field: str) -> float:
    """A process's resident memory from /proc: its peak (VmHWM) or its current size (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def _peak_rss_mib(pid: int) -> float:
    return _memory_mib(pid, "VmHWM")


def _memory_note(pid: int) -> str:
    """Where the operator's memory stands at a step of the run: the peak can come from any of them."""
    return f"the operator's RSS {_memory_mib(pid, 'VmRSS'):.1f} MiB, its peak so far {_peak_rss_mib(pid):.1f} MiB"


@contextlib.asynccontextmanager
async def _sample_memory(pid: int, every_s: float) -> AsyncIterator[list[float]]:
    """The operator's RSS every ``every_s`` seconds while the run lasts (the list grows meanwhile)."""
    found: list[float] = []

    async def sample() -> None:
        while True:
            with contextlib.suppress(OSError):
                found.append(_memory_mib(pid, "VmRSS"))
            await asyncio.sleep(every_s)

    task = asyncio.create_task(sample())
    try:
        yield found
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@dataclass(frozen=True)
class OperatorProcess:
    pid: int
    liveness_url: str
    live_at: float
    """When (monotonic) the liveness endpoint first answered."""
    metrics_url: str


@contextlib.asynccontextmanager
async def operator_process(
    cluster: EmulatedCluster, interval_s: float, log: Path, log_level: str = "warning"
) -> AsyncIterator[OperatorProcess]:
    """`specops run` in its own process against the emulated cluster, once it is live."""
    health_port, metrics_port = free_port(), free_port()
    env = {**os.environ, **operator_environment(cluster.kubeconfig_path, interval_s, interval_s)}
    command = ["-m", "specops.cli", "run", "--metrics-port", str(metrics_port)]
    command += ["--metrics-address", "127.0.0.1", "--log-level", log_level]
    command += ["--liveness", f"http://127.0.0.1:{health_port}/healthz"]
    with log.open("ab") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, *command, env=env, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr
        )
    try:
        await _wait_live(process, f"http://127.0.0.1:{health_port}/healthz", log)
        yield OperatorProcess(
            process.pid,
            f"http://127.0.0.1:{health_port}/healthz",
            time.monotonic(),
            f"http://127.0.0.1:{metrics_port}/metrics",
        )
    finally:
        await _stop_process(process)


async def _wait_live(process: asyncio.subprocess.Process, url: str, log: Path) -> None:
    deadline = time.monotonic() + OPERATOR_START_TIMEOUT_S
    async with httpx.AsyncClient(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                tail = await asyncio.to_thread(log.read_text)
                raise RuntimeError(f"the operator exited ({process.returncode}): {tail[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise TimeoutError(f"the operator was not live within {OPERATOR_START_TIMEOUT_S:g} s")


async def _operator_counters(metrics_url: str) -> dict[str, float] | None:
    """From the operator's metrics endpoint: its time in the garbage collector so far
    (`specops_gc_seconds_total`, by generation as "gc0", "gc1", "gc2") and its ticks by outcome
    (`specops_control_ticks_total`, as "decided" and "unchanged"); None when it does not answer."""
    async with httpx.AsyncClient(timeout=30.0) as http:
        try:
            answer = await http.get(metrics_url)
        except httpx.HTTPError:
            return None
    if answer.status_code != 200:
        return None
    counters = {"gc0": 0.0, "gc1": 0.0, "gc2": 0.0, "decided": 0.0, "unchanged": 0.0}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            if sample.name == "specops_gc_seconds_total":
                counters[f"gc{sample.labels['generation']}"] = sample.value
            elif sample.name == "specops_control_ticks_total":
                counters[sample.labels["outcome"]] = sample.value
    return counters


KOPF_PROBE_CACHE_S = 10.0
"""Kopf answers its liveness endpoint from probe results up to this old."""


async def _liveness(url: str, last_read_at: float) -> str:
    """What the operator's liveness endpoint answers (its ``ticks`` probe: resources ticking on
    time), once the answer to the read at ``last_read_at`` (monotonic) is no longer cached."""
    await asyncio.sleep(max(0.0, last_read_at + KOPF_PROBE_CACHE_S + 0.5 - time.monotonic()))
    async with httpx.AsyncClient(timeout=5.0) as http:
        try:
            answer = await http.get(url)
        except httpx.HTTPError as error:
            return f"unreachable ({type(error).__name__})"
    if answer.status_code != 200:
        return f"HTTP {answer.status_code}: {answer.text[:200]}"
    ticks = answer.json().get("ticks")
    return f"{ticks} resources ticking on time"


# ------------------------------------------------------------------ the fleet of simulated pods


@contextlib.asynccontextmanager
async def in_process_pods(cluster: EmulatedCluster, prometheus: PrometheusProcess) -> AsyncIterator[None]:
    """The simulated pods and their controller in this process (``--farms 0``)."""
    async with ServingController(
        cluster,
        prometheus,
        load=LoadPoint(batch=8, alpha=0.8),
        pod_options=farm_pod_options,
        restart_s=RESTART_S,
        poll_s=SERVING_POLL_S,
    ) as serving:
        stop = asyncio.Event()
        advancer = asyncio.get_running_loop().create_task(
            advance_pods(serving, stop, ADVANCE_EVERY_S, ADVANCE_BATCH)
        )
        try:
            yield
        finally:
            stop.set()
            await advancer


async def _stop_process(process: asyncio.subprocess.Process) -> None:
    """SIGTERM our own child (by PID), SIGKILL if it outlives the grace period."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except TimeoutError:
            process.kill()
            await process.wait()


@contextlib.asynccontextmanager
async def pod_farms(
    cluster: EmulatedCluster, prometheus: PrometheusProcess, farms: int, workdir: Path
) -> AsyncIterator[list[int]]:
    """``farms`` pod farm processes sharing the Deployments; yields their PIDs once all are live.

    Each writes its scrape targets to its own file in Prometheus's targets.d; a farm is live once
    that file exists (its first pass over the Deployments is done)."""
    processes: list[asyncio.subprocess.Process] = []
    try:
        for shard in range(farms):
            targets = prometheus.targets_dir / f"farm-{shard}.json"
            targets.unlink(missing_ok=True)
            command = ["-m", "specops_local.pod_farm", "--kubeconfig", str(cluster.kubeconfig_path)]
            command += ["--targets-file", str(targets), "--shard", str(shard), "--shards", str(farms)]
            command += ["--advance-every", f"{ADVANCE_EVERY_S:g}", "--advance-batch", str(ADVANCE_BATCH)]
            command += ["--poll", f"{SERVING_POLL_S:g}"]
            log = workdir / f"farm-{shard}.log"
            with log.open("ab") as stderr:
                processes.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable, *command, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr
                    )
                )
        deadline = time.monotonic() + FARM_START_TIMEOUT_S
        for shard, process in enumerate(processes):
            targets = prometheus.targets_dir / f"farm-{shard}.json"
            while not targets.exists():
                if process.returncode is not None:
                    tail = (workdir / f"farm-{shard}.log").read_text()[-2000:]
                    raise RuntimeError(f"pod farm {shard} exited ({process.returncode}): {tail}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"pod farm {shard} was not live within {FARM_START_TIMEOUT_S:g} s")
                await asyncio.sleep(0.2)
        yield [process.pid for process in processes]
    finally:
        await asyncio.gather(*(_stop_process(process) for process in processes))


def _operator_requests(cluster: EmulatedCluster, since: int) -> tuple[int, int]:
    """Requests the API server answered since index ``since``: (the operator's, the pod farms')."""
    farm = 0
    requests = cluster.emulator.requests[since:]
    for request in requests:
        agent = next((v for k, v in request.headers.items() if k.lower() == "user-agent"), "")
        farm += agent.startswith(FARM_AGENT)
    return len(requests) - farm, farm


def _request_mix(cluster: EmulatedCluster, since: int, until: int) -> collections.Counter[str]:
    """The operator's requests in ``[since, until)`` by client (Kopf's own or specops's), verb, kind
    and subresource (``specops: PATCH speculativedeployments/status``)."""
    mix: collections.Counter[str] = collections.Counter()
    for request in cluster.emulator.requests[since:until]:
        agent = next((v for k, v in request.headers.items() if k.lower() == "user-agent"), "")
        if agent.startswith(FARM_AGENT):
            continue
        kind = getattr(request.resource, "plural", None) or "?"
        watch = request.params.get("watch") in ("true", "1")
        verb = "WATCH" if watch else str(getattr(request.method, "value", request.method) or "?").upper()
        client = "kopf" if agent.lower().startswith("kopf") else "specops"
        what = f"{client}: {verb} {kind}" + (f"/{request.subresource}" if request.subresource else "")
        if kind == "events" and verb == "POST" and isinstance(request.data, dict):
            what += f" ({request.data.get('reason')})"
        mix[what] += 1
    return mix


def _queries_answered(metrics_text: str) -> float:
    """Instant queries Prometheus answered so far (its own prometheus_http_requests_total)."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _prometheus_queries(prometheus: PrometheusProcess) -> float:
    async with httpx.AsyncClient(timeout=10.0) as http:
        return _queries_answered((await http.get(f"{prometheus.url}/metrics")).text)


HANDLED_ANNOTATION = "specops.dev/last-handled-configuration"
"""Kopf writes it once the create handlers succeeded (the operator persists its state under specops.dev)."""


def _reconciled(obj: dict[str, Any]) -> bool:
    """Serving, and the operator's reconcile handler finished (not only a status that says serving)."""
    annotations = obj["metadata"].get("annotations") or {}
    return (obj.get("status") or {}).get("phase") in ACTIVE_PHASES and HANDLED_ANNOTATION in annotations


SETTLE_INTERVALS = 8
METRICS_SETTLE_S = 120.0
"""How long the benchmark waits, after every resource serves, for every resource's metrics."""


async def _poll_until(
    look: Callable[[], T], within_s: float, done: Callable[[T], bool] = lambda found: not found
) -> T:
    """Look at the store every READY_POLL_S until `done` (by default: nothing left) or `within_s`
    passed; what the last look found. The store has no event to wait on."""
    deadline = time.monotonic() + within_s
    while not done(found := look()) and time.monotonic() < deadline:  # noqa: ASYNC110 (the store has no event to wait on)
        await asyncio.sleep(READY_POLL_S)
    return found


def _metrics_pending(cluster: EmulatedCluster, names: set[str]) -> int:
    """How many of the named resources have no measurement yet, or say their metrics are unavailable."""
    pending = 0
    for obj in cluster.objects("speculativedeployments", cluster.namespace):
        if obj["metadata"]["name"] not in names:
            continue
        status = obj.get("status") or {}
        unavailable = any(
            c.get("type") == "MetricsUnavailable" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        pending += unavailable or not (status.get("observed") or {}).get("at")
    return pending


def _not_dynamic(cluster: EmulatedCluster, names: set[str]) -> collections.Counter[str]:
    """The phases of the named resources that are not in Dynamic yet (none: every one is)."""
    phases: collections.Counter[str] = collections.Counter()
    for obj in cluster.objects("speculativedeployments", cluster.namespace):
        phase = str((obj.get("status") or {}).get("phase") or "none")
        if obj["metadata"]["name"] in names and phase != "Dynamic":
            phases[phase] += 1
    return phases


STEPPING = frozenset({"RevisionProposed", "MeasuredSlowdown"})
"""Decisions that roll a new revision (schedule) out in the Dynamic phase."""
SETTLED_SHARE = 0.01
"""The fleet counts as settled when at most this share of it is still changing its revision."""
LENGTH_SETTLE_S = 900.0


STATUS_WRITES = "specops: PATCH speculativedeployments/status"
"""The operator's status writes, as `_request_mix` names them."""


STEPS_SETTLED = 0.025
"""... and at most this many revision changes per resource and cycle were made over the last
STEP_LOOKBACK_INTERVALS (at least one step allowed, for tiny fleets). The share stepping is a
snapshot of each status's last reason, which a status refresh may not have written yet: it read 11 of
2,000 15 s after the fleet entered Dynamic, and the window then measured the fleet's first climb
(0.099 steps per resource and cycle, against 0.011-0.022 once settled)."""
STEP_LOOKBACK_INTERVALS = 6


def _length_steps(cluster: EmulatedCluster, since: int, until: int) -> int:
    """The length-step Events the operator posted in the request log's ``[since, until)``."""
    mix = _request_mix(cluster, since, until)
    return sum(mix[f"kopf: POST events ({reason})"] for reason in STEPPING)


async def _until_lengths_settle(
    cluster: EmulatedCluster, names: set[str], interval_s: float, within_s: float
) -> tuple[int, float]:
    """Look back STEP_LOOKBACK_INTERVALS at a time until the fleet counts as settled (SETTLED_SHARE,
    STEPS_SETTLED) or ``within_s`` passed; the share stepping and the step rate of the last look."""
    deadline = time.monotonic() + within_s
    lookback_s = STEP_LOOKBACK_INTERVALS * interval_s
    mark = len(cluster.emulator.requests)
    while True:
        await asyncio.sleep(max(0.0, min(lookback_s, deadline - time.monotonic())))
        now_mark = len(cluster.emulator.requests)
        steps = _length_steps(cluster, mark, now_mark)
        mark = now_mark
        rate = steps / (len(names) * STEP_LOOKBACK_INTERVALS)
        stepping = _stepping(cluster, names)
        calm = steps <= max(1.0, STEPS_SETTLED * len(names) * STEP_LOOKBACK_INTERVALS)
        if (calm and stepping <= SETTLED_SHARE * len(names)) or time.monotonic() >= deadline:
            return stepping, rate


def _stepping(cluster: EmulatedCluster, names: set[str]) -> int:
    """How many named resources' last decision changed the revision (status.speculation.reason)."""
    return sum(
        1
        for obj in cluster.objects("speculativedeployments", cluster.namespace)
        if obj["metadata"]["name"] in names
        and ((obj.get("status") or {}).get("speculation") or {}).get("reason") in STEPPING
    )


def _metrics_example(cluster: EmulatedCluster, names: set[str]) -> str:
    """One resource without metrics: its MetricsUnavailable condition and last measurement time."""
    for obj in cluster.objects("speculativedeployments", cluster.namespace):
        status = obj.get("status") or {}
        condition: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "MetricsUnavailable"), {}
        )
        if obj["metadata"]["name"] in names and (
            condition.get("status") == "True" or not (status.get("observed") or {}).get("at")
        ):
            return (
                f"for example {obj['metadata']['name']}: MetricsUnavailable={condition.get('status')} "
                f"{condition.get('reason')}: {condition.get('message')}; observed at "
                f"{(status.get('observed') or {}).get('at')}"
            )
    return "none"


def _serving(cluster: EmulatedCluster, names: set[str]) -> int:
    """How many of the named resources are reconciled and serving."""
    return sum(
        1
        for obj in cluster.objects("speculativedeployments", cluster.namespace)
        if obj["metadata"]["name"] in names and _reconciled(obj)
    )


def _not_serving(cluster: EmulatedCluster, names: set[str]) -> str:
    """Name, phase and conditions of one resource that is not serving, for the timeout's message."""
    for obj in cluster.objects("speculativedeployments", cluster.namespace):
        status = obj.get("status") or {}
        if obj["metadata"]["name"] in names and not _reconciled(obj):
            conditions = [
                f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
                for c in status.get("conditions") or []
            ]
            handled = HANDLED_ANNOTATION in (obj["metadata"].get("annotations") or {})
            return f"{obj['metadata']['name']} phase={status.get('phase')} handled={handled} {conditions}"
    return "none"


def _start_profiler(pid: int, duration_s: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy (if installed) samples the operator during the measured cycles; speedscope JSON."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
    command = [py_spy, "record", "--pid", str(pid), "--duration", f"{duration_s:.0f}", "--rate", "50"]
    command += ["--nonblocking", "--format", "speedscope", "--output", str(out)]
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


# ------------------------------------------------------------------ the run


DEFAULT_CYCLES = 12
"""Control cycles in the measured window. At 2,000 resources the same code read 2.16-3.58 CPU-s a
cycle over 3-cycle windows, by what the fleet happened to do in those 45 s (a few dozen resources
still stepping a length, a full collection more or less), and 1.65-1.91 over 12-cycle ones: 3
minutes cover several of the collector's full passes."""


async def run_scale(
    resources: int,
    workdir: Path,
    *,
    interval: str = "15s",
    cycles: int = DEFAULT_CYCLES,
    rollout: str = DEFAULT_ROLLOUT,
    reconcile_timeout_s: float = 600.0,
    progress: bool = True,
    profile: Path | None = None,
    log_level: str = "warning",
    farms: int = 1,
) -> ScaleResult:
    interval_s = parse_duration(interval)
    rollout_s = parse_duration(rollout)
    workdir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, before anything runs)

    def say(text: str) -> None:
        if progress:
            print(f"[scale {resources}] {text}", file=sys.stderr, flush=True)

    async with contextlib.AsyncExitStack() as exits:
        cluster = await exits.enter_async_context(emulated_cluster([], workdir, crds=[build_crd()]))
        prometheus = await exits.enter_async_context(run_prometheus(workdir, scrape_interval=interval))
        farm_pids: list[int] = []
        if farms > 0:
            farm_pids = await exits.enter_async_context(pod_farms(cluster, prometheus, farms, workdir))
            say(f"{farms} pod farm(s) live (pids {', '.join(map(str, farm_pids))})")
        else:
            await exits.enter_async_context(in_process_pods(cluster, prometheus))
        operator = await exits.enter_async_context(
            operator_process(cluster, interval_s, workdir / "operator.log", log_level)
        )
        pid = operator.pid
        say(f"operator running (pid {pid}); creating {resources} resources")
        memory = await exits.enter_async_context(_sample_memory(pid, MEMORY_EVERY_S))

        names: set[str] = set()
        requests_at_start = len(cluster.emulator.requests)
        stack = {"operator": [pid], "API server (this process)": [os.getpid()], "pod farms": farm_pids}
        if prometheus.pid is not None:
            stack["Prometheus"] = [prometheus.pid]
        stack_cpu_at_start = {part: sum(map(_cpu_seconds, pids)) for part, pids in stack.items()}
        started = time.monotonic()
        for index in range(resources):
            body = scale_resource(index, cluster.namespace, prometheus.url, interval, rollout)
            cluster.create("speculativedeployments", body, namespace=cluster.namespace)
            names.add(body["metadata"]["name"])
            if index % 100 == 99:
                await asyncio.sleep(0)  # let the API server answer the watch meanwhile
        climb: list[str] = []  # the operator's RSS as resources come up: where the peak is made
        while (ready := _serving(cluster, names)) < resources:
            if len(climb) < (time.monotonic() - started) / RSS_EVERY_S:
                climb.append(f"{ready}: {_memory_mib(pid, 'VmRSS'):.0f}")
            if time.monotonic() - started > reconcile_timeout_s:
                raise TimeoutError(
                    f"{ready} of {resources} serving after {reconcile_timeout_s:g} s; "
                    f"for example: {_not_serving(cluster, names)}"
                )
            await asyncio.sleep(READY_POLL_S)
        initial_reconcile_s = time.monotonic() - started
        say(f"all serving after {initial_reconcile_s:.1f} s; {_memory_note(pid)}")
        say(f"the operator's RSS (MiB) every {RSS_EVERY_S:g} s by resources serving: {', '.join(climb)}")
        used = {part: sum(map(_cpu_seconds, pids)) - stack_cpu_at_start[part] for part, pids in stack.items()}
        say(
            f"CPU during it ({sum(used.values()):.1f} CPU-s, {sum(used.values()) / initial_reconcile_s:.2f} cores): "
            + ", ".join(f"{part} {seconds:.1f} s" for part, seconds in used.items())
        )
        mix = _request_mix(cluster, requests_at_start, len(cluster.emulator.requests))
        say(
            f"the operator's API requests per resource during it ({sum(mix.values()) / resources:.1f} in all): "
            + ", ".join(f"{key} {count / resources:.2f}" for key, count in mix.most_common())
        )

        # Steady state: new pods have no rate() over a window yet, so every resource first reports
        # MetricsUnavailable and then writes (and announces) the metrics flowing. Measured after that.
        waiting = await _poll_until(
            lambda: _metrics_pending(cluster, names), SETTLE_INTERVALS * interval_s + METRICS_SETTLE_S
        )
        say(
            f"metrics flowing for every resource after {time.monotonic() - started:.1f} s; {_memory_note(pid)}"
            if not waiting
            else f"{waiting} resources still without metrics ({_metrics_example(cluster, names)}); measuring anyway"
        )
        # Then the Dynamic phase everywhere (after each resource's short Baseline and Fixed): the
        # phase a deployment spends its life in, with calibration, revisions and break-even.
        behind = await _poll_until(
            lambda: _not_dynamic(cluster, names),
            2.0 * rollout_s + SETTLE_INTERVALS * interval_s + METRICS_SETTLE_S,
        )
        say(
            f"every resource in the Dynamic phase after {time.monotonic() - started:.1f} s; {_memory_note(pid)}"
            if not behind
            else f"not every resource in Dynamic ({dict(behind)}); measuring anyway"
        )
        # and the revisions settled: entering Dynamic, each resource may roll out the schedule its
        # learned curve favours, a status write, an Event and a pod restart each
        stepping, step_rate = await _until_lengths_settle(cluster, names, interval_s, LENGTH_SETTLE_S)
        say(
            f"revisions settled after {time.monotonic() - started:.1f} s "
            f"({stepping} resources still changing theirs; {step_rate:.3f} revision changes per resource "
            f"and cycle over the last {STEP_LOOKBACK_INTERVALS} intervals); {_memory_note(pid)}"
        )
        window_s = cycles * interval_s
        before = await _operator_counters(
            operator.metrics_url
        )  # a scrape of every series: outside the window
        cpu_before, requests_before = _cpu_seconds(pid), len(cluster.emulator.requests)
        split_before, switches_before = _cpu_split(pid), _context_switches(pid)
        own_cpu_before = _cpu_seconds(os.getpid())
        farm_cpu_before = [_cpu_seconds(farm) for farm in farm_pids]
        queries_before, measured_from = await _prometheus_queries(prometheus), time.monotonic()
        say(f"measuring {cycles} cycles ({window_s:g} s); the operator used {cpu_before:.1f} CPU-s so far")
        profiler = _start_profiler(pid, window_s, profile) if profile is not None else None
        await asyncio.sleep(window_s)
        if profiler is not None:
            await asyncio.get_running_loop().run_in_executor(None, profiler.wait)
            say(f"profile of the measured cycles: {profile}")
        elapsed = time.monotonic() - measured_from
        say(f"measured; {_memory_note(pid)}")
        say(
            f"the operator's RSS (MiB) every {MEMORY_EVERY_S:g} s from the start: "
            + ", ".join(f"{rss:.0f}" for rss in memory)
        )
        measured_cycles = elapsed / interval_s
        cpu = _cpu_seconds(pid) - cpu_before
        user_s, system_s = (
            after - before for after, before in zip(_cpu_split(pid), split_before, strict=True)
        )
        say(
            f"the operator's CPU in the window: user {user_s:.1f} s, system {system_s:.1f} s; "
            f"{(_context_switches(pid) - switches_before) / elapsed:.0f} blocking waits a second"
        )
        own_cpu = _cpu_seconds(os.getpid()) - own_cpu_before
        farm_cpu = [
            _cpu_seconds(farm) - before for farm, before in zip(farm_pids, farm_cpu_before, strict=True)
        ]
        requests, farm_requests = _operator_requests(cluster, requests_before)
        window_mix = _request_mix(cluster, requests_before, len(cluster.emulator.requests))
        after = await _operator_counters(operator.metrics_url)
        if before is not None and after is not None and cpu > 0:
            young, middle, full = (after[f"gc{g}"] - before[f"gc{g}"] for g in range(3))
            gc_s = young + middle + full
            say(
                f"the operator's garbage collector in the window: {gc_s:.2f} s "
                f"({100 * gc_s / cpu:.0f} % of its {cpu:.1f} CPU-s; young passes {young:.2f} s, "
                f"middle {middle:.2f} s, full {full:.2f} s)"
            )
        decided, unchanged = (
            (after[k] - before[k] for k in ("decided", "unchanged"))
            if before is not None and after is not None
            else (0.0, 0.0)
        )
        say(
            "the operator's API requests per resource and cycle in the window: "
            + ", ".join(
                f"{key} {count / resources / measured_cycles:.3f}" for key, count in window_mix.most_common(8)
            )
        )
        say(
            f"in the window: this process (API server) used {100 * own_cpu / elapsed:.0f} % of a core, "
            f"the pod farms {', '.join(f'{100 * c / elapsed:.0f} %' for c in farm_cpu) or 'none'}; "
            f"the farms made {farm_requests / elapsed:.1f} API requests/s"
        )
        say(f"the operator's liveness probe: {await _liveness(operator.liveness_url, operator.live_at)}")
        queries = await _prometheus_queries(prometheus) - queries_before - 1  # less our own first read
        reference_s = machine_reference()
        say(f"the machine's reference workload, the stack still running: {reference_s:.3f} CPU-s")
        return ScaleResult(
            resources=resources,
            initial_reconcile_seconds=round(initial_reconcile_s, 1),
            cycle_cpu_seconds=round(cpu / measured_cycles, 3),
            promql_queries_per_cycle=round(max(queries, 0.0) / measured_cycles, 1),
            api_requests_per_second=round(requests / elapsed, 1),
            peak_rss_mib=round(_peak_rss_mib(pid), 1),
            status_writes_per_resource_cycle=round(
                window_mix[STATUS_WRITES] / resources / measured_cycles, 4
            ),
            length_steps_per_resource_cycle=round(
                sum(window_mix[f"kopf: POST events ({reason})"] for reason in STEPPING)
                / resources
                / measured_cycles,
                4,
            ),
            resources_stepping_at_start=stepping,
            unchanged_share=round(unchanged / (decided + unchanged), 3) if decided + unchanged > 0 else 0.0,
            machine_reference_cpu_seconds=round(reference_s, 3),
            machine_cpu=machine_cpu(),
        )
    raise AssertionError("unreachable")  # pragma: no cover (the exit stack does not swallow)


REFERENCE_RUNS = 5
REFERENCE_ROUNDS = 150_000


def _reference_work(rounds: int) -> float:
    """What the operator's cycle is made of, in miniature: small records made and dropped,
    dictionaries looked up and filled, float arithmetic, function calls."""
    table: dict[int, float] = {}
    total = 0.0
    for i in range(rounds):
        batch, alpha, lengths = i * 0.5, 0.8, [i & 7, (i >> 3) & 7]
        record = {"batch": batch, "alpha": alpha, "lengths": float(len(lengths))}
        table[i & 1023] = record["batch"] * record["alpha"] + record["lengths"]
        total += table.get((i * 7) & 1023, 0.0) / (1.0 + (i & 15))
        total = math.fsum((total, -0.5 * total))
    return total


def machine_reference(runs: int = REFERENCE_RUNS, rounds: int = REFERENCE_ROUNDS) -> float:
    """The least CPU time, in seconds, of ``runs`` runs of a fixed Python workload in this process
    (about a tenth of a second each on an idle 2-core VM): the least, since sharing the machine
    only ever slows a run. A figure for the machine's speed, not the operator's."""
    spent = []
    for _ in range(runs):
        started = time.process_time()
        _reference_work(rounds)
        spent.append(time.process_time() - started)
    return min(spent)


def machine_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The first processor's model name and clock from ``cpuinfo``; "unknown" where it has none."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return "unknown"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block only
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    model = fields.get("model name") or fields.get("Model") or "unknown"
    try:
        return f"{model}, {float(fields['cpu MHz']):.0f} MHz"
    except (KeyError, ValueError):
        return model


def report(result: ScaleResult) -> str:
    rows = [
        ("resources", f"{result.resources}"),
        ("initial reconcile", f"{result.initial_reconcile_seconds:.1f} s"),
        ("CPU per control cycle", f"{result.cycle_cpu_seconds:.3f} s"),
        ("PromQL queries per cycle", f"{result.promql_queries_per_cycle:.1f}"),
        ("API requests per second", f"{result.api_requests_per_second:.1f}"),
        ("operator peak RSS", f"{result.peak_rss_mib:.1f} MiB"),
        ("status writes per resource and cycle", f"{result.status_writes_per_resource_cycle:.3f}"),
        ("revision changes per resource and cycle", f"{result.length_steps_per_resource_cycle:.3f}"),
        ("resources stepping at the start", f"{result.resources_stepping_at_start}"),
        ("ticks with inputs unchanged", f"{100 * result.unchanged_share:.0f} %"),
        ("machine reference (after the window)", f"{result.machine_reference_cpu_seconds:.3f} CPU-s"),
        ("machine's processor", result.machine_cpu),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


async def _stopping_on_terminate(run: Coroutine[Any, Any, T]) -> T:
    """The run, cancelled by SIGTERM as asyncio.run cancels it on SIGINT: its blocks then stop
    what they started (Prometheus, the operator, the pod farms). Python's default for SIGTERM ends
    the process at once, and Prometheus, which does not watch its parent, kept running."""
    task = asyncio.current_task()
    assert task is not None
    with interrupt_cancels(task, signals=(signal.SIGTERM,)):
        return await run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="specops bench scale",
        description="Run the operator (its own process) against N SpeculativeDeployments with one "
        "simulated pod each, on the emulated API server and a real Prometheus; print and write figures.",
    )
    parser.add_argument("--resources", type=int, default=200, help="SpeculativeDeployments (default 200)")
    parser.add_argument("--interval", default="15s", help="scrape and decision interval (default 15s)")
    parser.add_argument(
        "--cycles",
        type=int,
        default=DEFAULT_CYCLES,
        help=f"control cycles measured in steady state (default {DEFAULT_CYCLES})",
    )
    parser.add_argument(
        "--rollout",
        default=DEFAULT_ROLLOUT,
        help=f"every resource's Baseline and Fixed phases (default {DEFAULT_ROLLOUT} each); measured in Dynamic",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="initial reconcile deadline, seconds")
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temporary directory)")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--log-level", default="warning", help="the operator's log level (default warning)")
    parser.add_argument(
        "--profile", type=Path, help="sample the operator with py-spy during the measured cycles (speedscope)"
    )
    parser.add_argument(
        "--farms",
        type=int,
        default=1,
        help="pod farm processes serving the simulated pods (default 1; 0: in this process)",
    )
    args = parser.parse_args(argv)
    if args.resources < 1 or args.cycles < 1:
        parser.error("--resources and --cycles must be at least 1")
    if args.farms < 0:
        parser.error("--farms must be at least 0")
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="specops-scale-"))
        )
        try:
            result = asyncio.run(
                _stopping_on_terminate(
                    run_scale(
                        args.resources,
                        workdir,
                        interval=args.interval,
                        cycles=args.cycles,
                        rollout=args.rollout,
                        reconcile_timeout_s=args.timeout,
                        profile=args.profile,
                        log_level=args.log_level,
                        farms=args.farms,
                    )
                )
            )
        except asyncio.CancelledError:
            print("specops bench scale: terminated; every process it started has stopped", file=sys.stderr)
            return 128 + signal.SIGTERM
    print(report(result))
    write_json(asdict(result), args.json)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
