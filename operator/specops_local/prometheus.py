"""Run Debian's real Prometheus for tests: 127.0.0.1, a free port, file-based service discovery.

Scrape targets are written to targets.json (and read from every targets.d/*.json, which other
processes may write: the scale benchmark's pod farms) with the labels the production
PodMonitor relabels pods into (namespace, specops_deployment, variant, pod).
The first scrape of a new target lands about 5 s after it is written
(Prometheus throttles discovery updates), so tests poll with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

Vector = list[dict[str, Any]]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _config(scrape_interval: str, targets_file: Path, targets_dir: Path) -> str:
    return json.dumps(
        {
            "global": {
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "evaluation_interval": scrape_interval,
            },
            "scrape_configs": [
                {
                    "job_name": "specops-pods",
                    "file_sd_configs": [
                        {
                            "files": [str(targets_file), str(targets_dir / "*.json")],
                            "refresh_interval": "1s",
                        }
                    ],
                }
            ],
        },
        indent=2,
    )


class PrometheusProcess:
    """A Prometheus server owned by one test; stop() and start() keep its port and data (outage tests)."""

    def __init__(self, workdir: Path, scrape_interval: str, binary: str) -> None:
        self.workdir = workdir
        self.binary = binary
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets_file = workdir / "targets.json"
        self.targets_dir = workdir / "targets.d"
        """Prometheus also reads every *.json here: target files other processes write."""
        self.config_file = workdir / "prometheus.yml"
        self.log_file = workdir / "prometheus.log"
        self.data_dir = workdir / "data"
        self._process: asyncio.subprocess.Process | None = None
        self._http = httpx.AsyncClient(timeout=5.0)
        self.set_targets([])
        self.targets_dir.mkdir(exist_ok=True)
        self.config_file.write_text(_config(scrape_interval, self.targets_file, self.targets_dir))

    @property
    def pid(self) -> int | None:
        """The server's process while it runs (benchmarks read its CPU time)."""
        return self._process.pid if self._process is not None and self._process.returncode is None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    def set_targets(self, groups: Sequence[Mapping[str, Any]]) -> None:
        """Replace the scrape targets; written atomically so Prometheus never reads half a file."""
        partial = self.targets_file.with_suffix(".json.tmp")
        partial.write_text(json.dumps(list(groups)))
        os.replace(partial, self.targets_file)

    async def start(self, ready_timeout_s: float = 30.0) -> None:
        if self.running:
            return
        with self.log_file.open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                self.binary,
                f"--config.file={self.config_file}",
                f"--storage.tsdb.path={self.data_dir}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        await self._wait_ready(ready_timeout_s)

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            if not self.running:
                raise RuntimeError(f"prometheus exited: {self.log_file.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if (await self._http.get(f"{self.url}/-/ready")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"prometheus not ready after {timeout_s}s: {self.log_file.read_text()[-2000:]}")

    async def stop(self, grace_s: float = 10.0) -> None:
        """Terminate our own process (by PID) and wait until the port is free again."""
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            process.kill()
            await process.wait()

    async def query(self, promql: str) -> Vector:
        response = await self._http.get(f"{self.url}/api/v1/query", params={"query": promql})
        body = response.json()
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body}")
        result: Vector = body["data"]["result"]
        return result

    async def wait_for(
        self,
        promql: str,
        predicate: Callable[[Vector], bool],
        timeout: float = 20.0,  # noqa: ASYNC109 (a deadline that reports the last answer)
        every_s: float = 0.25,
    ) -> Vector:
        """Poll ``promql`` until ``predicate`` holds for its vector; TimeoutError shows the last answer."""
        deadline = asyncio.get_running_loop().time() + timeout
        last: Vector = []
        while True:
            with contextlib.suppress(httpx.HTTPError):
                last = await self.query(promql)
                if predicate(last):
                    return last
            if asyncio.get_running_loop().time() >= deadline:
                raise TimeoutError(f"{promql!r} did not satisfy the condition in {timeout}s; last: {last}")
            await asyncio.sleep(every_s)

    async def aclose(self) -> None:
        await self.stop()
        await self._http.aclose()


@contextlib.asynccontextmanager
async def run_prometheus(tmp_path: Path, scrape_interval: str = "1s") -> AsyncIterator[PrometheusProcess]:
    """Start Prometheus for the duration of the block; it is always stopped on exit."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed (make prometheus)")
    workdir = tmp_path / "prometheus"
    workdir.mkdir(parents=True, exist_ok=True)
    prom = PrometheusProcess(workdir, scrape_interval, binary)
    try:
        await prom.start()
        yield prom
    finally:
        await prom.aclose()
