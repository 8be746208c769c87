"""What `specops` and `kubectl specops` do against a cluster: read resources and set the canary gates.

Both commands take the namespace the way kubectl does: `-n NS`, else the kubeconfig's current
context's namespace, else `default` (in a pod: the service account's namespace).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes

from specops.adapters.kube import KubeApiError, KubeClient, load_connection_settings
from specops.api.models import API_VERSION, KIND

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

CANARY_ANNOTATIONS: dict[str, dict[str, str | None]] = {
    "pause": {"specops.dev/canary-paused": "true"},
    "resume": {"specops.dev/canary-paused": None},
    "promote": {"specops.dev/canary-action": "promote", "specops.dev/canary-paused": None},
    "abort": {"specops.dev/canary-action": "abort", "specops.dev/canary-paused": None},
}
CANARY_GATE_HELP = {
    "pause": "hold the canary at its current step (judgement stops until resumed)",
    "resume": "resume a paused canary",
    "promote": "promote the canary draft now, skipping the remaining steps",
    "abort": "roll the canary back now and keep the stable draft",
}


class OperationError(Exception):
    """A user-facing failure: the message says what is wrong (not found, no canary, API error)."""


def current_namespace(kubeconfig: str | None = None) -> str:
    """The kubeconfig current context's namespace, else `default`, as kubectl resolves it."""
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path is None and os.environ.get("KUBERNETES_SERVICE_HOST") and SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    try:
        _, active = kubernetes.config.list_kube_config_contexts(config_file=path)
    except (kubernetes.config.ConfigException, OSError):
        return "default"
    namespace = ((active or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"


class Cluster:
    """A short-lived client for one command; use as `async with Cluster(kubeconfig) as cluster`."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        self.kube = KubeClient(load_connection_settings(kubeconfig))

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kube.close()

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            body = await self.kube.get(API_VERSION, KIND, namespace, name)
        except KubeApiError as error:
            raise OperationError(str(error)) from error
        if body is None:
            raise OperationError(f'speculativedeployments.specops.dev "{name}" not found in {namespace}')
        return body

    async def list_all(self, namespace: str | None) -> list[dict[str, Any]]:
        try:
            bodies = await self.kube.list(API_VERSION, KIND, namespace)
        except KubeApiError as error:
            raise OperationError(str(error)) from error
        return sorted(bodies, key=lambda b: (b["metadata"].get("namespace", ""), b["metadata"]["name"]))

    async def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Events about one SpeculativeDeployment, oldest first (empty when Events cannot be read)."""
        try:
            events = await self.kube.list("v1", "Event", namespace)
        except KubeApiError:
            return []
        mine = [
            e
            for e in events
            if (e.get("involvedObject") or {}).get("kind") == KIND
            and (e.get("involvedObject") or {}).get("name") == name
        ]
        return sorted(mine, key=_event_order)

    async def set_canary_gate(self, action: str, namespace: str, name: str) -> None:
        body = await self.get(namespace, name)
        if not (body.get("status") or {}).get("canary") and action != "resume":
            raise OperationError(f"{namespace}/{name} has no canary in progress")
        patch = {"metadata": {"annotations": CANARY_ANNOTATIONS[action]}}
        try:
            await self.kube.patch(API_VERSION, KIND, namespace, name, patch)
        except KubeApiError as error:
            raise OperationError(str(error)) from error


def _event_order(event: dict[str, Any]) -> tuple[str, int]:
    stamp = event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
    return (str(stamp or ""), int(event["metadata"].get("resourceVersion") or 0))


async def set_canary_gate(action: str, name: str, namespace: str, kubeconfig: str | None = None) -> int:
    """Set one manual canary gate; prints the outcome, returns the exit status (0 done, 1 error)."""
    import sys

    try:
        async with Cluster(kubeconfig) as cluster:
            await cluster.set_canary_gate(action, namespace, name)
    except OperationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"speculativedeployment {namespace}/{name}: canary {action} requested")
    return 0
