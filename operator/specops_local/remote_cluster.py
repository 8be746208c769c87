"""`ServingCluster` over the emulated API server's HTTP API, for a controller in another process.

The scale benchmark's pod farms use it: they read the kubeconfig the emulated cluster writes
(server URL and bearer token) and make the requests a Deployment controller and a kubelet would
(GET the owner and the ConfigMaps the pods mount, POST Pods, PATCH ``/status``, DELETE Pods). Deployments are read from a cache
that one LIST and then a WATCH (by label selector) keep current, as an informer does: polling a
LIST of 2,000 Deployments every 2 s would cost the API server about 10 MB of JSON each time.
Every request carries `USER_AGENT`, so the benchmark can tell them from the operator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
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
    "configmaps": "/api/v1",
    "deployments": "/apis/apps/v1",
    models.PLURAL: f"/apis/{models.GROUP}/{models.VERSION}",
}
"""The resources the serving controller touches, by plural, and where the API server serves them."""

MERGE_PATCH = "application/merge-patch+json"
WATCH_TIMEOUT_S = 300
"""The server ends each watch after this long; the cache resumes from its last resourceVersion."""
RETRY_S = 1.0

log = logging.getLogger(__name__)


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


class WatchedList:
    """One resource's objects matching a selector, kept by LIST then WATCH (re-LIST on 410 Gone)."""

    def __init__(self, http: httpx.AsyncClient, path: str, label_selector: str) -> None:
        self._http = http
        self._path = path
        self._selector = label_selector
        self._items: dict[tuple[str, str], Body] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"watch {self._path}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def items(self) -> list[Body]:
        """The current objects, sorted by namespace and name (after the first LIST)."""
        self.start()
        await self._synced.wait()
        return [self._items[key] for key in sorted(self._items)]

    @staticmethod
    def _key(obj: Body) -> tuple[str, str]:
        return obj["metadata"].get("namespace") or "", obj["metadata"]["name"]

    async def _run(self) -> None:
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list()
                version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server went away or answered badly: start over
                log.warning("watch of %s failed (%s); listing again", self._path, exc)
                version = None
                await asyncio.sleep(RETRY_S)

    async def _list(self) -> str:
        params = {"labelSelector": self._selector} if self._selector else {}
        listing = RemoteCluster._checked(await self._http.get(self._path, params=params))
        self._items = {self._key(obj): obj for obj in listing.get("items") or []}
        self._synced.set()
        return str(listing["metadata"]["resourceVersion"])

    async def _watch(self, version: str) -> str | None:
        """Apply events until the server ends the stream; the version to resume from (None: re-LIST)."""
        params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": str(WATCH_TIMEOUT_S)}
        params |= {"allowWatchBookmarks": "true"}
        if self._selector:
            params["labelSelector"] = self._selector
        timeout = httpx.Timeout(60.0, read=WATCH_TIMEOUT_S + 30.0)
        async with self._http.stream("GET", self._path, params=params, timeout=timeout) as response:
            if response.status_code >= 400:
                await response.aread()
                RemoteCluster._checked(response)
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    return None  # 410 Gone (compacted) or another error: list again
                if kind == "DELETED":
                    self._items.pop(self._key(obj), None)
                elif kind in ("ADDED", "MODIFIED"):
                    self._items[self._key(obj)] = obj
                with contextlib.suppress(KeyError, TypeError):
                    version = str(obj["metadata"]["resourceVersion"])
        return version


class RemoteCluster:
    """The serving controller's cluster operations as HTTP requests (one pooled async client)."""

    def __init__(self, server: str, token: str | None = None, *, agent: str = USER_AGENT) -> None:
        headers = {"User-Agent": agent, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        # A generous read timeout: the API server also answers the operator, which may keep it busy.
        self._http = httpx.AsyncClient(base_url=server, headers=headers, timeout=httpx.Timeout(60.0))
        self._watched: dict[tuple[str, str], WatchedList] = {}

    @classmethod
    def from_kubeconfig(cls, path: Path, *, agent: str = USER_AGENT) -> RemoteCluster:
        server, token = read_kubeconfig(path)
        return cls(server, token, agent=agent)

    async def aclose(self) -> None:
        for watched in self._watched.values():
            await watched.stop()
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
        """From a watched cache: the first call LISTs, later ones cost the API server nothing."""
        key = (resource, label_selector)
        if key not in self._watched:
            self._watched[key] = WatchedList(self._http, self._path(resource, None), label_selector)
        return await self._watched[key].items()

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
