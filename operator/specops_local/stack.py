"""The whole local stack in one block: emulated API server, Debian's Prometheus, simulated serving
engines (Triton's LLM API model, trtllm-serve, vLLM, SGLang), and the real operator, for the demo,
the benchmarks and tests that need all of it.

``async with local_stack(workdir, load=LoadPoint(...)) as stack:`` starts, in order, the emulated
cluster (with the generated CRD), Prometheus scraping every ``scrape_interval``, the
ServingController (Deployment controller + kubelet for serving Deployments: each pod runs the
simulated engine its rendered command, args and config files name, ready ``restart_s`` after it
starts) and the operator
with the production handlers, and stops them in reverse order. The operator reads its settings
and credentials from the environment, so the SPECOPS_* variables and KUBECONFIG are set for the
lifetime of the block and restored afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import math
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import yaml

import specops.handlers  # noqa: F401  (registers the production handlers in Kopf's default registry)
from specops.adapters.kube import KubeClient, load_connection_settings
from specops.api.crd import build_crd
from specops.api.units import parse_duration
from specops_local.cluster import EmulatedCluster, emulated_cluster
from specops_local.kopf_runner import OperatorRun, run_kopf
from specops_local.prometheus import PrometheusProcess, run_prometheus
from specops_local.serving import DraftBehaviour, ServingController
from specops_local.sim import LoadPoint, SimEngine
from specops_local.training import TrainingController

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "specops.dev_speculativedeployments.yaml"
EXAMPLES = ROOT / "docs" / "examples"
RESTART_S = 2.0
"""Seconds from a simulated engine's start to ready in the local stack (a real one takes minutes)."""
ENGINE_DEADLINE_S = 5.0
"""How long one call to a (local, simulated) engine may take."""
LOAD_ANNOTATION = "local.specops.dev/batch"
"""On a SpeculativeDeployment: the requests each of its simulated pods serves at once (what
``specops local load NAME --batch N`` sets; the stack follows it within LOAD_POLL_S)."""
LOAD_POLL_S = 0.5

log = logging.getLogger(__name__)


def operator_environment(
    kubeconfig: Path, scrape_interval_s: float, decision_interval_s: float
) -> dict[str, str]:
    """What the chart would set: each backend's default image, no PodMonitor CRD here, fast loops,
    short engine calls."""
    return {
        "KUBECONFIG": str(kubeconfig),
        "SPECOPS_POD_MONITOR": "false",
        "SPECOPS_DEFAULT_INTERVAL_SECONDS": f"{decision_interval_s:g}",
        "SPECOPS_SCRAPE_INTERVAL_SECONDS": f"{scrape_interval_s:g}",
        "SPECOPS_ENGINE_DEADLINE_SECONDS": f"{ENGINE_DEADLINE_S:g}",
    }


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the block; previous values (or their absence) come back after."""
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class OperatorHandle:
    """The operator (production handlers, in-process); restart() simulates a pod restart."""

    def __init__(self, registry: kopf.OperatorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else kopf.get_default_registry()
        self.run: OperatorRun | None = None
        self._exit: contextlib.AsyncExitStack | None = None

    @property
    def running(self) -> bool:
        return self.run is not None and not self.run.task.done()

    async def start(self) -> None:
        if self._exit is not None:
            return
        exit_stack = contextlib.AsyncExitStack()
        self.run = await exit_stack.enter_async_context(run_kopf(self.registry, startup_timeout_s=20.0))
        self._exit = exit_stack

    async def stop(self) -> None:
        exit_stack, self._exit = self._exit, None
        self.run = None
        if exit_stack is not None:
            await exit_stack.aclose()

    async def restart(self) -> None:
        await self.stop()
        await self.start()


@dataclass
class LocalStack:
    """Handles on every running part; see the module docstring for what each one plays."""

    workdir: Path
    cluster: EmulatedCluster
    prometheus: PrometheusProcess
    serving: ServingController
    kube: KubeClient
    operator: OperatorHandle
    scrape_interval_s: float
    decision_interval_s: float
    loads: dict[str, LoadPoint] = field(default_factory=dict)
    """Load per SpeculativeDeployment set by set_load (new pods of a rollout start with it)."""
    training: TrainingController | None = None
    """Plays the Job controller for training rounds (when the stack was started with one)."""
    base_load: LoadPoint = field(default_factory=lambda: LoadPoint(batch=8, alpha=0.8))
    """The load every pod starts with until set_load (or the load annotation) moves its resource's."""
    refused_loads: dict[str, str] = field(default_factory=dict)
    """Load annotations that are not a batch, by resource (each is logged once)."""

    @property
    def namespace(self) -> str:
        return self.cluster.namespace

    def pods(self, owner: str, variant: str | None = None) -> list[SimEngine]:
        """The simulated engines serving one SpeculativeDeployment (all variants unless one is named)."""
        return [
            pod
            for serving in self.serving.sets.values()
            if serving.owner == owner and variant in (None, serving.variant)
            for pod in serving.pods
        ]

    def set_load(self, owner: str, load: LoadPoint) -> None:
        """Change what one resource's pods serve, effective now: the batch gauge moves at once.

        The engines integrate their model every 0.2 s; advancing a millisecond publishes the
        new batch (and the K their schedule gives at it) immediately, so timings measured from
        here do not include the sim's tick. Pods started later get it too.
        """
        self.loads[owner] = load
        for pod in self.pods(owner):
            pod.set_load(load)
            pod.advance(0.001)

    def follow_load_annotations(self) -> None:
        """Move each resource's load to its LOAD_ANNOTATION, where one is set and differs."""
        for body in self.cluster.objects("speculativedeployments"):
            name = body["metadata"]["name"]
            raw = (body["metadata"].get("annotations") or {}).get(LOAD_ANNOTATION)
            if raw is None:
                continue
            batch = load_batch(raw)
            if batch is None:
                if self.refused_loads.get(name) != raw:
                    self.refused_loads[name] = raw
                    log.warning("%s: %s=%r is not a batch (a number >= 0)", name, LOAD_ANNOTATION, raw)
                continue
            before = self.loads.get(name, self.base_load)
            if before.batch != batch or name not in self.loads:
                self.set_load(name, dataclasses.replace(before, batch=batch))
                log.info(
                    "%s: offered batch per pod %g -> %g (%s)", name, before.batch, batch, LOAD_ANNOTATION
                )

    async def follow_loads(self) -> None:
        """follow_load_annotations every LOAD_POLL_S, until cancelled."""
        while True:
            try:
                self.follow_load_annotations()
            except Exception:  # keep following; a broken read shows as a load that does not move
                log.exception("following %s failed", LOAD_ANNOTATION)
            await asyncio.sleep(LOAD_POLL_S)


def load_batch(text: str) -> float | None:
    """The batch a load annotation asks for, or None when it is not a finite number >= 0."""
    try:
        batch = float(text)
    except ValueError:
        return None
    return batch if math.isfinite(batch) and batch >= 0 else None


def fast_resource(
    example: str,
    *,
    prometheus_url: str,
    namespace: str,
    replicas: int = 2,
    interval: str = "1s",
    baseline: str = "3s",
    soak: str = "3s",
    min_interval: str = "5s",
    backend: str | None = None,
) -> dict[str, Any]:
    """A docs/examples resource with a local Prometheus, fast rollout phases, fast decisions and
    revision changes allowed every ``min_interval`` (each restarts the pods: seconds here);
    ``backend`` replaces the example's serving.backend."""
    body: dict[str, Any] = yaml.safe_load((EXAMPLES / example).read_text())
    body = copy.deepcopy(body)
    body["metadata"]["namespace"] = namespace
    spec = body["spec"]
    spec["serving"]["replicas"] = replicas
    spec["metrics"] = {"prometheus": {"url": prometheus_url}, "interval": interval}
    speculation = spec.setdefault("speculation", {})
    speculation["rollout"] = {"baseline": baseline, "soak": soak}
    speculation["reconfigure"] = {**speculation.get("reconfigure", {}), "minInterval": min_interval}
    if backend is not None:
        spec["serving"]["backend"] = backend
    return body


@contextlib.asynccontextmanager
async def local_stack(
    workdir: Path,
    *,
    load: LoadPoint,
    scrape_interval: str = "1s",
    decision_interval: str = "1s",
    pod_options: Callable[[Any, str], dict[str, Any]] | None = None,
    drafts: dict[str, DraftBehaviour] | None = None,
    extra_crds: Sequence[Mapping[str, Any]] = (),
    restart_s: float = RESTART_S,
    train_s: float | None = None,
) -> AsyncIterator[LocalStack]:
    """Start everything, yield the handles, stop everything in reverse order (also on errors).

    ``restart_s``: every simulated engine's start-to-ready time (each revision change restarts
    the pods one by one, so this sets how long a rollout takes). ``train_s``: with a value, a
    training controller runs every training round to completion that long after it starts
    (`specops_local.training`); without, training Jobs wait for whoever plays their controller.
    Each resource's LOAD_ANNOTATION moves its pods' load."""
    workdir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, before anything runs)
    scrape_interval_s = parse_duration(scrape_interval)
    decision_interval_s = parse_duration(decision_interval)
    loads: dict[str, LoadPoint] = {}

    def options(owner: Any, variant: str) -> dict[str, Any]:
        """The caller's engine options, and the load set for the owner (pods restart on a rollout)."""
        found = dict(pod_options(owner, variant)) if pod_options is not None else {}
        name = (
            owner.metadata.get("name")
            if hasattr(owner, "metadata")
            else (owner.get("metadata") or {}).get("name")
        )
        if name in loads:
            found["load"] = loads[name]
        return found

    async with contextlib.AsyncExitStack() as exits:
        # The CRD generated from the API models: what crds/ holds in a clone (a test checks), and
        # available in an installed package too.
        cluster = await exits.enter_async_context(
            emulated_cluster([], workdir, crds=[build_crd(), *map(dict, extra_crds)])
        )
        prometheus = await exits.enter_async_context(run_prometheus(workdir, scrape_interval=scrape_interval))
        serving = await exits.enter_async_context(
            ServingController(
                cluster, prometheus, load=load, pod_options=options, drafts=drafts, restart_s=restart_s
            )
        )
        exits.enter_context(
            environment(operator_environment(cluster.kubeconfig_path, scrape_interval_s, decision_interval_s))
        )
        training = None
        if train_s is not None:
            training = await exits.enter_async_context(
                TrainingController(cluster, serving.drafts, train_s=train_s)
            )
        kube = KubeClient(load_connection_settings(str(cluster.kubeconfig_path)))
        exits.push_async_callback(kube.close)
        operator = OperatorHandle()
        exits.push_async_callback(operator.stop)
        await operator.start()
        stack = LocalStack(
            workdir=workdir,
            cluster=cluster,
            prometheus=prometheus,
            serving=serving,
            kube=kube,
            operator=operator,
            scrape_interval_s=scrape_interval_s,
            decision_interval_s=decision_interval_s,
            loads=loads,
            training=training,
            base_load=load,
        )
        following = asyncio.get_running_loop().create_task(stack.follow_loads(), name="load annotations")
        exits.callback(following.cancel)
        yield stack


@contextlib.contextmanager
def interrupt_cancels(
    task: asyncio.Task[Any],
    on_interrupt: Callable[[], None] = lambda: None,
    *,
    signals: tuple[signal.Signals, ...] = (signal.SIGINT,),
) -> Iterator[None]:
    """Ctrl+C cancels ``task`` (so every ``async with`` unwinds) instead of only stopping the operator.

    Kopf installs its own SIGINT handler, which would stop the operator and leave the rest
    waiting; enter this after the stack started. Further Ctrl+C presses are ignored while the
    stack stops (until the operator's runner hands SIGINT back to Python). ``signals``: others
    that cancel it the same way (SIGTERM, whose Python default ends the process at once and
    leaves its children running).
    """
    loop = asyncio.get_running_loop()
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted() -> None:
        if not task.cancelling():
            on_interrupt()
            task.cancel()

    for signum in signals:
        loop.add_signal_handler(signum, interrupted)
    try:
        yield
    finally:
        if not task.cancelling():
            with contextlib.suppress(NotImplementedError, RuntimeError):
                for signum in signals:
                    loop.remove_signal_handler(signum)


OPERATOR_LOGGERS = ("kopf", "specops")
"""The operator's own loggers (Kopf's and the production code's): what operator.log holds."""
API_SERVER_LOGGERS = ("aiohttp", "kmock", "specops_local.emulator")
"""The emulated API server's loggers (its access log among them): what api-server.log holds."""
API_SERVER_LOG = "api-server.log"
STACK_LOG = "local-stack.log"
"""Everything else the local stack logs (the simulated engines and controllers, Prometheus)."""


def _under(name: str, prefixes: Sequence[str]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


@contextlib.contextmanager
def log_to_file(path: Path) -> Iterator[None]:
    """Send every log record to files, so a terminal shows only the report: the operator's to
    ``path``, the emulated API server's (its access log) to api-server.log beside it, the rest of
    the local stack's to local-stack.log."""
    root = logging.getLogger()
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    routes: list[tuple[Path, Callable[[logging.LogRecord], bool]]] = [
        (path, lambda record: _under(record.name, OPERATOR_LOGGERS)),
        (path.with_name(API_SERVER_LOG), lambda record: _under(record.name, API_SERVER_LOGGERS)),
        (
            path.with_name(STACK_LOG),
            lambda record: not _under(record.name, (*OPERATOR_LOGGERS, *API_SERVER_LOGGERS)),
        ),
    ]
    handlers = []
    for target, accepts in routes:
        handler = logging.FileHandler(target)
        handler.setFormatter(formatter)
        handler.addFilter(accepts)
        handlers.append(handler)
        root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)
