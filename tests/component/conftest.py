"""Fixtures the component tests share (the cluster and the client are the suite's, tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest

from specops_local.cluster import EmulatedCluster


@pytest.fixture
def failing_route_writes(cluster: EmulatedCluster) -> dict[str, bool]:
    """While `on`, every PATCH of the HTTPRoute answers 503 (the API server, not the route, fails)."""
    switch = {"on": False}

    def matches(request: Any) -> bool:
        return switch["on"] and request.method == "PATCH" and "/httproutes/" in str(request.url)

    cluster.emulator[matches] << 503
    return switch
