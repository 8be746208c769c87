"""An emulated cluster for tests: the fidelity emulator served over HTTP on 127.0.0.1, plus a kubeconfig.

``emulated_cluster(crd_paths, tmp_path)`` is the async context manager tests use
(``start_emulated_cluster`` + ``EmulatedCluster.stop`` for fixtures that manage
the lifetime themselves). The server answers on an OS-assigned port and stops
with every watch stream closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import yaml

from specops_local.emulator import Body, FidelityEmulator, register_builtin_resources, register_crd

DEFAULT_NAMESPACE = "default"


@dataclasses.dataclass
class EmulatedCluster:
    """A running emulated API server and what a client needs to reach it."""

    emulator: FidelityEmulator
    url: str
    kubeconfig_path: Path
    namespace: str
    _runner: aiohttp.web.ServerRunner

    def resource(self, name: str) -> kmock.resource:
        """Resolve a plural, kind, short name or ``group/version/plural`` to a registered resource."""
        matches = [
            res
            for res in self.emulator.resources
            if name in (res.plural, f"{res.group}/{res.version}/{res.plural}".lstrip("/"))
            or name.lower() == (self.emulator.resources[res].kind or "").lower()
            or name in self.emulator.resources[res].shortnames
        ]
        if len(matches) != 1:
            raise LookupError(f"{name!r} names {len(matches)} registered resources: {matches}")
        return matches[0]

    def objects(self, resource: str, namespace: str | None = None) -> list[Body]:
        """Stored objects of a resource (all namespaces when ``namespace`` is None), sorted by name."""
        return self.emulator.list_objects(self.resource(resource), namespace)

    def get(self, resource: str, name: str, namespace: str | None = DEFAULT_NAMESPACE) -> Body | None:
        """One stored object, or None when absent (a lookup by key, not a scan of every object)."""
        return self.emulator._find(self.resource(resource), namespace, name)

    def create(self, resource: str, body: Body, namespace: str | None = DEFAULT_NAMESPACE) -> Body:
        """Store an object as a client's POST would (stamping, admission, watch event)."""
        return self.emulator.create_object(self.resource(resource), body, namespace=namespace)

    def patch_status(
        self, resource: str, name: str, status: Body, namespace: str | None = DEFAULT_NAMESPACE
    ) -> Body:
        """Merge-patch ``.status`` through the status subresource, as a controller would."""
        res = self.resource(resource)
        status_only = "status" in self.emulator.resources[res].subresources
        return self.emulator.patch_object(res, namespace, name, {"status": status}, status=status_only)

    async def wait_for(
        self, condition: Callable[[], Any], *, timeout_s: float = 10.0, interval_s: float = 0.02
    ) -> Any:
        """Poll ``condition`` until it returns something truthy; TimeoutError after ``timeout_s``."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            result = condition()
            if result:
                return result
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"condition still false after {timeout_s} s")
            await asyncio.sleep(interval_s)

    async def wait_for_watch(self, resource: str, *, timeout_s: float = 10.0) -> None:
        """Until some client (an operator) holds a watch stream open on the resource."""
        res = self.resource(resource)
        await self.wait_for(lambda: self.emulator.watchers(res) > 0, timeout_s=timeout_s)

    async def stop(self) -> None:
        self.emulator.close()
        await self._runner.cleanup()
        await self.emulator.__aexit__(None, None, None)


def write_kubeconfig(path: Path, url: str, namespace: str = DEFAULT_NAMESPACE) -> Path:
    """A kubeconfig with one context pointing at the emulated server and a dummy bearer token."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulated", "cluster": {"server": url}}],
        "users": [{"name": "tester", "user": {"token": "dummy-token"}}],
        "contexts": [
            {"name": "emulated", "context": {"cluster": "emulated", "user": "tester", "namespace": namespace}}
        ],
        "current-context": "emulated",
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def load_crds(paths: Iterable[Path]) -> list[Body]:
    """Every CustomResourceDefinition document in the given YAML files."""
    crds: list[Body] = []
    for path in paths:
        for document in yaml.safe_load_all(Path(path).read_text()):
            if isinstance(document, dict) and document.get("kind") == "CustomResourceDefinition":
                crds.append(document)
    return crds


async def start_emulated_cluster(
    crd_paths: Iterable[Path],
    tmp_path: Path,
    *,
    crds: Iterable[Body] = (),
    namespace: str = DEFAULT_NAMESPACE,
    emulator: FidelityEmulator | None = None,
) -> EmulatedCluster:
    """Serve a fresh emulator with built-ins and the given CRDs; the caller must ``await cluster.stop()``."""
    emulator = emulator if emulator is not None else FidelityEmulator()
    register_builtin_resources(emulator)
    for crd in [*load_crds(crd_paths), *crds]:
        register_crd(emulator, crd)
    if (
        namespace != DEFAULT_NAMESPACE
        and emulator._find(kmock.resource("v1/namespaces"), None, namespace) is None
    ):
        emulator.create_object("v1/namespaces", {"metadata": {"name": namespace}})

    await emulator.__aenter__()
    server = aiohttp.web.Server(emulator, handler_cancellation=True)
    runner = aiohttp.web.ServerRunner(server, shutdown_timeout=1.0)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig.yaml", url, namespace)
    return EmulatedCluster(
        emulator=emulator, url=url, kubeconfig_path=kubeconfig, namespace=namespace, _runner=runner
    )


@contextlib.asynccontextmanager
async def emulated_cluster(
    crd_paths: Iterable[Path],
    tmp_path: Path,
    *,
    crds: Iterable[Body] = (),
    namespace: str = DEFAULT_NAMESPACE,
) -> AsyncIterator[EmulatedCluster]:
    """An emulated cluster for the duration of the block."""
    cluster = await start_emulated_cluster(crd_paths, tmp_path, crds=crds, namespace=namespace)
    try:
        yield cluster
    finally:
        await cluster.stop()


# A small CRD exercising what the admission step emulates (defaults, enums, bounds, int-or-string,
# CEL rules at several levels including a transition rule); the harness's own tests use it.
WIDGET_CRD: Body = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.specops.dev"},
    "spec": {
        "group": "test.specops.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wdg"]},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["model"],
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.replicas <= self.maxReplicas",
                                        "message": "replicas must not exceed maxReplicas",
                                        "fieldPath": ".replicas",
                                    }
                                ],
                                "properties": {
                                    "model": {
                                        "type": "string",
                                        "minLength": 1,
                                        "x-kubernetes-validations": [
                                            {"rule": "self == oldSelf", "message": "model is immutable"}
                                        ],
                                    },
                                    "mode": {"type": "string", "enum": ["fast", "safe"], "default": "safe"},
                                    "replicas": {
                                        "type": "integer",
                                        "minimum": 0,
                                        "maximum": 10,
                                        "default": 1,
                                    },
                                    "maxReplicas": {"type": "integer", "default": 5},
                                    "draftLength": {
                                        "type": "object",
                                        "default": {},
                                        "properties": {
                                            "min": {"type": "integer", "default": 1},
                                            "initial": {"type": "integer", "default": 4},
                                            "max": {"type": "integer", "default": 8},
                                        },
                                        "x-kubernetes-validations": [
                                            {
                                                "rule": "self.min <= self.initial && self.initial <= self.max",
                                                "messageExpression": "'initial must be between min and max, got ' + string(self.initial)",
                                            }
                                        ],
                                    },
                                    "ports": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "properties": {
                                                "name": {"type": "string"},
                                                "port": {"type": "integer", "default": 80},
                                            },
                                        },
                                    },
                                    "size": {"x-kubernetes-int-or-string": True},
                                    "memory": {
                                        "type": "string",
                                        "x-kubernetes-validations": [
                                            {
                                                "rule": "quantity(self) <= quantity('80Gi')",
                                                "message": "too much memory",
                                            }
                                        ],
                                    },
                                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                },
                            },
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}
