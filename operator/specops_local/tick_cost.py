"""`specops bench tick --resources N`: the CPU one steady control cycle costs, in this process.

`specops bench scale` measures the operator as its own process at 2,000 resources, but a run takes
half an hour and the machine's speed moves its figure by a fifth from one run to the next: it
cannot resolve a change of a few per cent. This benchmark runs the production tick
(`Services.tick`: the typed resource, the control loop with calibration, the revision step and
the break-even, retraining and canary parts, the status diff and write, a revision change's
re-render of the stable Deployment, the operator's per-resource metrics) for N resources on a
simulated clock, in one process, and reports the CPU per resource-tick. What it leaves out is
what the scale bench adds: Kopf's watches and daemons, decoding Prometheus's answers, HTTP to the
pods.

The world is hidden from the operator, as in the policy benchmark: each resource's pod serves a
shipped serving profile (not the roofline the operator starts from) at its own mean batch, and
reads noisy as a pod farm's pods do (token latency x exp(N(0, 0.1)), batch N(mean, sqrt(mean)),
acceptance N(0.8, 0.05)), drafting the K its revision's schedule gives at the batch it carries.
Every resource's first draft has passed its lossless check (check pods are a start-up's cost,
which the scale bench measures). A revision change rolls out at once (the pod carries the new
revision at the next tick). The API
server is the emulated one, in this process; its share of the CPU (the status writes the ticks
make) is measured apart and left out of the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import cProfile
import dataclasses
import functools
import gc
import hashlib
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from specops.adapters import operator_metrics
from specops.api.crd import build_crd
from specops.api.models import PrometheusSource
from specops.api.status import RevisionStatus
from specops.cli_output import write_json
from specops.domain.control_status import revision_from_status
from specops.domain.discovery import PodEndpoint, ready_endpoint
from specops.domain.engines.schedule import PLAIN, Revision
from specops.domain.metrics import Measurement, PodMeasurement
from specops.domain.names import LABEL_DEPLOYMENT, label_value
from specops.domain.profile import ServingProfile
from specops.profiles import load_builtin
from specops.services import tick as tick_module
from specops.services.container import Services, build_services
from specops_local.cluster import EmulatedCluster, emulated_cluster
from specops_local.scale import DEFAULT_ROLLOUT, EXAMPLE
from specops_local.stack import EXAMPLES, environment, operator_environment

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
WORLD = "llama70b-small-draft-4xh100"
"""The profile every pod serves: a 70B target with a small draft on 4xH100, the dense example's shape."""
SETTLE_CYCLES = 120
"""Cycles run before the measured ones (30 minutes at 15 s): through Baseline and Fixed, and long
enough in Dynamic for lengths to settle and calibration to have its samples."""
FLEET = 2000
"""The fleet whose pace of measurement refreshes the resources keep (see _refresh_budget_of)."""


@dataclass(frozen=True)
class TickCostResult:
    resources: int
    cycles: int
    tick_cpu_ms: float
    """The operator's CPU per resource-tick in steady state (the API server's share left out)."""
    cycle_cpu_seconds: float
    """tick_cpu_ms x resources: one interval's ticks of the whole fleet."""
    api_server_cpu_ms_per_tick: float
    status_writes_per_cycle: float
    events_per_cycle: float
    unchanged_share: float
    """The share of ticks whose control inputs had not moved since the resource's last step (the
    step's fast path: nothing decided again)."""
    rollouts_per_cycle: float
    """Revision changes (stable Deployment re-rendered) per cycle over the measured cycles."""
    status_digest: str
    """A hash of every resource's status at the end: the same code and seed give the same digest,
    so a change meant to cost less without deciding differently can be checked to keep it."""


class ProfiledWorld:
    """Metrics of pods that serve a profile the operator does not know, noisy as real pods read.

    Each resource's pod runs the revision its Deployment names (``revisions``: rolled out at
    once), drafting the K the revision's schedule gives at the batch it carries, so a revision
    the loop chooses shows in the next measurement, as on a real pod."""

    def __init__(self, profile: ServingProfile, seed: int) -> None:
        self.profile = profile
        self.random = random.Random(seed)
        self.mean_batch: dict[tuple[str, str], float] = {}
        self.revisions: dict[str, Revision] = {}  # pod name -> the revision it runs
        # what each resource read at its last tick: one scrape reads the same however often it is looked up
        self.read: dict[tuple[str, str], tuple[datetime, Measurement]] = {}

    def register(self, key: Hashable, url: str | PrometheusSource, backend: str, interval_s: float) -> None:
        return None

    def unregister(self, key: Hashable) -> None:
        return None

    def lookup(
        self,
        url: str | PrometheusSource,
        backend: str,
        namespace: str,
        name: str,
        variant: str,
        now: datetime,
        draft_length: int | None = None,
        draft: str | None = None,
    ) -> Measurement:
        read = self.read.get((namespace, name))
        if read is not None and read[0] == now:
            return read[1]
        measurement = self._measure(namespace, name, now)
        self.read[(namespace, name)] = (now, measurement)
        return measurement

    def _measure(self, namespace: str, name: str, now: datetime) -> Measurement:
        mean = self.mean_batch.setdefault(
            (namespace, name), math.exp(self.random.uniform(0.0, math.log(256)))
        )
        pod = f"{label_value(name)}-pod"
        revision = self.revisions.get(pod, PLAIN)
        batch = max(1.0, self.random.gauss(mean, math.sqrt(mean)))
        length = revision.schedule.k_at(batch) if revision.schedule is not None else 0
        alpha = min(0.99, max(0.05, self.random.gauss(0.8, 0.05)))
        if length > 0:
            ms = self.profile.per_token_ms(alpha, length, batch)
        elif revision.mode == "spec":  # K=0 inside a speculating engine is not plain
            ms = self.profile.k0_ms_at(batch)
        else:
            ms = self.profile.plain_ms_at(batch)
        tpot = ms / 1000.0 * math.exp(self.random.gauss(0.0, 0.1))
        return Measurement(
            phase="Ok",
            at=now,
            alpha=alpha if length > 0 else None,
            acceptance_rate=alpha if length > 0 else None,
            mean_draft_length=float(length) if length > 0 else None,
            batch=batch,
            request_rate=batch / 20.0,
            tokens_per_s=batch / tpot,
            tpot_p50_s=tpot,
            tpot_p95_s=tpot * 1.2,
            tpot_p99_s=tpot * 1.3,
            tpot_mean_s=tpot,
            pods_reporting=1,
            per_pod={pod: PodMeasurement(batch=batch, tpot_mean_s=tpot)},
        )

    async def close(self) -> None:
        return None


def _resource(index: int, namespace: str) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load((EXAMPLES / EXAMPLE).read_text()))
    body["metadata"] = {"name": f"tick-{index:04d}", "namespace": namespace}
    spec = body["spec"]
    spec["serving"]["replicas"] = 1
    spec["metrics"] = {"prometheus": {"url": "http://127.0.0.1:9"}, "interval": "15s"}
    spec.setdefault("speculation", {})["rollout"] = {"baseline": DEFAULT_ROLLOUT, "soak": DEFAULT_ROLLOUT}
    return body


def _ready(cluster: EmulatedCluster, namespace: str) -> dict[str, PodEndpoint]:
    """Every serving Deployment rolled out, as the Deployment controller would report it; each
    resource's one ready pod, as the operator's pod index hands it to the tick."""
    endpoints: dict[str, PodEndpoint] = {}
    for index, deployment in enumerate(cluster.objects("deployments", namespace)):
        replicas = int(deployment["spec"].get("replicas") or 0)
        cluster.patch_status(
            "deployments",
            deployment["metadata"]["name"],
            {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": replicas,
                "availableReplicas": replicas,
                "conditions": [{"type": "Available", "status": "True"}],
            },
            namespace=namespace,
        )
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        owner = labels[LABEL_DEPLOYMENT]
        pod = {
            "metadata": {
                "name": f"{owner}-pod",
                "namespace": namespace,
                "labels": labels,
                "uid": f"pod-{index}",
            },
            "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
        }
        endpoint = ready_endpoint(pod)
        assert endpoint is not None
        endpoints[owner] = endpoint
    return endpoints


class _Fleet:
    """N resources on the emulated cluster, ticked by the production services on a simulated clock."""

    def __init__(
        self,
        cluster: EmulatedCluster,
        services: Services,
        world: ProfiledWorld,
        names: list[str],
        endpoints: dict[str, PodEndpoint],
    ) -> None:
        self.endpoints = endpoints
        self.cluster = cluster
        self.services = services
        self.world = world
        self.names = names
        self.bodies: dict[str, dict[str, Any]] = {}
        self.now = T0
        self.writes = 0
        self.events = 0
        self.unchanged = 0
        self.rollouts = 0
        self.reasons: collections.Counter[str] = collections.Counter()

    async def cycle(self, interval_s: float) -> None:
        """Every resource ticks once, in a random order, the clock an interval on."""
        self.now += timedelta(seconds=interval_s)
        order = list(enumerate(self.names))
        self.world.random.shuffle(order)
        for index, name in order:
            now = self.now + timedelta(seconds=interval_s * index / len(self.names))
            body = self.bodies.get(name)
            endpoints = [self.endpoints[label_value(name)]]
            outcome = await self.services.tick(
                self.cluster.namespace, name, functools.partial(_at, now), body, endpoints
            )
            self.events += len(outcome.events)
            self.reasons.update(event.reason for event in outcome.events)
            self.unchanged += outcome.unchanged
            if outcome.body is not None and not outcome.unchanged:  # as handlers.control.tick_once
                if body is None or outcome.body.get("metadata", {}).get("resourceVersion") != body.get(
                    "metadata", {}
                ).get("resourceVersion"):
                    self.writes += body is not None
                self.bodies[name] = outcome.body
                shown = outcome.status if outcome.status is not None else outcome.body.get("status")
                operator_metrics.observe_status(
                    self.cluster.namespace, name, shown or {}, outcome.body.get("spec")
                )
                self._roll(name, shown or {})

    def _roll(self, name: str, status: Mapping[str, Any]) -> None:
        """The Deployment controller and kubelet at once: the pod runs the revision status names
        (the stable Deployment the tick re-rendered with it) from the next tick on."""
        recorded = (status.get("speculation") or {}).get("revision")
        owner = label_value(name)
        endpoint = self.endpoints[owner]
        if not recorded or recorded.get("digest") == endpoint.revision:
            return
        revision = revision_from_status(RevisionStatus.model_validate(recorded))
        self.world.revisions[endpoint.name] = revision if revision is not None else PLAIN
        self.endpoints[owner] = dataclasses.replace(endpoint, revision=str(recorded["digest"]))
        self.rollouts += 1


def _at(moment: datetime) -> datetime:
    return moment


@contextlib.contextmanager
def _api_server_cpu(cluster: EmulatedCluster) -> Iterator[list[float]]:
    """CPU the emulated API server's request handling takes (it runs in this process), summed."""
    spent = [0.0]
    kind = type(cluster.emulator)  # a slotted class: its method is wrapped, not the instance's
    handle = kind._handle

    async def timed(self: Any, request: Any) -> Any:
        start = time.process_time()
        try:
            return await handle(self, request)
        finally:
            spent[0] += time.process_time() - start

    kind._handle = timed  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        kind._handle = handle  # type: ignore[method-assign]


@contextlib.contextmanager
def _refresh_budget_of(fleet: int, resources: int) -> Iterator[None]:
    """Measurement refreshes paced as in a fleet of `fleet` resources (the tick spaces them by active
    resources / REFRESH_WRITES_PER_S): N resources then write as N of that fleet do."""
    kept = tick_module.REFRESH_WRITES_PER_S
    tick_module.REFRESH_WRITES_PER_S = kept * resources / max(resources, fleet)
    try:
        yield
    finally:
        tick_module.REFRESH_WRITES_PER_S = kept


async def measure(
    resources: int,
    cycles: int,
    *,
    seed: int = 1,
    settle_cycles: int = SETTLE_CYCLES,
    fleet: int = FLEET,
    profile_out: Path | None = None,
) -> TickCostResult:
    with _refresh_budget_of(fleet, resources):
        return await _measure(resources, cycles, seed, settle_cycles, profile_out)


async def _measure(
    resources: int, cycles: int, seed: int, settle_cycles: int, profile_out: Path | None
) -> TickCostResult:
    interval_s = 15.0
    world = ProfiledWorld(load_builtin(WORLD), seed)
    with tempfile.TemporaryDirectory(prefix="specops-tick-") as tmp:
        async with emulated_cluster([], Path(tmp), crds=[build_crd()]) as cluster:
            with environment(operator_environment(cluster.kubeconfig_path, interval_s, interval_s)):
                services = await build_services()
            try:
                # the world stands in for the metrics hub (a MetricsSource, as a test's would)
                services.control.metrics = world
                services.canary.metrics = world
                services.metrics = world  # type: ignore[assignment]
                names = []
                for index in range(resources):
                    body = cluster.create("speculativedeployments", _resource(index, cluster.namespace))
                    names.append(body["metadata"]["name"])
                    await services.reconciler.reconcile(body, T0)
                endpoints = _ready(cluster, cluster.namespace)
                for name in names:
                    await services.reconciler.refresh(cluster.namespace, name, T0)
                    # past its first draft's check, as a fleet is once started (the scale bench
                    # measures the check pods of a start-up)
                    cluster.patch_status(
                        "speculativedeployments",
                        name,
                        {"draft": {"losslessCheck": "Passed"}},
                        namespace=cluster.namespace,
                    )
                fleet = _Fleet(cluster, services, world, names, endpoints)
                for _ in range(settle_cycles):
                    await fleet.cycle(interval_s)
                gc.collect()
                fleet.writes = fleet.events = fleet.unchanged = fleet.rollouts = 0
                fleet.reasons.clear()
                profiler = cProfile.Profile() if profile_out is not None else None
                with _api_server_cpu(cluster) as api_cpu:
                    start = time.process_time()
                    if profiler is not None:
                        profiler.enable()
                    for _ in range(cycles):
                        await fleet.cycle(interval_s)
                    if profiler is not None:
                        profiler.disable()
                    spent = time.process_time() - start
                if profiler is not None and profile_out is not None:
                    profiler.dump_stats(str(profile_out))
                digest = hashlib.sha256()
                for name in names:
                    stored = cluster.get("speculativedeployments", name) or {}
                    digest.update(json.dumps(stored.get("status"), sort_keys=True).encode())
            finally:
                await services.close()
    ticks = resources * cycles
    print("Events over the measured cycles:", dict(fleet.reasons.most_common()), file=sys.stderr)
    own = max(0.0, spent - api_cpu[0])
    return TickCostResult(
        resources=resources,
        cycles=cycles,
        tick_cpu_ms=round(own / ticks * 1000.0, 4),
        cycle_cpu_seconds=round(own / cycles, 4),
        api_server_cpu_ms_per_tick=round(api_cpu[0] / ticks * 1000.0, 4),
        status_writes_per_cycle=round(fleet.writes / cycles, 2),
        events_per_cycle=round(fleet.events / cycles, 2),
        unchanged_share=round(fleet.unchanged / ticks, 3),
        rollouts_per_cycle=round(fleet.rollouts / cycles, 2),
        status_digest=digest.hexdigest()[:16],
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="specops bench tick", description=__doc__.split("\n\n")[0])
    parser.add_argument("--resources", type=int, default=200, help="SpeculativeDeployments (default 200)")
    parser.add_argument("--cycles", type=int, default=20, help="measured control cycles (default 20)")
    parser.add_argument(
        "--settle-cycles",
        type=int,
        default=SETTLE_CYCLES,
        help=f"cycles before the measured ones (default {SETTLE_CYCLES}: 30 simulated minutes)",
    )
    parser.add_argument(
        "--fleet",
        type=int,
        default=FLEET,
        help=f"status refreshes paced as in a fleet of this many resources (default {FLEET})",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", type=Path, help="write a cProfile of the measured cycles here (pstats)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args(argv)
    result = asyncio.run(
        measure(
            args.resources,
            args.cycles,
            seed=args.seed,
            settle_cycles=args.settle_cycles,
            fleet=args.fleet,
            profile_out=args.profile,
        )
    )
    for key, value in asdict(result).items():
        print(f"{key:>28}: {value}")
    write_json(asdict(result), args.json)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
