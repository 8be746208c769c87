"""What `specops` and `kubectl specops` do against a cluster: read resources and set the canary gates.

Both commands take the namespace the way kubectl does: `-n NS`, else the kubeconfig's current
context's namespace, else `default` (in a pod: the service account's namespace).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from specops.adapters.kube import ConnectionSettings, KubeApiError, KubeClient, load_connection_settings
from specops.api.models import API_VERSION, KIND, SpeculativeDeployment
from specops.domain import canary_rollout, drafts
from specops.domain.names import LABEL_DEPLOYMENT, label_value

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

CANARY_ANNOTATIONS: dict[str, dict[str, str | None]] = {
    "pause": {"specops.dev/canary-paused": "true"},
    "resume": {"specops.dev/canary-paused": None},
    "promote": {"specops.dev/canary-action": "promote", "specops.dev/canary-paused": None},
    "abort": {"specops.dev/canary-action": "abort", "specops.dev/canary-paused": None},
    "retry": {"specops.dev/canary-action": "retry", "specops.dev/canary-paused": None},
}
CANARY_GATE_HELP = {
    "pause": "hold the canary at its current step (judgement stops until resumed)",
    "resume": "resume a paused canary",
    "promote": "promote the canary draft now, skipping the remaining steps",
    "abort": "roll the canary back now and keep the stable draft",
    "retry": "run the canary of the draft a canary rolled back (spec.draft still names it) again",
    "undo": "set spec.draft back to the previous draft: the one serving after a rollback, else the one "
    "that served before the last promotion (which then runs its own canary)",
}
CANARY_OPERATIONS = (*CANARY_ANNOTATIONS, "undo")
DRAFT_FIELDS = ("model", "version", "method", "kind", "parameters", "uri")


class OperationError(Exception):
    """A user-facing failure: the message says what is wrong (not found, no canary, API error)."""


NO_KUBECONFIG = "no kubeconfig: set KUBECONFIG or --kubeconfig"


def in_cluster(kubeconfig: str | None = None) -> bool:
    """Running in a pod with no kubeconfig named: the service account's credentials apply."""
    return (
        kubeconfig is None
        and os.environ.get("KUBECONFIG") is None
        and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    )


def kubeconfig_path(kubeconfig: str | None = None) -> str:
    """The kubeconfig file to read: --kubeconfig, else $KUBECONFIG's first existing file, else
    ~/.kube/config. OperationError (one line) when there is none."""
    if kubeconfig is not None:
        if not Path(kubeconfig).expanduser().is_file():
            raise OperationError(f"kubeconfig {kubeconfig}: no such file")
        return str(Path(kubeconfig).expanduser())
    listed = os.environ.get("KUBECONFIG")
    if listed:
        for part in listed.split(os.pathsep):
            if part and Path(part).expanduser().is_file():
                return str(Path(part).expanduser())
        raise OperationError(f"{NO_KUBECONFIG} (KUBECONFIG={listed} names no file)")
    default = Path("~/.kube/config").expanduser()
    if default.is_file():
        return str(default)
    raise OperationError(NO_KUBECONFIG)


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _config_error(path: str, context: str | None, error: Exception) -> OperationError:
    if context is not None:
        try:
            contexts, _ = kubernetes.config.list_kube_config_contexts(config_file=path)
        except (kubernetes.config.ConfigException, yaml.YAMLError, OSError, ValueError):
            contexts = None
        if contexts is not None and context not in [c.get("name") for c in contexts]:
            return OperationError(f"context {context!r} not found in kubeconfig {path}")
    if isinstance(error, yaml.YAMLError):
        mark = getattr(error, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark is not None else ""
        return OperationError(
            f"kubeconfig {path}: not YAML{line}: {getattr(error, 'problem', None) or error}"
        )
    return OperationError(f"kubeconfig {path}: {_first_line(error)}")


def connection_settings(kubeconfig: str | None = None, context: str | None = None) -> ConnectionSettings:
    """Where the API server is and how to authenticate, or OperationError saying what is missing."""
    if context is None and in_cluster(kubeconfig):
        return load_connection_settings()
    path = kubeconfig_path(kubeconfig)
    try:
        return load_connection_settings(path, context)
    except (
        kubernetes.config.ConfigException,
        yaml.YAMLError,
        OSError,
        ValueError,
        TypeError,
        AttributeError,
    ) as error:
        raise _config_error(path, context, error) from error


def current_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The kubeconfig context's namespace (current context unless `context`), else `default`,
    as kubectl resolves it."""
    if context is None and in_cluster(kubeconfig) and SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    try:
        path = kubeconfig_path(kubeconfig)
        contexts, active = kubernetes.config.list_kube_config_contexts(config_file=path)
    except (OperationError, kubernetes.config.ConfigException, yaml.YAMLError, OSError, ValueError):
        return "default"
    if context is not None:
        active = next((c for c in contexts or [] if c.get("name") == context), None)
    namespace = ((active or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"


def api_error(error: KubeApiError, server: str) -> OperationError:
    """One line for an API answer (or none): what the server said, or that it cannot be reached."""
    if error.status == 0 and error.reason == "Unreachable":
        detail = error.message.split(": ", 1)[-1]
        return OperationError(f"cannot reach the API server at {server}: {detail}")
    if error.status in (401, 403):
        return OperationError(f"the API server at {server} refused: {error.status} {error.message}")
    return OperationError(str(error))


class Cluster:
    """A short-lived client for one command; use as `async with Cluster(kubeconfig) as cluster`."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        self.kube = KubeClient(connection_settings(kubeconfig, context))

    def error(self, error: KubeApiError) -> OperationError:
        return api_error(error, self.kube.settings.server)

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kube.close()

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            body = await self.kube.get(API_VERSION, KIND, namespace, name)
        except KubeApiError as error:
            raise self.error(error) from error
        if body is None:
            raise OperationError(f'speculativedeployments.specops.dev "{name}" not found in {namespace}')
        return body

    async def list_all(self, namespace: str | None) -> list[dict[str, Any]]:
        try:
            bodies = await self.kube.list(API_VERSION, KIND, namespace)
        except KubeApiError as error:
            raise self.error(error) from error
        return sorted(bodies, key=lambda b: (b["metadata"].get("namespace", ""), b["metadata"]["name"]))

    async def children(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The resource's Deployments and pods (by its specops.dev/deployment label), Deployments
        first; empty when they cannot be read (the view shows the resource anyway)."""
        labels = {LABEL_DEPLOYMENT: label_value(name)}
        try:
            deployments = await self.kube.list("apps/v1", "Deployment", namespace, labels)
            pods = await self.kube.list("v1", "Pod", namespace, labels)
        except KubeApiError:
            return []
        return [
            *(
                {**d, "kind": "Deployment"}
                for d in sorted(deployments, key=lambda d: str(d["metadata"]["name"]))
            ),
            *({**p, "kind": "Pod"} for p in sorted(pods, key=lambda p: str(p["metadata"]["name"]))),
        ]

    async def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Events about one SpeculativeDeployment, oldest first (empty when Events cannot be read)."""
        return (await self.events_versioned(namespace, name))[0]

    async def events_versioned(self, namespace: str, name: str) -> tuple[list[dict[str, Any]], str]:
        """The Events of one resource (a field selector: the server filters), and the version to watch from."""
        try:
            events, version = await self.kube.list_versioned(
                "v1", "Event", namespace, field_selector=event_selector(name)
            )
        except KubeApiError:
            return [], ""
        return sorted(events, key=_event_order), version

    async def follow(
        self, namespace: str, name: str
    ) -> AsyncGenerator[tuple[dict[str, Any], list[dict[str, Any]]]]:
        """The resource and its Events now, then again at every change: two watches (the resource by
        name, its Events by field selector), resumed where they ended and re-listed after a 410."""
        body = await self.get(namespace, name)
        events, events_version = await self.events_versioned(namespace, name)
        yield body, events
        changes: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

        async def pump(kind: str, api_version: str, selector: str, version: str) -> None:
            while True:
                try:
                    async for event in self.kube.watch(
                        api_version, kind, namespace, field_selector=selector, resource_version=version
                    ):
                        obj = event.get("object") or {}
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        await changes.put((str(event.get("type")), obj))
                except KubeApiError as error:
                    if error.status == 410:  # too old: list again and watch from there
                        await changes.put(("RELIST", {"kind": kind}))
                        version = ""
                        continue
                    await changes.put(("ERROR", {"message": str(self.error(error))}))
                    return

        tasks = [
            asyncio.ensure_future(
                pump(
                    KIND,
                    API_VERSION,
                    f"metadata.name={name}",
                    str(body["metadata"].get("resourceVersion") or ""),
                )
            ),
            asyncio.ensure_future(pump("Event", "v1", event_selector(name), events_version)),
        ]
        try:
            by_name = {e["metadata"]["name"]: e for e in events}
            while True:
                kind, obj = await changes.get()
                if kind == "ERROR":
                    raise OperationError(obj["message"])
                if kind == "RELIST":
                    if obj["kind"] == KIND:
                        body = await self.get(namespace, name)
                    else:
                        by_name = {
                            e["metadata"]["name"]: e
                            for e in (await self.events_versioned(namespace, name))[0]
                        }
                elif obj.get("kind") == "Event" or "involvedObject" in obj:
                    if kind == "DELETED":
                        by_name.pop(obj["metadata"]["name"], None)
                    else:
                        by_name[obj["metadata"]["name"]] = obj
                elif kind == "DELETED":
                    raise OperationError(f'speculativedeployments.specops.dev "{name}" was deleted')
                else:
                    body = obj
                yield body, sorted(by_name.values(), key=_event_order)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def set_canary_gate(self, action: str, namespace: str, name: str) -> str:
        """Set one gate (or undo); the outcome in one line, or OperationError when it does not apply."""
        body = await self.get(namespace, name)
        if action == "undo":
            return await self._undo(body)
        status = body.get("status") or {}
        if action == "retry":
            resource = _typed(body)
            if not canary_rollout.spec_draft_rejected(resource.spec, resource.status):
                raise OperationError(
                    f"{namespace}/{name} has no rolled-back draft to retry: spec.draft names draft "
                    f"{resource.spec.draft.version}, which no canary rejected"
                    + (" (a canary is in progress)" if resource.status.canary else "")
                )
        elif not status.get("canary"):
            raise OperationError(f"{namespace}/{name} has no canary in progress")
        await self._patch(namespace, name, {"metadata": {"annotations": CANARY_ANNOTATIONS[action]}})
        return f"speculativedeployment {namespace}/{name}: canary {action} requested"

    async def _undo(self, body: dict[str, Any]) -> str:
        """spec.draft back to the serving draft (it names another one: a rolled-back or pending draft),
        else to the draft that served before the last promotion."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        resource = _typed(body)
        spec, status = resource.spec, resource.status
        if status.canary is not None:
            raise OperationError(
                f"{namespace}/{name} has a canary of draft {status.canary.draft.version} in progress: "
                "abort it first (kubectl specops abort)"
            )
        serving = drafts.stable_draft(spec.draft, status)
        if drafts.draft_key(spec.draft) != drafts.draft_key(serving):
            target, said = serving, f"draft {serving.version}, the one serving"
        elif status.previous_draft is not None and status.previous_draft.version:
            target = drafts.draft_from_status(status.previous_draft, spec.draft)
            said = f"draft {target.version}, which served before {serving.version} (its canary starts)"
        else:
            raise OperationError(
                f"{namespace}/{name}: no previous draft recorded (draft {serving.version} has served since "
                "it was created or since before the operator recorded promotions)"
            )
        draft = target.model_dump(by_alias=True, mode="json")
        patch = {
            "metadata": {"resourceVersion": body["metadata"].get("resourceVersion")},
            "spec": {"draft": {field: draft.get(field) for field in DRAFT_FIELDS}},
        }
        await self._patch(namespace, name, patch)
        return f"speculativedeployment {namespace}/{name}: spec.draft set back to {said}"

    async def _patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        try:
            await self.kube.patch(API_VERSION, KIND, namespace, name, patch)
        except KubeApiError as error:
            raise self.error(error) from error


def _typed(body: dict[str, Any]) -> SpeculativeDeployment:
    meta = body["metadata"]
    try:
        return SpeculativeDeployment.model_validate(body)
    except ValueError as error:
        raise OperationError(
            f"{meta.get('namespace')}/{meta['name']} does not load: {_first_line(error)}"
        ) from None


def event_selector(name: str) -> str:
    return f"involvedObject.kind={KIND},involvedObject.name={name}"


def _event_order(event: dict[str, Any]) -> tuple[str, int]:
    stamp = event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
    return (str(stamp or ""), int(event["metadata"].get("resourceVersion") or 0))


async def set_canary_gate(
    action: str, name: str, namespace: str, kubeconfig: str | None = None, context: str | None = None
) -> int:
    """Set one manual canary gate (or undo); prints the outcome, returns the exit status (0 done, 1 error)."""
    import sys

    try:
        async with Cluster(kubeconfig, context) as cluster:
            said = await cluster.set_canary_gate(action, namespace, name)
    except OperationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(said)
    return 0
