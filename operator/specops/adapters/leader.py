"""Leader election on a coordination.k8s.io/v1 Lease: of several replicas, only the holder acts.

The algorithm is client-go's: a replica takes the Lease when it is free (no holder, or the
holder released it) or when the holder has not renewed it for ``lease_duration_s`` as timed
on this replica's own clock (no comparison of clocks across machines). The holder renews
every ``retry_period_s``; if it cannot renew for ``renew_deadline_s`` it stops acting, which
leaves a margin of ``lease_duration_s - renew_deadline_s`` before anyone else may take over.
Every write carries the resourceVersion it was computed from, so of two replicas racing for
the Lease exactly one wins (the other gets 409 Conflict).

The operator's own writes run under the Lease's write gate (kube.WRITE_GATE): each is checked
just before it leaves, and none leaves once the last renewal (timed from when it was sent) is
older than the renew deadline. Kopf's writes (finalizers, progress, Events) pass the same gate: its
session carries kube.refuse_gated_writes. A leader frozen past its Lease and resumed writes
nothing before it notices it was deposed.

``lead`` runs a coroutine (the Kopf operator) only while the Lease is held: it waits for the
Lease, runs the operator, renews meanwhile, and on loss stops the operator and raises
:class:`LeadershipLost` so that the process exits and restarts as a follower. On a normal
stop it releases the Lease, so a follower takes over within one retry period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from specops.adapters.kube import WRITE_GATE, KubeClient
from specops.ports import KubeApiError

logger = logging.getLogger(__name__)

LEASE_API = "coordination.k8s.io/v1"
LEASE_KIND = "Lease"
DEFAULT_LEASE_NAME = "specops-operator"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class LeadershipLost(RuntimeError):
    """The Lease could not be renewed in time (or another replica holds it): stop acting now."""


@dataclass(frozen=True)
class LeaseTimings:
    """client-go's defaults: failover within lease_duration_s + retry_period_s of a crash."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("need 0 < retry period < renew deadline < lease duration")


DEFAULT_TIMINGS = LeaseTimings()


def default_identity() -> str:
    """The pod name (HOSTNAME) plus a random suffix: a restarted pod is a new candidate."""
    host = os.environ.get("HOSTNAME") or socket.gethostname()
    return f"{host}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str:
    """$POD_NAMESPACE, else the service account's namespace, else ``default`` (outside a cluster)."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as handle:
            return handle.read().strip() or "default"
    except OSError:
        return "default"


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Acquire, renew and release one Lease for one identity."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        namespace: str,
        name: str = DEFAULT_LEASE_NAME,
        identity: str | None = None,
        timings: LeaseTimings = DEFAULT_TIMINGS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.timings = timings
        self._clock = clock
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._last_renewal: float | None = None
        self._abandoned = False

    def abandon(self) -> None:
        """Never write the Lease again, not even to release it: the process is going down hard."""
        self._abandoned = True
        self._last_renewal = None

    @property
    def is_leader(self) -> bool:
        return self.write_refusal() is None

    def write_refusal(self) -> str | None:
        """Why this replica may not write now (None: it may): it does not hold the Lease, or its
        last renewal is older than the renew deadline (the Lease may pass to another replica once
        the lease duration has gone by)."""
        renewed = self._last_renewal
        where = f"lease {self.namespace}/{self.name}"
        if renewed is None:
            return f"{where} is not held by {self.identity}"
        age = self._clock() - renewed
        if age >= self.timings.renew_deadline_s:
            return (
                f"{where} last renewed {age:.1f} s ago, past the renew deadline of "
                f"{self.timings.renew_deadline_s:g} s"
            )
        return None

    def _spec(self, previous: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
        previous = previous or {}
        taking_over = previous.get("holderIdentity") != self.identity
        transitions = int(previous.get("leaseTransitions") or 0)
        if taking_over and previous.get("holderIdentity"):
            transitions += 1
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.timings.lease_duration_s)),
            "acquireTime": _timestamp(now) if taking_over else previous.get("acquireTime") or _timestamp(now),
            "renewTime": _timestamp(now),
            "leaseTransitions": transitions,
        }

    def _free_or_expired(self, spec: dict[str, Any]) -> bool:
        holder = str(spec.get("holderIdentity") or "")
        if not holder:
            return True  # released
        record = (holder, str(spec.get("renewTime") or ""))
        now = self._clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
            return False
        duration = float(spec.get("leaseDurationSeconds") or self.timings.lease_duration_s)
        return now - self._observed_at >= duration

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this identity holds the Lease afterwards."""
        if self._abandoned:
            return False
        now = datetime.now(UTC)
        sent_at = self._clock()  # the Lease runs from its renewTime, set before the write leaves
        try:
            lease = await self.kube.get(LEASE_API, LEASE_KIND, self.namespace, self.name)
            if lease is None:
                await self.kube.create(
                    {
                        "apiVersion": LEASE_API,
                        "kind": LEASE_KIND,
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": self._spec(None, now),
                    }
                )
            else:
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") != self.identity and not self._free_or_expired(spec):
                    self._last_renewal = None
                    return False
                await self.kube.patch(
                    LEASE_API,
                    LEASE_KIND,
                    self.namespace,
                    self.name,
                    {
                        "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                        "spec": self._spec(spec, now),
                    },
                )
        except KubeApiError as error:
            if error.status not in (409, 0) and error.status < 500:
                logger.warning("lease %s/%s: %s", self.namespace, self.name, error)
            return False
        self._last_renewal = sent_at
        return True

    async def acquire(self) -> None:
        """Wait until this identity holds the Lease."""
        logger.info("waiting to lead: lease %s/%s as %s", self.namespace, self.name, self.identity)
        while True:
            if await self.try_acquire_or_renew():
                break
            await asyncio.sleep(self.timings.retry_period_s)
        logger.info("leading: acquired lease %s/%s as %s", self.namespace, self.name, self.identity)

    async def keep(self) -> None:
        """Renew every retry period; raise LeadershipLost once renewal failed for the renew deadline."""
        while True:
            await asyncio.sleep(self.timings.retry_period_s)
            renewed_at = self._last_renewal
            if await self.try_acquire_or_renew():
                continue
            if self._last_renewal is None:  # another replica holds it now
                raise LeadershipLost(f"lease {self.namespace}/{self.name} is held by another replica")
            if renewed_at is not None and self._clock() - renewed_at >= self.timings.renew_deadline_s:
                self._last_renewal = None
                raise LeadershipLost(
                    f"lease {self.namespace}/{self.name} not renewed for {self.timings.renew_deadline_s:g} s"
                )

    async def release(self) -> None:
        """Give the Lease up (a follower takes it at its next try); never raises."""
        self._last_renewal = None
        if self._abandoned:
            return
        with contextlib.suppress(KubeApiError):
            lease = await self.kube.get(LEASE_API, LEASE_KIND, self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            await self.kube.patch(
                LEASE_API,
                LEASE_KIND,
                self.namespace,
                self.name,
                {
                    "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                    "spec": {"holderIdentity": None, "renewTime": _timestamp(datetime.now(UTC))},
                },
            )
            logger.info("released lease %s/%s", self.namespace, self.name)


async def lead(
    elector: LeaseElector,
    operate: Callable[[asyncio.Event], Awaitable[None]],
    *,
    stop_flag: asyncio.Event | None = None,
    release_on_exit: bool = True,
    stop_grace_s: float | None = None,
) -> None:
    """Run ``operate(stop_flag)`` only while ``elector`` holds the Lease.

    Raises LeadershipLost after stopping the operator when renewal fails. Setting
    ``stop_flag`` stops the operator from outside. With ``release_on_exit`` the Lease is
    given up on the way out of a normal stop.
    """
    if not elector.is_leader:
        await elector.acquire()
    stop_flag = stop_flag if stop_flag is not None else asyncio.Event()
    keeper = asyncio.ensure_future(elector.keep())  # the Lease's own writes: not gated
    gate = WRITE_GATE.set(elector.write_refusal)
    try:
        operator = asyncio.ensure_future(operate(stop_flag))  # its tasks inherit the gate
    finally:
        WRITE_GATE.reset(gate)
    lost = False
    try:
        await asyncio.wait({operator, keeper}, return_when=asyncio.FIRST_COMPLETED)
        if keeper.done() and not keeper.cancelled() and keeper.exception() is not None:
            lost = True
            logger.error("stepping down, the operator stops: %s", keeper.exception())
            stop_flag.set()
            grace = stop_grace_s
            if grace is None:
                grace = elector.timings.lease_duration_s - elector.timings.renew_deadline_s
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(operator), timeout=grace)
            operator.cancel()
            raise keeper.exception()  # type: ignore[misc]
        try:
            await operator  # the operator ended by itself: re-raise its failure, if any
        except Exception as error:
            if (refusal := elector.write_refusal()) is None:
                raise
            # Kopf stops when a write of its own is refused (kube.refuse_gated_writes)
            lost = True
            raise LeadershipLost(f"the operator stopped, its writes refused: {refusal}") from error
    finally:
        keeper.cancel()
        if not operator.done():
            stop_flag.set()
            operator.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await operator
        if release_on_exit and not lost:
            await elector.release()


@contextlib.asynccontextmanager
async def follower_health(url: str | None) -> AsyncIterator[None]:
    """Answer the liveness endpoint while waiting for the Lease (Kopf serves it once leading)."""
    if not url:
        yield
        return
    from aiohttp import web

    parts = urlsplit(url)

    async def healthy(_: web.Request) -> web.Response:
        return web.json_response({"role": "follower"})

    app = web.Application()
    app.router.add_get(parts.path or "/", healthy)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, parts.hostname or "0.0.0.0", parts.port or 80)
    await site.start()
    try:
        yield
    finally:
        await runner.cleanup()
