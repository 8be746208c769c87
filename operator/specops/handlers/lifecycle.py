"""Start-up, login, and create/update/resume/delete of SpeculativeDeployments. Each handler is thin."""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from specops.adapters import log_redaction, operator_metrics
from specops.adapters.kube import gated_session, load_connection_settings, write_refusal
from specops.api.models import GROUP, KIND, PLURAL, VERSION
from specops.domain import lifecycle
from specops.domain.lifecycle import EventRecord
from specops.handlers.essence import FastCopyProgressStorage, StatuslessDiffBaseStorage
from specops.ports import KubeApiError
from specops.services.canary import RouteNotReleased
from specops.services.container import Services, build_services
from specops.services.reconciler import ReconcileParked

RETRY_DELAY_S = 15.0
MAX_PARKED_RETRY_DELAY_S = 600.0
MAX_CONCURRENT_RECONCILES = 16
"""Reconciles (and readiness refreshes) in flight at once. Thousands of resources found at start-up
each hold their rendered children (the model repository ConfigMap alone is ~30 kB of JSON) while
they wait for the API server; bounded, they finish one batch after another, memory stays flat,
and each resource serves as soon as its own reconcile is through."""


SHARED_STATE_NOTE = """Kopf hands every resource's handlers a shallow copy of the operator's memo, made
when it first sees the resource: state shared between resources must be on the operator's memo
before that (the startup handlers put it there). Made lazily in a handler it would be one
resource's own, invisible to the others (a bound per resource, a probe that sees no tick)."""


def reconcile_slots(memo: kopf.Memo) -> asyncio.Semaphore:
    found = memo.get("reconcile_slots")
    if not isinstance(found, asyncio.Semaphore):
        found = memo["reconcile_slots"] = asyncio.Semaphore(MAX_CONCURRENT_RECONCILES)
    return found


def live_bodies(memo: kopf.Memo) -> dict[tuple[str, str], kopf.Body]:
    """Each running control daemon's live body (Kopf keeps it current from the watch), by
    namespace and name: handlers of child events read the owner from here instead of a GET."""
    found = memo.get("live_bodies")
    if not isinstance(found, dict):
        found = memo["live_bodies"] = {}
    return found


def deployment_readiness(memo: kopf.Memo) -> dict[tuple[str, str], tuple[object, ...]]:
    """What readiness last read from each serving Deployment, by namespace and name."""
    found = memo.get("deployment_readiness")
    if not isinstance(found, dict):
        found = memo["deployment_readiness"] = {}
    return found


def parked_retry_delay(retry: int) -> float:
    """15 s, 30 s, 60 s ... up to 10 minutes: a spec the code cannot process is retried, not hot-looped."""
    return min(RETRY_DELAY_S * 2.0 ** min(retry, 16), MAX_PARKED_RETRY_DELAY_S)


def now() -> datetime:
    return datetime.now(UTC)


def post_events(body: Any, events: list[EventRecord]) -> None:
    """Queue the Events for Kopf to post; none while the leader's write gate refuses writes."""
    if events and (refusal := write_refusal()) is not None:
        logging.getLogger(__name__).warning("%d Event(s) not posted: %s", len(events), refusal)
        return
    for event in events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Persist Kopf's bookkeeping under specops.dev annotations, and build clients once."""
    log_redaction.install()  # before anything logs a resource body
    settings.persistence.finalizer = "specops.dev/finalizer"
    settings.persistence.progress_storage = FastCopyProgressStorage(prefix="specops.dev")
    settings.persistence.diffbase_storage = StatuslessDiffBaseStorage(prefix="specops.dev")
    settings.posting.level = logging.WARNING  # Events come from kopf.event() calls, not from log lines
    settings.posting.reporting_component = "specops"  # `kubectl describe` shows Events "From" specops
    settings.posting.reporting_instance = os.environ.get("HOSTNAME", "specops")
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.queueing.error_delays = [1, 2, 5, 10, 30, 60]
    for shared in (reconcile_slots, live_bodies, deployment_readiness):  # see SHARED_STATE_NOTE
        shared(memo)
    memo.services = await build_services()


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    services: Services | None = getattr(memo, "services", None)
    if services is not None:
        await services.close()


@kopf.on.login()
async def login(**_: Any) -> kopf.AiohttpSession:
    """Credentials from the service account or $KUBECONFIG, read now (not at import), in a session
    whose writes pass the leader's write gate (kube.refuse_gated_writes), as specops' own do."""
    conn = load_connection_settings()
    info = kopf.ConnectionInfo(
        server=conn.server,
        scheme="Bearer" if conn.token else None,
        token=conn.token,
        ca_path=conn.ca_file,
        certificate_path=conn.cert_file,
        private_key_path=conn.key_file,
        insecure=not conn.verify,
    )
    session = gated_session(info.as_ssl_context(), info.as_http_headers())
    return kopf.AiohttpSession(server=info.server, aiohttp_session=session)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
async def reconcile(body: kopf.Body, memo: kopf.Memo, retry: int = 0, **_: Any) -> None:
    services: Services = memo.services
    try:
        async with reconcile_slots(memo):
            with operator_metrics.time_reconcile():
                events = await services.reconciler.reconcile(body, now())
    except KubeApiError as error:
        raise kopf.TemporaryError(f"Kubernetes API: {error}", delay=RETRY_DELAY_S) from error
    except ReconcileParked as parked:
        post_events(body, parked.events)
        raise kopf.TemporaryError(str(parked), delay=parked_retry_delay(retry)) from parked
    post_events(body, events)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def delete(body: kopf.Body, memo: kopf.Memo, runtime: timedelta | None = None, **_: Any) -> None:
    """Release the canary from the user's route, then delete the children.

    ``runtime`` (Kopf's, kept across retries and restarts) bounds how long a route that cannot
    be released holds the finalizer: the canary service gives up after its release timeout."""
    services: Services = memo.services
    waited = runtime.total_seconds() if runtime is not None else 0.0
    try:
        events = await services.canary.release(body, now=now(), waited_s=waited)
        events += await services.reconciler.cleanup(body)
    except RouteNotReleased as error:
        kopf.warn(body, reason="RouteNotReleased", message=str(error))
        raise kopf.TemporaryError(f"route not released: {error}", delay=RETRY_DELAY_S) from error
    except KubeApiError as error:
        raise kopf.TemporaryError(f"Kubernetes API: {error}", delay=RETRY_DELAY_S) from error
    post_events(body, events)


def owner_name(meta: Any) -> str | None:
    """The owning SpeculativeDeployment's name: from the ownerReference, since the
    ``specops.dev/deployment`` label holds a derived (possibly hashed) value."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            return str(ref.get("name") or "") or None
    return None


@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": "specops"})
async def serving_deployment_changed(body: kopf.Body, memo: kopf.Memo, type: str | None, **_: Any) -> None:
    """A serving Deployment's status moved: refresh the owner's Ready/Progressing conditions."""
    owner = owner_name(body.get("metadata", {}))
    if not owner or type is None:
        return
    # Most events of a Deployment (our own patches, the controller's bookkeeping) leave what its
    # owner's readiness reads unchanged; each refresh is a GET, a render and a status write, and
    # thousands of resources starting at once send several events each.
    seen = deployment_readiness(memo)
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    signature = lifecycle.readiness_signature(body)
    if type == "DELETED":
        seen.pop(key, None)
    elif seen.get(key) == signature:
        return
    services: Services = memo.services
    namespace = body["metadata"]["namespace"]
    try:
        async with reconcile_slots(memo):
            owner_body, events = await services.reconciler.refresh(
                namespace,
                owner,
                now(),
                owner=live_bodies(memo).get((namespace, owner)),  # its daemon's, when it runs
                deployment=None if type == "DELETED" else body,
            )
    except KubeApiError as error:
        logging.getLogger(__name__).warning("status refresh of %s failed: %s", owner, error)
        return
    if type != "DELETED":
        seen[key] = signature
    if owner_body is not None:
        post_events(owner_body, events)
