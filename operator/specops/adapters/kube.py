"""A small asynchronous Kubernetes client on aiohttp.

Kopf watches; everything specops writes (children, status, pod discovery) goes
through this client so it never blocks the event loop. Credentials come from the
same places as kubectl's: the in-cluster service account, else the kubeconfig
named by $KUBECONFIG (read when the client is built, not when a module is
imported) or ~/.kube/config. `kubernetes.config` only parses the kubeconfig.

Why aiohttp and not httpx: measured on this project's machine, one request through httpx 0.28
costs the client about 2.7 ms of CPU (anyio, httpcore's pool bookkeeping, h11) and through aiohttp
about 0.3 ms. Thousands of resources make tens of requests each while they are reconciled, and
the operator is one process: the client's share decided how long a large fleet took to come up.
aiohttp is what Kopf already runs on. The pinned `kubernetes` client has no
async API.
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import kubernetes.client
import kubernetes.config
import orjson

from specops.ports import JSON_PATCH, MERGE_PATCH, KubeApiError

__all__ = [
    "JSON_PATCH",
    "MERGE_PATCH",
    "WRITE_GATE",
    "KubeApiError",
    "KubeClient",
    "WriteRefused",
    "gated_session",
    "load_connection_settings",
    "write_refusal",
]

from specops.adapters import operator_metrics


def _json_text(value: Any) -> str:
    return orjson.dumps(value).decode()


SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

# Plural names of the kinds specops reads or writes: (apiVersion, kind) -> plural.
PLURALS: dict[tuple[str, str], str] = {
    ("v1", "Pod"): "pods",
    ("v1", "Service"): "services",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Secret"): "secrets",
    ("v1", "Event"): "events",
    ("apps/v1", "Deployment"): "deployments",
    ("batch/v1", "Job"): "jobs",
    ("discovery.k8s.io/v1", "EndpointSlice"): "endpointslices",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitors",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproutes",
    ("coordination.k8s.io/v1", "Lease"): "leases",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobsets",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainjobs",
    ("kubeflow.org/v1", "PyTorchJob"): "pytorchjobs",
    ("specops.dev/v1alpha1", "SpeculativeDeployment"): "speculativedeployments",
}


EXPECTED_STATUSES = (404, 409)
"""Answers the callers expect and handle (absent object, optimistic-write conflict): not counted as errors."""


@dataclass(frozen=True)
class ConnectionSettings:
    server: str
    token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    # In-cluster the token is a projected, expiring file: re-read it when the server says 401.
    token_file: str | None = None


def load_connection_settings(kubeconfig: str | None = None, context: str | None = None) -> ConnectionSettings:
    """In-cluster service account first, else the kubeconfig ($KUBECONFIG read now) at `context`
    (default: its current context)."""
    config = kubernetes.client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=config)
    else:
        kubernetes.config.load_kube_config(config_file=path, context=context, client_configuration=config)
    token = config.api_key.get("authorization") or config.api_key.get("BearerToken")
    if token and token.lower().startswith("bearer "):
        token = token[7:]
    token_file = SERVICE_ACCOUNT_TOKEN if path is None and os.environ.get("KUBERNETES_SERVICE_HOST") else None
    return ConnectionSettings(
        server=config.host.rstrip("/"),
        token=token,
        ca_file=config.ssl_ca_cert,
        cert_file=config.cert_file,
        key_file=config.key_file,
        verify=bool(config.verify_ssl),
        token_file=token_file,
    )


def resource_path(api_version: str, plural: str, namespace: str | None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    return f"{path}/{name}" if name else path


def plural_of(api_version: str, kind: str) -> str:
    try:
        return PLURALS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"specops does not manage {kind} ({api_version})") from None


def label_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


MAX_CONCURRENT_REQUESTS = 10
"""Requests in flight at once; the others wait their turn (FIFO) for a connection.

A connection pool's queue is bookkeeping per waiting request, and a pool timeout fails requests
that merely waited. Bounding concurrency here, with a pool as large as the bound, keeps the queue
in a cheap semaphore: thousands of resources ticking at once wait, they do not time out, and the
timeout applies to the request itself."""


MAX_THROTTLE_WAIT_S = 60.0
"""The longest a request waits for the API server's Retry-After; asked to wait longer, it is
not sent and fails as 429 at once (the caller tries again at its next tick)."""
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0
MAX_RETRIES = 2
"""Retries of one request answered 429, within the process-wide budget."""
JITTER = 0.5
"""Each wait is lengthened by up to this share, at random, so waiters do not return together."""


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a Retry-After header (the API server sends whole seconds); None without one."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None


class RetryBudget:
    """A token bucket of retries shared by every request of the process: under a storm of 429s
    the retries stop once the bucket is empty, whatever the number of resources."""

    def __init__(
        self, capacity: float = 5.0, per_s: float = 0.2, clock: Callable[[], float] = time.monotonic
    ):
        self.capacity, self.per_s, self._clock = capacity, per_s, clock
        self._tokens, self._at = capacity, clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class Throttle:
    """The API server said slow down (429): every request of the process waits until it may ask
    again (Retry-After, or an exponential backoff without one, plus jitter), and until an answer
    other than 429 comes back, one request at a time probes."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, rand: Callable[[], float] = random.random
    ):
        self._clock, self._rand = clock, rand
        self.until = 0.0
        self.consecutive = 0
        self.probe = asyncio.Lock()

    @property
    def active(self) -> bool:
        return self.consecutive > 0

    def remaining_s(self) -> float:
        return max(0.0, self.until - self._clock())

    def throttled(self, retry_after: float | None) -> float:
        """Record a 429; returns the wait it set."""
        self.consecutive += 1
        base = retry_after if retry_after is not None else BACKOFF_BASE_S * 2 ** (self.consecutive - 1)
        wait = min(base, BACKOFF_MAX_S if retry_after is None else base) * (1.0 + JITTER * self._rand())
        self.until = max(self.until, self._clock() + wait)
        return wait

    def answered(self) -> None:
        self.consecutive = 0


WRITE_GATE: contextvars.ContextVar[Callable[[], str | None] | None] = contextvars.ContextVar(
    "specops_write_gate", default=None
)
"""What may refuse every write made from the current context: a callable saying why a write may not
leave now, or None when it may. A leader-elected operator runs under its Lease's gate
(adapters/leader.py), so nothing it writes leaves once the Lease could have passed to another
replica; the Lease's own writes are made outside it."""


def write_refusal() -> str | None:
    """Why a write may not leave now (None: it may), as the current context's gate says."""
    gate = WRITE_GATE.get()
    return gate() if gate is not None else None


class WriteRefused(aiohttp.ClientResponseError):
    """A write the gate kept from leaving (`refuse_gated_writes`); nothing was sent."""


async def refuse_gated_writes(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    """An aiohttp client middleware: no request but a GET leaves while the gate refuses writes.

    Kopf's own session carries it (handlers/lifecycle.py `login`), so Kopf's finalizer, progress
    and Event writes stop with the operator's: its tasks run in the context that `lead` gated.
    A refused Event is logged by Kopf and dropped; a refused patch fails Kopf's worker, which stops
    the operator, as stepping down would."""
    if request.method != "GET" and (refusal := write_refusal()) is not None:
        operator_metrics.count_error("kubernetes", "NotLeader")
        raise WriteRefused(
            request.request_info, (), message=f"{request.method} {request.url.path} not sent: {refusal}"
        )
    return await handler(request)


def gated_session(ssl_context: ssl.SSLContext | bool, headers: Mapping[str, str]) -> aiohttp.ClientSession:
    """A session like Kopf's own (no connection limit) whose writes pass the write gate."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=ssl_context),
        headers=dict(headers),
        middlewares=(refuse_gated_writes,),
    )


def _not_sent(method: str, path: str, wait: float) -> bytes:
    message = f"{method} {path} not sent: the API server asked to wait {wait:.0f} s more"
    return orjson.dumps({"reason": "TooManyRequests", "message": message})


class KubeClient:
    """CRUD on the resources specops manages; errors raise KubeApiError.

    A 429 (API Priority and Fairness shedding load) is honoured by every request of the client:
    none is sent before the server's Retry-After has passed (with jitter), one request at a time
    probes until the throttling ends, and a request answered 429 is retried only while the
    process-wide retry budget lasts (`RetryBudget`); otherwise the 429 reaches the caller, who
    tries again at its next tick, which waits in turn."""

    def __init__(
        self,
        settings: ConnectionSettings,
        *,
        timeout_s: float = 10.0,
        max_concurrent: int = MAX_CONCURRENT_REQUESTS,
    ) -> None:
        self.settings = settings
        self._ssl: ssl.SSLContext | bool = settings.verify
        if settings.ca_file or settings.cert_file:
            context = ssl.create_default_context(cafile=settings.ca_file)
            if settings.cert_file and settings.key_file:
                context.load_cert_chain(settings.cert_file, settings.key_file)
            if not settings.verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._ssl = context
        self.headers: dict[str, str] = {"Accept": "application/json", "User-Agent": "specops"}
        """Sent with every request (the bearer token among them)."""
        if settings.token:
            self.headers["Authorization"] = f"Bearer {settings.token}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_concurrent = max_concurrent
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(max_concurrent)
        self.throttle = Throttle()
        self.retry_budget = RetryBudget()
        self.sent = 0
        """Requests sent (a measure for tests and benchmarks)."""

    def _http(self) -> aiohttp.ClientSession:
        """The session, made on first use (inside the event loop that uses it)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_concurrent, ssl=self._ssl),
                timeout=self._timeout,
                json_serialize=_json_text,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _refresh_token(self) -> bool:
        """Re-read an expiring service-account token; True when a new one was loaded."""
        if not self.settings.token_file:
            return False
        try:
            with open(self.settings.token_file) as handle:
                token = handle.read().strip()
        except OSError:
            return False
        if not token or self.headers.get("Authorization") == f"Bearer {token}":
            return False
        self.headers["Authorization"] = f"Bearer {token}"
        return True

    async def _send(
        self, method: str, path: str, data: bytes | None, params: Mapping[str, str] | None, content_type: str
    ) -> tuple[int, str, bytes, str | None]:
        if method != "GET" and (refusal := write_refusal()) is not None:
            # checked at the last moment: a request may have waited its turn for a while
            operator_metrics.count_error("kubernetes", "NotLeader")
            raise KubeApiError(0, "NotLeader", f"{method} {path} not sent: {refusal}")
        headers = dict(self.headers)
        if data is not None:
            headers["Content-Type"] = content_type
        self.sent += 1
        async with self._http().request(
            method, self.settings.server + path, data=data, params=params, headers=headers
        ) as response:
            body = await response.read()
            return response.status, response.reason or "", body, response.headers.get("Retry-After")

    async def _send_throttled(
        self, method: str, path: str, data: bytes | None, params: Mapping[str, str] | None, content_type: str
    ) -> tuple[int, str, bytes]:
        """Send once the API server's Retry-After allows; retry a 429 while the budget lasts."""
        retries = 0
        while True:
            wait = self.throttle.remaining_s()
            if wait > MAX_THROTTLE_WAIT_S:
                operator_metrics.count_error("kubernetes", "TooManyRequests")
                return 429, "TooManyRequests", _not_sent(method, path, wait)
            if wait > 0:
                await asyncio.sleep(wait * (1.0 + JITTER * random.random()))
            if self.throttle.active:
                async with self.throttle.probe:  # one request at a time finds out whether it ended
                    if self.throttle.remaining_s() > 0:
                        continue
                    status, phrase, content, retry_after = await self._send_once(
                        method, path, data, params, content_type
                    )
            else:
                status, phrase, content, retry_after = await self._send_once(
                    method, path, data, params, content_type
                )
            if status != 429:
                self.throttle.answered()
                return status, phrase, content
            self.throttle.throttled(retry_after_s(retry_after))
            if retries >= MAX_RETRIES or not self.retry_budget.take():
                return status, phrase, content
            retries += 1

    async def _send_once(
        self, method: str, path: str, data: bytes | None, params: Mapping[str, str] | None, content_type: str
    ) -> tuple[int, str, bytes, str | None]:
        async with self._slots:
            answer = await self._send(method, path, data, params, content_type)
            if answer[0] == 401 and self._refresh_token():
                answer = await self._send(method, path, data, params, content_type)
        return answer

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        data = orjson.dumps(json) if json is not None else None
        try:
            status, phrase, content = await self._send_throttled(method, path, data, params, content_type)
        except (aiohttp.ClientError, TimeoutError) as error:
            # An unreachable API server is an error like any other answer: callers retry with backoff.
            operator_metrics.count_error("kubernetes", "Unreachable")
            raise KubeApiError(
                0, "Unreachable", f"{method} {path}: {type(error).__name__}: {error}"
            ) from error
        if status >= 400:
            text = content.decode("utf-8", "replace")
            try:
                body = orjson.loads(content)
                reason, message = str(body.get("reason", "")), str(body.get("message", text))
            except (orjson.JSONDecodeError, AttributeError):
                reason, message = phrase, text[:500]
            if status not in EXPECTED_STATUSES:
                operator_metrics.count_error("kubernetes", reason or str(status))
            raise KubeApiError(status, reason, message)
        if not content:
            return {}
        try:
            result = orjson.loads(content)
        except orjson.JSONDecodeError as error:
            raise KubeApiError(
                0, "Unreadable", f"{method} {path}: the answer is not JSON: {error}"
            ) from error
        return result if isinstance(result, dict) else {}

    async def api_served(self, group_version: str) -> bool:
        """Whether the cluster serves an API group version (e.g. monitoring.coreos.com/v1)."""
        try:
            await self._request("GET", f"/apis/{group_version}")
        except KubeApiError:
            return False
        return True

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        try:
            return await self._request(
                "GET", resource_path(api_version, plural_of(api_version, kind), namespace, name)
            )
        except KubeApiError as error:
            if error.not_found:
                return None
            raise

    async def list(
        self, api_version: str, kind: str, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector(labels)} if labels else None
        path = resource_path(api_version, plural_of(api_version, kind), namespace)
        result = await self._request("GET", path, params=params)
        return list(result.get("items") or [])

    async def list_versioned(
        self, api_version: str, kind: str, namespace: str | None, *, field_selector: str | None = None
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        """Items matching a field selector, and the list's resourceVersion to watch from."""
        params = {"fieldSelector": field_selector} if field_selector else None
        path = resource_path(api_version, plural_of(api_version, kind), namespace)
        result = await self._request("GET", path, params=params)
        version = str((result.get("metadata") or {}).get("resourceVersion") or "")
        return list(result.get("items") or []), version

    async def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        *,
        field_selector: str | None = None,
        resource_version: str = "",
        timeout_s: int = 300,
    ) -> AsyncIterator[dict[str, Any]]:
        """One watch stream: its events ({type, object}) until the server ends it (about timeout_s).
        A refused watch (410 Gone for a version too old among them) raises KubeApiError."""
        params = {"watch": "true", "timeoutSeconds": str(timeout_s)}
        if field_selector:
            params["fieldSelector"] = field_selector
        if resource_version:
            params["resourceVersion"] = resource_version
        path = resource_path(api_version, plural_of(api_version, kind), namespace)
        try:
            async with self._http().request(
                "GET",
                self.settings.server + path,
                params=params,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.total),
            ) as response:
                if response.status >= 400:
                    body = await response.read()
                    try:
                        answer = orjson.loads(body)
                        reason, message = str(answer.get("reason", "")), str(answer.get("message", ""))
                    except (orjson.JSONDecodeError, AttributeError):
                        reason, message = response.reason or "", body.decode("utf-8", "replace")[:500]
                    raise KubeApiError(response.status, reason, message)
                async for line in response.content:
                    if line.strip():
                        event = orjson.loads(line)
                        if event.get("type") == "ERROR":
                            status = event.get("object") or {}
                            raise KubeApiError(
                                int(status.get("code") or 0),
                                str(status.get("reason", "")),
                                str(status.get("message", "")),
                            )
                        yield event
        except (aiohttp.ClientError, TimeoutError) as error:
            raise KubeApiError(0, "Unreachable", f"watch {path}: {type(error).__name__}: {error}") from error

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        api_version, kind = obj["apiVersion"], obj["kind"]
        namespace = obj.get("metadata", {}).get("namespace")
        return await self._request(
            "POST", resource_path(api_version, plural_of(api_version, kind), namespace), json=obj
        )

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        content_type: str = MERGE_PATCH,
    ) -> dict[str, Any]:
        path = resource_path(api_version, plural_of(api_version, kind), namespace, name)
        if subresource:
            path = f"{path}/{subresource}"
        return await self._request("PATCH", path, json=patch, content_type=content_type)

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """Delete with background propagation; False when it was already gone."""
        path = resource_path(api_version, plural_of(api_version, kind), namespace, name)
        try:
            await self._request("DELETE", path, json={"propagationPolicy": "Background"})
        except KubeApiError as error:
            if error.not_found:
                return False
            raise
        return True

    async def update_status(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        mutate: Callable[[dict[str, Any]], dict[str, Any] | None],
        *,
        attempts: int = 5,
        base: Mapping[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Optimistic read-modify-write of .status; `mutate(obj)` returns a status patch or None.

        The patch carries the resourceVersion it was computed from, so two writers
        (the reconcile handler and the control loop) never overwrite each other's
        conditions: the loser gets 409 Conflict and recomputes on a fresh read.
        ``base`` is the object as the caller just read or was handed it (with its
        resourceVersion): the first attempt starts from it instead of a GET, and a stale
        copy costs one conflict.
        """
        for attempt in range(attempts):
            if attempt == 0 and base is not None and (base.get("metadata") or {}).get("resourceVersion"):
                obj: dict[str, Any] | None = dict(base)  # mutate only reads it
            else:
                obj = await self.get(api_version, kind, namespace, name)
            if obj is None:
                return None
            status_patch = mutate(obj)
            if not status_patch:
                return None
            body = {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "status": status_patch,
            }
            try:
                return await self.patch(api_version, kind, namespace, name, body, subresource="status")
            except KubeApiError as error:
                if not error.conflict:
                    raise
        raise KubeApiError(
            409, "Conflict", f"status of {namespace}/{name} kept changing; gave up after {attempts}"
        )
