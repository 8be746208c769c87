"""Shared fixtures: the emulated cluster (or a real one with --cluster), the operator, Prometheus, sim pods."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CRD_PATH = ROOT / "crds" / "specops.dev_speculativedeployments.yaml"
EXAMPLES = ROOT / "docs" / "examples"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cluster",
        action="store_true",
        default=False,
        help="run the end-to-end tests against the cluster in $KUBECONFIG instead of the emulated one",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--cluster"):
        return
    only_emulated = pytest.mark.skip(
        reason="needs the emulated cluster's simulated serving pods (--cluster given)"
    )
    for item in items:
        if "emulated_only" in item.keywords:
            item.add_marker(only_emulated)


@pytest.fixture
def use_real_cluster(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--cluster"))


@pytest.fixture
def operator_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Operator settings for fast tests: 1 s loops and scrapes, a default image, no PodMonitor CRD."""
    monkeypatch.setenv("SPECOPS_DEFAULT_IMAGE", "registry.example.com/tritonserver:test")
    monkeypatch.setenv("SPECOPS_POD_MONITOR", "false")
    monkeypatch.setenv("SPECOPS_DEFAULT_INTERVAL_SECONDS", "1")
    monkeypatch.setenv("SPECOPS_SCRAPE_INTERVAL_SECONDS", "1")
    monkeypatch.setenv("SPECOPS_TRITON_RETRIES", "1")


@pytest.fixture
async def cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_real_cluster: bool
) -> AsyncIterator[object]:
    if use_real_cluster:
        if not os.environ.get("KUBECONFIG"):
            pytest.fail("--cluster needs KUBECONFIG pointing at a cluster with the CRD applied")
        yield None
        return
    from specops_local.cluster import emulated_cluster
    from specops_local.upstream_crds import upstream_crds

    async with emulated_cluster([CRD_PATH], tmp_path, crds=upstream_crds()) as emulated:
        monkeypatch.setenv("KUBECONFIG", str(emulated.kubeconfig_path))
        yield emulated


@pytest.fixture
async def kube(cluster: object) -> AsyncIterator[object]:
    """The project's own async client, pointed at whichever cluster the tests use."""
    from specops.adapters.kube import KubeClient, load_connection_settings

    client = KubeClient(load_connection_settings())
    try:
        yield client
    finally:
        await client.close()
