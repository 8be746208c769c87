"""The outside world as services see it: small Protocols, and results that carry errors as data.

Services depend on these ports only; adapters implement them (structurally) and only the
wiring module (services/container.py) names an adapter. Tests pass real adapters pointed
at simulated pods, or plain in-memory objects.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from specops.api.models import PrometheusSource, SpeculativeDeploymentSpec
from specops.domain.metrics import Measurement

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KubeApiError(Exception):
    """A non-2xx answer from the API server (or none at all), with the Status reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class MetricsSource(Protocol):
    """Latest measurements per (namespace, deployment, variant), read from memory."""

    def register(
        self, key: Hashable, source: str | PrometheusSource, backend: str, interval_s: float
    ) -> None:
        """Start (or join) polling ``source`` (a URL, or spec.metrics.prometheus) for ``backend`` on
        behalf of resource ``key``, its (namespace, name): the namespace whose Secrets and ConfigMaps
        hold the credentials."""
        ...

    def unregister(self, key: Hashable) -> None:
        """Forget ``key``; the poller stops when no resource needs it any more."""
        ...

    def lookup(
        self,
        source: str | PrometheusSource,
        backend: str,
        namespace: str,
        name: str,
        variant: str,
        now: datetime,
        draft_length: int | None = None,
        draft: str | None = None,
    ) -> Measurement:
        """The latest measurement, or an Error measurement (never an exception).

        ``draft`` (``drafts.draft_identity``) keeps only the series of pods serving that draft.
        """
        ...

    async def close(self) -> None: ...


class KubePort(Protocol):
    """The Kubernetes reads and writes services need (KubeClient implements it)."""

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None: ...

    async def list(
        self, api_version: str, kind: str, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]: ...

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        content_type: str = ...,
    ) -> dict[str, Any]: ...

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool: ...

    async def update_status(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        mutate: Callable[[dict[str, Any]], dict[str, Any] | None],
        *,
        attempts: int = ...,
        base: Mapping[str, Any] | None = ...,
    ) -> dict[str, Any] | None: ...


TrafficRouting = Literal["GatewayAPI", "ReplicaRatio"]


@dataclass(frozen=True)
class RouteResult:
    ok: bool
    weight: int  # canary percent actually configured
    message: str = ""
    changed: bool = False  # a write was needed (the route did not carry the split before)


class TrafficRouter(Protocol):
    """Splits one resource's traffic between its stable and canary variants (like Flagger's routers).

    The canary's replicas are the canary service's business; a router only says how much
    traffic the canary gets, and how close to a requested weight it can get.
    """

    routing: TrafficRouting

    def achievable(self, weight: int, stable_replicas: int) -> int:
        """The canary share in percent this router gives for a requested `weight`."""
        ...

    async def set_weight(
        self, namespace: str, name: str, spec: SpeculativeDeploymentSpec, weight: int
    ) -> RouteResult:
        """Send `weight` % to the canary; the result is checked and read back, never assumed."""
        ...


class RouteWeights(Protocol):
    """Backend weights on a user's HTTPRoute: one of our Services beside the stable one."""

    async def set_route_weight(
        self, namespace: str, route: str, stable_service: str, other_service: str, weight: int
    ) -> RouteResult:
        """Give ``other_service`` ``weight`` % of what the rules naming ``stable_service`` carry (0:
        drop it from them); written, then read back: only a route seen to carry it counts."""
        ...


@dataclass(frozen=True)
class GenerateOutput:
    """One greedy completion from a serving engine; ``ok=False`` carries the error as text."""

    ok: bool
    text: str = ""
    error: str = ""
    status: int | None = None  # the HTTP status, when an answer came back
    seconds: float = 0.0  # how long the call took


class EngineClient(Protocol):
    """The serving engines' own HTTP APIs, as the lossless check and smoke tests use them.

    Errors (refused connections, timeouts, non-2xx answers, unreadable bodies) come back as
    data, never as exceptions.
    """

    async def generate(
        self, url: str, backend: str, model: str, prompt: str, max_tokens: int, timeout_s: float
    ) -> GenerateOutput:
        """Greedy (temperature 0) completion of ``prompt`` by the engine at base ``url``."""
        ...

    async def healthy(self, url: str, backend: str, timeout_s: float = ...) -> bool:
        """Whether the engine's own readiness endpoint answers 200."""
        ...

    async def close(self) -> None: ...
