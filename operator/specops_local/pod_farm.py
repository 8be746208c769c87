"""A pod farm: simulated serving pods and their controller in a process of their own.

``python -m specops_local.pod_farm --kubeconfig K --targets-file F --shard I --shards S`` runs a
`ServingController` over the emulated API server's HTTP API (`RemoteCluster`) for the serving
Deployments whose namespace/name hashes to shard I of S. Its pods are the scale benchmark's:
no ticker task each (``tick_interval=None``); one task advances every pod's performance model
every ``--advance-every`` seconds, ``--advance-batch`` pods at a time, in one integration step
(under the benchmark's constant, noise-free load a step of 10 s gives the counters 0.25 s steps
give, for a fortieth of the CPU). Each engine still listens on
its own port(s), and becomes ready ``--restart-s`` seconds after it starts. The farm writes its Prometheus file_sd target groups to its own file (the
benchmark points it into Prometheus's ``targets.d``); the file first appears after the farm's
first complete pass over the Deployments, which is how the benchmark knows the farm is live.

SIGTERM or SIGINT stops it cleanly: every pod's ports are closed before it exits. It also stops
when the process that started it goes away, so a killed benchmark leaves no farm behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from specops_local.remote_cluster import USER_AGENT, RemoteCluster
from specops_local.serving import Body, ServingController
from specops_local.sim import MAX_TICK_SECONDS, LoadPoint

ADVANCE_EVERY_S = 10.0
ADVANCE_BATCH = 50
POLL_S = 2.0
RESTART_S = 1.0
"""Seconds a farm's engines take from start to ready (the benchmark measures the operator, not restarts)."""
CONCURRENCY = 16
"""Deployments a farm syncs at a time (each costs a few API round trips when its pods start)."""

log = logging.getLogger(__name__)


def shard_of(namespace: str, name: str, shards: int) -> int:
    """The shard a Deployment belongs to: a stable hash (the same in every process and run)."""
    return zlib.crc32(f"{namespace}/{name}".encode()) % shards


def in_shard(shard: int, shards: int) -> Callable[[Body], bool]:
    def selected(deployment: Body) -> bool:
        meta = deployment["metadata"]
        return shard_of(meta.get("namespace") or "", meta["name"], shards) == shard

    return selected


class FileTargets:
    """A `TargetSink` that writes one file_sd file, atomically (Prometheus never reads half of it)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def set_targets(self, groups: Sequence[Mapping[str, Any]]) -> None:
        partial = self.path.with_name(self.path.name + ".tmp")  # not *.json: outside the glob
        partial.write_text(json.dumps(list(groups)))
        os.replace(partial, self.path)


FARM_NOISE = {"noise_sigma": 0.1, "batch_noise": 1.0, "alpha_noise": 0.05}
"""How a farm's pods read: each token latency sample x exp(N(0, 0.1)), the batch of each 10 s step
N(mean, sqrt(mean)) (Poisson-like), acceptance N(mean, 0.05) per step. A fleet that reads the same
every scrape decides nothing new and writes nothing: the operator's cost would be understated."""


def farm_pod_options(resource: Any, _variant: str) -> dict[str, Any]:
    """A farm pod: advanced by `advance_pods` (no ticker of its own), noisy as FARM_NOISE, with a
    seed of its own (from the resource's name: the fleet's noise is not one draw repeated)."""
    metadata = resource.get("metadata") if isinstance(resource, dict) else getattr(resource, "metadata", None)
    name = str((metadata or {}).get("name", ""))
    return {"tick_interval": None, **FARM_NOISE, "seed": zlib.crc32(name.encode())}


async def advance_pods(
    serving: ServingController,
    stop: asyncio.Event,
    every_s: float = ADVANCE_EVERY_S,
    batch: int = ADVANCE_BATCH,
) -> None:
    """One task advances every pod's model (instead of one ticker task per pod), one step each."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
        now = loop.time()
        for index, pod in enumerate(serving.all_pods()):
            if pod.running:
                pod.advance(now - last, max_tick=max(now - last, MAX_TICK_SECONDS))
            if index % batch == batch - 1:
                await asyncio.sleep(0)  # the pods' ports (and the controller) answer meanwhile
        last = now


async def _until_orphaned(stop: asyncio.Event, every_s: float) -> None:
    parent = os.getppid()
    while not stop.is_set():
        if os.getppid() != parent:
            log.warning("the process that started this farm is gone; stopping")
            stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def run_farm(
    kubeconfig: Path,
    targets_file: Path,
    *,
    shard: int = 0,
    shards: int = 1,
    advance_every_s: float = ADVANCE_EVERY_S,
    advance_batch: int = ADVANCE_BATCH,
    poll_s: float = POLL_S,
    concurrency: int = CONCURRENCY,
    load: LoadPoint | None = None,
    restart_s: float = RESTART_S,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve this shard's Deployments until ``stop`` is set (or SIGTERM/SIGINT arrives)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    cluster = RemoteCluster.from_kubeconfig(kubeconfig, agent=f"{USER_AGENT}/{shard}")
    try:
        async with ServingController(
            cluster,
            FileTargets(targets_file),
            load=load or LoadPoint(batch=8, alpha=0.8),
            pod_options=farm_pod_options,
            restart_s=restart_s,
            poll_s=poll_s,
            select=in_shard(shard, shards) if shards > 1 else None,
            concurrency=concurrency,
        ) as serving:
            await asyncio.gather(
                advance_pods(serving, stop, advance_every_s, advance_batch),
                _until_orphaned(stop, poll_s),
            )
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await cluster.aclose()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specops_local.pod_farm",
        description="Run simulated serving pods for one shard of the serving Deployments of an "
        "emulated cluster, in this process, and write their Prometheus file_sd targets.",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="the emulated cluster's kubeconfig")
    parser.add_argument("--targets-file", type=Path, required=True, help="file_sd JSON this farm writes")
    parser.add_argument("--shard", type=int, default=0, help="this farm's shard, 0 <= I < S (default 0)")
    parser.add_argument("--shards", type=int, default=1, help="how many farms share the Deployments")
    parser.add_argument("--advance-every", type=float, default=ADVANCE_EVERY_S, help="seconds (default 10)")
    parser.add_argument("--advance-batch", type=int, default=ADVANCE_BATCH, help="pods between yields")
    parser.add_argument("--poll", type=float, default=POLL_S, help="Deployment poll interval, seconds")
    parser.add_argument(
        "--concurrency", type=int, default=CONCURRENCY, help="Deployments synced at a time (default 16)"
    )
    parser.add_argument("--batch", type=float, default=8.0, help="the pods' offered batch (default 8)")
    parser.add_argument("--alpha", type=float, default=0.8, help="the pods' offered acceptance (0.8)")
    parser.add_argument(
        "--restart-s", type=float, default=RESTART_S, help="engine start-to-ready seconds (default 1)"
    )
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    if not 0 <= args.shard < args.shards:
        parser.error("--shard must be in [0, --shards)")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(
        run_farm(
            args.kubeconfig,
            args.targets_file,
            shard=args.shard,
            shards=args.shards,
            advance_every_s=args.advance_every,
            advance_batch=args.advance_batch,
            poll_s=args.poll,
            concurrency=args.concurrency,
            load=LoadPoint(batch=args.batch, alpha=args.alpha),
            restart_s=args.restart_s,
        )
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
