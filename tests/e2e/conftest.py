"""End-to-end fixtures: the real operator (production handlers) running in-process against the cluster."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

import specops.handlers  # noqa: F401  (registers the production handlers in Kopf's default registry)
from specops_local.kopf_runner import OperatorRun, run_kopf
from specops_local.prometheus import PrometheusProcess, run_prometheus
from specops_local.serving import DraftBehaviour, ServingController
from specops_local.sim import LoadPoint
from tests.conftest import EXAMPLES

NAMESPACE = "default"
RESTART_S = 0.5
"""Start-to-ready seconds of the simulated engines in these tests (a real one takes minutes)."""


def example(name: str = "dense-70b-7b.yaml", **spec_changes: Any) -> dict[str, Any]:
    """An example resource moved to the test namespace, with fast rollout settings and spec overrides.

    Its checkpoints (target.uri, draft.uri, draft.method) and backend are the example's; a
    ``serving`` override is merged into 2 replicas of 1 GPU each."""
    body = yaml.safe_load((EXAMPLES / name).read_text())
    body["metadata"]["namespace"] = NAMESPACE
    backend = body["spec"].pop("serving", {}).get("backend", "triton")
    body["spec"]["serving"] = {
        "backend": backend,
        "replicas": 2,
        "gpu": {"type": "H100", "count": 1},
        "tensorParallel": 1,
    }
    body["spec"]["metrics"] = {"prometheus": {"url": "http://127.0.0.1:9"}, "interval": "1s"}
    for block, value in spec_changes.items():
        if isinstance(value, dict) and isinstance(body["spec"].get(block), dict):
            body["spec"][block].update(value)
        else:
            body["spec"][block] = value
    return body


class Operator:
    """Start, stop and restart the operator under test."""

    def __init__(self) -> None:
        self._stack: contextlib.AsyncExitStack | None = None
        self.run: OperatorRun | None = None

    async def start(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.run = await self._stack.enter_async_context(
            run_kopf(kopf.get_default_registry(), startup_timeout_s=20.0)
        )

    async def stop(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None
            self.run = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()


@pytest.fixture
def operator_env(operator_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared fast settings, and short calls to the (local, simulated) engines."""
    monkeypatch.delenv("SPECOPS_DEFAULT_IMAGE", raising=False)  # each backend's own image
    monkeypatch.setenv("SPECOPS_ENGINE_DEADLINE_SECONDS", "5")


@pytest.fixture
async def operator(cluster: object, operator_env: None) -> AsyncIterator[Operator]:
    handle = Operator()
    await handle.start()
    try:
        yield handle
    finally:
        await handle.stop()


@pytest.fixture
async def prometheus(tmp_path: Path) -> AsyncIterator[PrometheusProcess]:
    """Debian's Prometheus scraping every second (the simulated pods are its targets)."""
    async with run_prometheus(tmp_path / "prometheus", scrape_interval="1s") as prom:
        yield prom


@pytest.fixture
def serving_load() -> LoadPoint:
    """The load every simulated pod starts with; a test module may override this fixture."""
    return LoadPoint(batch=16, alpha=0.8)


@pytest.fixture
def draft_behaviours() -> dict[str, DraftBehaviour]:
    """How each draft version behaves in the simulated pods; a test module may override this fixture."""
    return {}


@pytest.fixture
async def serving(
    cluster: Any,
    prometheus: PrometheusProcess,
    serving_load: LoadPoint,
    draft_behaviours: dict[str, DraftBehaviour],
) -> AsyncIterator[ServingController]:
    """Plays the Deployment controller and kubelet: a simulated engine per pod of every serving
    Deployment, started from its command, args and config files, ready RESTART_S later."""
    async with ServingController(
        cluster, prometheus, load=serving_load, drafts=draft_behaviours, restart_s=RESTART_S, poll_s=0.05
    ) as controller:
        yield controller


def crd_path() -> Path:
    from tests.conftest import CRD_PATH

    return CRD_PATH
