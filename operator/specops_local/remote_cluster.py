"""`ServingCluster` over the emulated API server's HTTP API, for a controller in another process.

The scale benchmark's pod farms use it: they read the kubeconfig the emulated cluster writes
(server URL and bearer token) and make the requests a Deployment controller and a kubelet would
(LIST Deployments by label selector, GET the owner, POST Pods, PATCH ``/status``, DELETE Pods).
Every request carries `USER_AGENT`, so the benchmark can tell them from the operator's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from specops.api import models
from specops_local.serving import Body

USER_AGENT = "specops-pod-farm"
"""The User-Agent prefix of every request a farm makes (the benchmark leaves them out of its figures)."""

API_PREFIXES = {
    "pods": "/api/v1",
    "deployments": "/apis/apps/v1",
    models.PLURAL: f"/apis/{models.GROUP}/{models.VERSION}",
}
"""The resources the serving controller touches, by plural, and where the API server serves them."""

MERGE_PATCH = "application/merge-patch+json"


class RemoteClusterError(RuntimeError):
    """The API server answered a request with an error status."""


def read_kubeconfig(path: Path) -> tuple[str, str | None]:
    """The current context's server URL and bearer token (the only settings the emulator needs)."""
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
    context = contexts[config["current-context"]]
    clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
    users = {u["name"]: u.get("user") or {} for u in config.get("users") or []}
    token = users.get(context.get("user", ""), {}).get("token")
    return str(clusters[context["cluster"]]["server"]).rstrip("/"), token


class RemoteCluster:
    """The serving controller's cluster operations as HTTP requests (one pooled async client)."""

    def __init__(self, server: str, token: str | None = None, *, agent: str = USER_AGENT) -> None:
        headers = {"User-Agent": agent, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # A generous read timeout: the API server also answers the operator, which may keep it busy.
        self._http = httpx.AsyncClient(base_url=server, headers=headers, timeout=httpx.Timeout(60.0))

    @classmethod
    def from_kubeconfig(cls, path: Path, *, agent: str = USER_AGENT) -> RemoteCluster:
        server, token = read_kubeconfig(path)
        return cls(server, token, agent=agent)

    async def aclose(self) -> None:
        await self._http.aclose()

    @staticmethod
    def _path(resource: str, namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
        if resource not in API_PREFIXES:
            raise LookupError(f"the serving controller does not use {resource!r}")
        parts = [API_PREFIXES[resource]]
        if namespace is not None:
            parts.append(f"namespaces/{namespace}")
        parts.append(resource)
        parts += [part for part in (name, sub) if part is not None]
        return "/".join(parts)

    @staticmethod
    def _checked(response: httpx.Response) -> Body:
        if response.status_code >= 400:
            raise RemoteClusterError(
                f"{response.request.method} {response.request.url.path}: "
                f"{response.status_code} {response.text[:500]}"
            )
        body: Body = response.json()
        return body

    async def objects(self, resource: str, label_selector: str = "") -> list[Body]:
        params = {"labelSelector": label_selector} if label_selector else {}
        listing = self._checked(await self._http.get(self._path(resource, None), params=params))
        items: list[Body] = listing.get("items") or []
        return items

    async def get(self, resource: str, name: str, namespace: str) -> Body | None:
        response = await self._http.get(self._path(resource, namespace, name))
        if response.status_code == 404:
            return None
        return self._checked(response)

    async def create(self, resource: str, body: Body, namespace: str) -> Body:
        return self._checked(await self._http.post(self._path(resource, namespace), json=body))

    async def patch_status(self, resource: str, name: str, status: Body, namespace: str) -> Body:
        response = await self._http.patch(
            self._path(resource, namespace, name, "status"),
            json={"status": status},
            headers={"Content-Type": MERGE_PATCH},
        )
        return self._checked(response)

    async def delete(self, resource: str, name: str, namespace: str) -> None:
        response = await self._http.delete(self._path(resource, namespace, name))
        if response.status_code != 404:
            self._checked(response)
