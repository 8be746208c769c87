"""Which serving pods can be talked to, read from Pod objects as the API server returns them.

Simulated pods publish 127.0.0.1 and their real port in the same fields, so this
code is the one production runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

VARIANT_LABEL = "specops.dev/variant"
DRAFT_LABEL = "specops.dev/draft"
SERVING_CONTAINER = "engine"
REVISION_LABEL = "specops.dev/revision"
BACKEND_LABEL = "specops.dev/backend"
MODE_LABEL = "specops.dev/mode"
HTTP_PORT_NAME = "http"
DEFAULT_HTTP_PORT = 8000


@dataclass(frozen=True)
class PodEndpoint:
    """Address of one serving pod's engine HTTP endpoint."""

    name: str
    namespace: str
    host: str
    http_port: int
    variant: str
    draft: str = ""
    """The pod's ``specops.dev/draft`` label: which draft it serves."""
    incarnation: str = ""
    """The pod's uid and its serving container's restart count (a restarted engine starts afresh)."""
    revision: str = ""
    """The pod's ``specops.dev/revision`` label: the configuration revision it runs."""
    backend: str = ""
    """The pod's ``specops.dev/backend`` label: which engine API it speaks."""
    mode: str = ""
    """The pod's ``specops.dev/mode`` label: plain or spec."""
    start_s: float | None = None
    """Seconds from the pod's creation to its Ready condition: what one restart of it costs."""

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def address(self) -> str:
        """host:port."""
        return f"{self.host}:{self.http_port}"


def _is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _http_port(pod: Mapping[str, Any]) -> int:
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        return DEFAULT_HTTP_PORT
    serving = next((c for c in containers if c.get("name") == SERVING_CONTAINER), containers[0])
    for port in serving.get("ports") or []:
        if port.get("name") == HTTP_PORT_NAME and port.get("containerPort"):
            return int(port["containerPort"])
    return DEFAULT_HTTP_PORT


def ready_endpoint(pod: Mapping[str, Any]) -> PodEndpoint | None:
    """The pod's endpoint when it is Ready, has an IP and is not terminating; else None."""
    metadata = pod.get("metadata") or {}
    pod_ip = (pod.get("status") or {}).get("podIP")
    if metadata.get("deletionTimestamp") or not pod_ip or not _is_ready(pod):
        return None
    return PodEndpoint(
        name=str(metadata.get("name", "")),
        namespace=str(metadata.get("namespace", "")),
        host=str(pod_ip),
        http_port=_http_port(pod),
        variant=str((metadata.get("labels") or {}).get(VARIANT_LABEL, "stable")),
        draft=str((metadata.get("labels") or {}).get(DRAFT_LABEL, "")),
        incarnation=_incarnation(pod),
        revision=str((metadata.get("labels") or {}).get(REVISION_LABEL, "")),
        backend=str((metadata.get("labels") or {}).get(BACKEND_LABEL, "")),
        mode=str((metadata.get("labels") or {}).get(MODE_LABEL, "")),
        start_s=_start_seconds(pod),
    )


def _start_seconds(pod: Mapping[str, Any]) -> float | None:
    """Seconds from creationTimestamp to the Ready condition's lastTransitionTime (None: unknown)."""
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = next((c.get("lastTransitionTime") for c in conditions if c.get("type") == "Ready"), None)
    if not isinstance(created, str) or not isinstance(ready, str):
        return None
    try:
        seconds = (_timestamp(ready) - _timestamp(created)).total_seconds()
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _incarnation(pod: Mapping[str, Any]) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    serving = next((c for c in statuses if c.get("name") == SERVING_CONTAINER), None)
    restarts = serving.get("restartCount", 0) if serving else 0
    uid = (pod.get("metadata") or {}).get("uid")
    return f"{uid}/{restarts}" if uid else ""


def sorted_endpoints(endpoints: Iterable[PodEndpoint]) -> list[PodEndpoint]:
    """Sorted by namespace and name, for stable ordering."""
    return sorted(endpoints, key=lambda e: (e.namespace, e.name))


def ready_endpoints(pods: Sequence[Mapping[str, Any]]) -> list[PodEndpoint]:
    """Pods that are Ready, have an IP and are not terminating, sorted by name for stable ordering."""
    return sorted_endpoints(e for e in map(ready_endpoint, pods) if e is not None)
