"""`specops bench scale`: a tiny run (three resources, 2 s intervals) writes the documented figures.

Timings are not asserted here (the benchmark measures them); this checks that a run reaches
steady state with the operator as its own process and the pods in a pod farm process, that every
figure is there and plausible, and that the farm closed its pods' ports when the run ended.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specops.bench import BENCHMARKS
from specops_local.scale import machine_cpu

pytestmark = pytest.mark.timeout(180)

KEYS = {
    "resources",
    "initial_reconcile_seconds",
    "cycle_cpu_seconds",
    "promql_queries_per_cycle",
    "api_requests_per_second",
    "peak_rss_mib",
    # what the fleet did in the window, to compare runs by
    "status_writes_per_resource_cycle",
    "length_steps_per_resource_cycle",
    "resources_stepping_at_start",
    "unchanged_share",
    # and how fast the machine was then
    "machine_reference_cpu_seconds",
    "machine_cpu",
}


def test_scale_bench_writes_every_figure_for_a_small_fleet(tmp_path: Path) -> None:
    assert "scale" in BENCHMARKS
    out = tmp_path / "scale.json"
    command = [sys.executable, "-m", "specops.cli", "bench", "scale", "--resources", "3"]
    command += ["--interval", "2s", "--cycles", "2", "--rollout", "2s", "--timeout", "90", "--json", str(out)]
    command += ["--workdir", str(tmp_path / "work")]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=170, check=False)
    assert finished.returncode == 0, finished.stderr[-3000:]
    figures = json.loads(out.read_text())

    assert set(figures) == KEYS
    assert figures["resources"] == 3
    assert 0 < figures["initial_reconcile_seconds"] < 90
    # The operator process ran its control loop: it used CPU, asked the API server, and the
    # shared poller asked Prometheus (grouped queries: a handful per cycle, not one per resource).
    assert figures["cycle_cpu_seconds"] > 0
    # a steady fleet makes almost no API requests (measurements written once a refresh period)
    assert figures["api_requests_per_second"] >= 0
    assert 1 <= figures["promql_queries_per_cycle"] <= 40
    assert 30 < figures["peak_rss_mib"] < 1000
    assert 0 <= figures["length_steps_per_resource_cycle"] <= figures["status_writes_per_resource_cycle"] + 1
    assert 0 <= figures["resources_stepping_at_start"] <= 3
    assert 0.0 <= figures["unchanged_share"] <= 1.0
    assert figures["machine_reference_cpu_seconds"] > 0
    assert figures["machine_cpu"].split(",")[0] == machine_cpu().split(",")[0]
    assert "CPU per control cycle" in finished.stdout
    # measured where a deployment spends its life: after Baseline and Fixed, in Dynamic
    assert "every resource in the Dynamic phase after" in finished.stderr, finished.stderr[-3000:]
    assert "revisions settled after" in finished.stderr, finished.stderr[-3000:]
    # and it read the operator's own count of garbage-collector pauses over the window
    assert "the operator's garbage collector in the window:" in finished.stderr, finished.stderr[-3000:]
    # and its liveness probe sees every resource's control loop ticking (a probe that saw none
    # would call a stalled operator healthy)
    assert "the operator's liveness probe: 3 resources ticking on time" in finished.stderr, finished.stderr
    # and it noted the operator's memory over the run, from before the first resource on
    series = re.search(r"the operator's RSS \(MiB\) every 60 s from the start: ([0-9, ]+)", finished.stderr)
    assert series is not None, finished.stderr[-3000:]
    assert all(30 < float(rss) <= figures["peak_rss_mib"] + 1 for rss in series.group(1).split(", "))

    # The pods ran in the pod farm (the default), which published them to Prometheus from its own
    # targets file, and stopped with the run: none of their metrics ports still listens.
    assert "1 pod farm(s) live" in finished.stderr
    groups = json.loads((tmp_path / "work" / "prometheus" / "targets.d" / "farm-0.json").read_text())
    # one pod a resource, named as a ReplicaSet names it (Deployment, template hash, ordinal)
    published = sorted(group["labels"]["pod"] for group in groups)
    assert len(published) == 3, published
    for index, pod in enumerate(published):
        assert re.fullmatch(rf"scale-000{index}-[0-9a-f]+-[0-9]+", pod), published
    for group in groups:
        host, port = group["targets"][0].split(":")
        with socket.socket() as probe:
            assert probe.connect_ex((host, int(port))) != 0, f"{group['labels']['pod']} still listens"


def _children(pid: int) -> dict[int, str]:
    """The process's children (from every thread's list) and their command names."""
    found: dict[int, str] = {}
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in children.read_text().split():
            comm = Path(f"/proc/{child}/comm")
            if comm.exists():
                found[int(child)] = comm.read_text().strip()
    return found


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_terminated_scale_bench_stops_every_process_it_started(tmp_path: Path) -> None:
    # Given a scale bench whose Prometheus, pod farm and operator are running
    command = [sys.executable, "-m", "specops.cli", "bench", "scale", "--resources", "2"]
    command += ["--interval", "2s", "--cycles", "50", "--rollout", "2s", "--workdir", str(tmp_path / "work")]
    bench = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        assert bench.stderr is not None
        seen: list[str] = []
        for line in bench.stderr:
            seen.append(line)
            if "operator running" in line:
                break
        else:
            pytest.fail("".join(seen)[-3000:])
        started = _children(bench.pid)
        assert "prometheus" in started.values(), started
        assert len(started) >= 3, started  # Prometheus, the pod farm, the operator
        # When it is sent SIGTERM (as `timeout`, a CI runner or a profiler's end sends it)
        bench.terminate()
        rest = bench.communicate(timeout=60)[1]
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    # Then it says so, and none of the processes it started outlives it
    outlived = [f"{name} ({pid})" for pid, name in started.items() if _alive(pid)]
    for pid in started:  # (the test stops what a failure left behind)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert bench.returncode == 128 + 15, "".join(seen)[-2000:] + rest[-2000:]
    assert "terminated; every process it started has stopped" in rest
    assert outlived == []
