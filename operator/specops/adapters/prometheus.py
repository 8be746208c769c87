"""Prometheus polling: one grouped instant query per quantity per cycle, for every resource at once.

Resources never query Prometheus themselves: they read the latest snapshot
from memory through :class:`MetricsHub`, so the load on Prometheus depends on
the number of (Prometheus, backend) pairs, not on the number of resources.

A Prometheus behind authentication (spec.metrics.prometheus: a bearer token or basic auth from a
Secret, a CA from a ConfigMap or Secret, extra headers such as a tenant's X-Scope-OrgID) gets one
poller per namespace whose objects hold the credentials. Credentials are read through the
Kubernetes API, kept in memory only, re-read every CREDENTIALS_TTL_S and after a refusal, and
never written into a message: a failure names the field, the object and the key, never a value.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from specops.adapters import gc_tuning, operator_metrics
from specops.api.models import DEFAULT_PROMETHEUS_URL, PrometheusSource, SecretKeyRef
from specops.domain.metrics import (
    LATENCY_QUANTILES,
    PROFILES,
    REASON_AUTH,
    REASON_METRICS_UNAVAILABLE,
    REASON_PENDING,
    BackendProfile,
    Measurement,
    RawVector,
    Snapshot,
    build_snapshot,
    rate_window_s,
)
from specops.domain.names import label_value
from specops.domain.redaction import redact_text, redact_url
from specops.ports import KubeApiError, KubePort

logger = logging.getLogger(__name__)

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


class QueryFailed(Exception):
    """A query did not produce a vector; the message is what the operator reports."""

    def __init__(self, message: str, reason: str = REASON_METRICS_UNAVAILABLE) -> None:
        super().__init__(message)
        self.reason = reason


CREDENTIALS_TTL_S = 60.0
"""Credentials are read again after this long (a rotated token is used within a minute), and at
once after Prometheus refuses them."""


@dataclass(frozen=True)
class Credentials:
    """What a poller sends: headers (Authorization among them) and the CA to verify the server with."""

    headers: tuple[tuple[str, str], ...] = ()
    ca_pem: str | None = None
    server_name: str | None = None
    has_authorization: bool = False

    def __repr__(self) -> str:  # never the values
        names = [name for name, _ in self.headers]
        return f"Credentials(headers={names}, ca={'yes' if self.ca_pem else 'no'})"


CredentialReader = Callable[[str, PrometheusSource], Awaitable[Credentials]]
"""(namespace, spec.metrics.prometheus) -> what to send; raises QueryFailed when it cannot be read."""


def static_credentials(source: PrometheusSource) -> Credentials:
    """The part of ``source`` that needs no object read: its extra headers and TLS server name."""
    return Credentials(
        headers=tuple((header.name, header.value) for header in source.headers),
        server_name=source.tls_config.server_name if source.tls_config else None,
    )


class KubeCredentialReader:
    """Reads the Secrets and ConfigMaps named in spec.metrics.prometheus through the Kubernetes API.

    Only ``get`` of the named objects (docs/install.md says what the chart grants); the values go
    nowhere but into the request headers and the TLS context."""

    def __init__(self, kube: KubePort) -> None:
        self.kube = kube

    async def _value(self, kind: str, namespace: str, ref: SecretKeyRef, field_path: str) -> str:
        # the field after the object: "password: NAME" would read as a credential and be masked
        where = f"{kind} {namespace}/{ref.name} (spec.metrics.prometheus.{field_path})"
        try:
            obj = await self.kube.get("v1", kind, namespace, ref.name)
        except KubeApiError as error:
            if error.status == 403:
                hint = (
                    "prometheus.secretNames in the chart's values"
                    if kind == "Secret"
                    else "the operator's ConfigMap rule"
                )
                raise QueryFailed(
                    f"{where}: the operator may not read it (grant it: {hint})", REASON_AUTH
                ) from None
            raise QueryFailed(f"{where}: cannot read it (HTTP {error.status})", REASON_AUTH) from None
        if obj is None:
            raise QueryFailed(f"{where} not found", REASON_AUTH)
        data = obj.get("data") or {}
        if ref.key not in data:
            raise QueryFailed(f"{where} has no key {ref.key!r}", REASON_AUTH)
        if kind == "ConfigMap":
            return str(data[ref.key])
        try:
            return base64.b64decode(str(data[ref.key]), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise QueryFailed(f"{where}: key {ref.key!r} is not base64-encoded UTF-8", REASON_AUTH) from None

    async def __call__(self, namespace: str, source: PrometheusSource) -> Credentials:
        static = static_credentials(source)
        headers = list(static.headers)
        authorization = False
        if source.bearer_token_secret is not None:
            token = await self._value("Secret", namespace, source.bearer_token_secret, "bearerTokenSecret")
            headers.append(("Authorization", f"Bearer {token.strip()}"))
            authorization = True
        if source.basic_auth is not None:
            user = await self._value("Secret", namespace, source.basic_auth.username, "basicAuth.username")
            password = await self._value(
                "Secret", namespace, source.basic_auth.password, "basicAuth.password"
            )
            pair = base64.b64encode(f"{user.strip()}:{password.strip()}".encode()).decode()
            headers.append(("Authorization", f"Basic {pair}"))
            authorization = True
        ca_pem = None
        ca = source.tls_config.ca if source.tls_config else None
        if ca is not None:
            if ca.config_map is not None:
                ca_pem = await self._value("ConfigMap", namespace, ca.config_map, "tlsConfig.ca.configMap")
            elif ca.secret is not None:
                ca_pem = await self._value("Secret", namespace, ca.secret, "tlsConfig.ca.secret")
        return Credentials(tuple(headers), ca_pem, static.server_name, authorization)


def _ssl_context(ca_pem: str) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cadata=ca_pem)
    except (ssl.SSLError, ValueError) as error:
        raise QueryFailed(
            f"spec.metrics.prometheus.tlsConfig.ca is no PEM certificate: {type(error).__name__}", REASON_AUTH
        ) from None


QUERY_SHARE_OF_INTERVAL = 0.6
"""A query may take up to this share of the poll interval (see PrometheusPoller.query_timeout_s)."""


class PrometheusPoller:
    """Polls one Prometheus for one backend profile and keeps the latest :class:`Snapshot`.

    Any failure (connection refused, timeout, HTTP error, a Prometheus error
    answer) turns the whole cycle into an Error snapshot: a partial cycle could
    pair an old acceptance with a new batch size and mislead the policy. The one
    exception is the latency quantiles (``LATENCY_QUANTILES``): the cycle's costliest
    queries, which nothing but a canary's latency analysis needs. When only they fail
    the cycle stands without them (every measurement carries ``latency_error``), so a
    fleet whose quantiles outgrow the interval keeps deciding on the mean, and canaries
    pause judgement as in an outage.

    Rates use ``window_s`` (default: max(4 scrapes, 10 s)); until a series is that
    old, Prometheus's rate() under-reports it, while ratios such as acceptance hold.
    """

    def __init__(
        self,
        url: str,
        profile: BackendProfile,
        interval_s: float = 15.0,
        *,
        scrape_interval_s: float = 15.0,
        window_s: float | None = None,
        timeout_s: float = 5.0,
        clock: Clock = utc_now,
        source: PrometheusSource | None = None,
        namespace: str = "",
        credentials: CredentialReader | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.source = source
        """How to authenticate (None: no credentials, no extra headers)."""
        self.namespace = namespace
        """Where the Secrets and ConfigMaps of ``source`` are read ("" when it names none)."""
        self._read_credentials = credentials
        self._credentials: Credentials | None = None
        self._credentials_read_at = -math.inf
        self._session_ca: str | None = None
        self.shown_url = redact_url(self.url)
        """The URL as messages and logs show it: credentials masked (requests use ``url``)."""
        self.profile = profile
        self.interval_s = interval_s
        self.window_s = window_s if window_s is not None else rate_window_s(scrape_interval_s)
        self.timeout_s = timeout_s
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self.latest: Snapshot = Snapshot.failed(
            clock(), f"no poll of {self.shown_url} has completed yet", reason=REASON_PENDING
        )
        self.cycles = 0
        self.latency_error: str | None = None
        """Why the last cycle went without its latency quantiles (None: it had them)."""
        self.queries_total = 0
        self.queries_last_cycle = 0

    @property
    def query_timeout_s(self) -> float:
        """How long one query may take: ``timeout_s``, or a share of the poll interval if longer.

        A fleet's grouped quantile is one query over every pod's buckets: at 2,000 pods
        histogram_quantile takes about 2 s of Prometheus's CPU on an idle 2-core machine, and the
        cycle's queries run together. Cut at 5 s, every cycle failed and the whole fleet held
        speculation off for want of metrics; an answer that comes in 8 s of a 15 s interval is
        still this cycle's."""
        return max(self.timeout_s, QUERY_SHARE_OF_INTERVAL * self.interval_s)

    def _sends_credentials(self) -> bool:
        in_url = "@" in self.url.split("//", 1)[-1].split("/", 1)[0]
        in_spec = self.source is not None and (
            self.source.bearer_token_secret is not None or self.source.basic_auth is not None
        )
        return in_url or in_spec

    async def _current_credentials(self) -> Credentials:
        """The credentials to send this cycle: read again when older than CREDENTIALS_TTL_S or after
        a refusal (QueryFailed when they cannot be read)."""
        if self.source is None:
            return Credentials()
        if not self.source.uses_namespace_objects or self._read_credentials is None:
            if self.source.uses_namespace_objects:
                raise QueryFailed("no reader for the Secrets of spec.metrics.prometheus", REASON_AUTH)
            return static_credentials(self.source)
        fresh = time.monotonic() - self._credentials_read_at < CREDENTIALS_TTL_S
        if self._credentials is None or not fresh:
            self._credentials = None
            self._credentials = await self._read_credentials(self.namespace, self.source)
            self._credentials_read_at = time.monotonic()
        return self._credentials

    def _http(self, ca_pem: str | None = None) -> aiohttp.ClientSession:
        """The session, made on first use (inside the event loop that polls).

        aiohttp, as the API client (adapters/kube.py): a fleet's cycle is a dozen answers of a few
        hundred KB each, and httpx 0.28 took about 50 ms of CPU to receive them at 2,000 resources
        against 7 ms through aiohttp (measured here with one local server answering both). Answers
        are asked for uncompressed (``Accept-Encoding: identity``): Prometheus sits in the cluster,
        the bytes are a few hundred KB a second, and inflating them is CPU on every cycle (a
        server that compresses anyway is still read: aiohttp inflates what says it is compressed).
        Credentials in the URL (``user:password@``) are sent as basic auth, as before."""
        if self._session is not None and not self._session.closed and ca_pem != self._session_ca:
            # the CA changed: a new session verifies with the new one (the old one closes in the background)
            old, self._session = self._session, None
            asyncio.get_running_loop().create_task(old.close())
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=_ssl_context(ca_pem)) if ca_pem else None
            self._session = aiohttp.ClientSession(
                headers={"Accept-Encoding": "identity", "User-Agent": "specops"}, connector=connector
            )
            self._session_ca = ca_pem
        return self._session

    async def _query(
        self, promql: str, evaluation_time: float, credentials: Credentials | None = None
    ) -> tuple[int, bytes]:
        """The HTTP status and body of one instant query evaluated at ``evaluation_time`` (Unix
        seconds), decoded later with the cycle's others."""
        timeout_s = self.query_timeout_s
        params = {"query": promql, "time": f"{evaluation_time:.3f}"}
        credentials = credentials or Credentials()
        try:
            async with self._http(credentials.ca_pem).get(
                f"{self.url}/api/v1/query",
                params=params,
                headers=dict(credentials.headers),
                server_hostname=credentials.server_name,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                return response.status, await response.read()
        except TimeoutError:
            operator_metrics.count_error("prometheus", "Timeout")
            raise QueryFailed(f"Prometheus at {self.shown_url} timed out after {timeout_s:g}s") from None
        except (aiohttp.ClientError, ValueError) as exc:
            operator_metrics.count_error("prometheus", "Unreachable")
            raise QueryFailed(f"cannot reach Prometheus at {self.shown_url}: {exc!r}") from None

    def _vector(self, promql: str, status_code: int, content: bytes) -> RawVector:
        """The result vector of one query's answer; QueryFailed when it is not one."""
        if status_code in (401, 403):
            operator_metrics.count_error("prometheus", "Unauthorized")
            if self._sends_credentials():
                advice = "refused the credentials: check the Secret that spec.metrics.prometheus names"
            else:
                advice = "wants credentials: set spec.metrics.prometheus.bearerTokenSecret or basicAuth"
            raise QueryFailed(f"Prometheus at {self.shown_url} {advice} (HTTP {status_code})", REASON_AUTH)
        try:
            # orjson: a fleet's grouped answers are thousands of series per cycle, and the
            # standard library's decoder (twice as slow) was a quarter of the operator's CPU at 2,000 resources
            body: Any = orjson.loads(content)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            operator_metrics.count_error("prometheus", "BadResponse")
            raise QueryFailed(f"Prometheus at {self.shown_url} answered HTTP {status_code} without JSON")
        if body.get("status") != "success":
            operator_metrics.count_error("prometheus", str(body.get("errorType") or "Error"))
            raise QueryFailed(
                f"Prometheus at {self.shown_url} answered HTTP {status_code} "
                f"{body.get('errorType', 'error')}: {body.get('error', '')} (query: {promql})"
            )
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise QueryFailed(f"expected a vector from {promql!r}, got {data.get('resultType')!r}")
        result: RawVector = data.get("result") or []
        return result

    async def poll_once(self, now: datetime) -> Snapshot:
        """Run every quantity's query concurrently and build a snapshot stamped ``now``; never raises.

        The answers are decoded and turned into the snapshot at once, with the garbage collector
        paused (`gc_tuning.paused`): at 2,000 resources they are about 100,000 short-lived
        containers a cycle, none of them in a cycle. Decoded while the other answers were still
        awaited, they lived through the young collections of everything else running then, were
        promoted and brought the next full pass (a scan of every object the operator holds)
        closer; decoded last and dropped before the collector resumes, reference counting frees
        them and no pass sees them.

        Every query of the cycle is evaluated at one instant. Quantities are divided by one
        another (accepted / drafted tokens, drafted tokens / verification steps), and two queries
        left to Prometheus's own clock can straddle a scrape: each rate then covers a different
        set of samples and the quotient is off by the difference (a mean draft length of 4 read
        as 3.9)."""
        queries = self.profile.queries(self.window_s)
        self.cycles += 1
        try:
            credentials = await self._current_credentials()
            self._http(credentials.ca_pem)
        except QueryFailed as failed:
            self.queries_last_cycle = 0
            return Snapshot.failed(now, redact_text(str(failed)), reason=failed.reason)
        evaluation_time = time.time()
        self.queries_last_cycle = len(queries)
        self.queries_total += len(queries)
        answers = await asyncio.gather(
            *(self._query(q, evaluation_time, credentials) for q in queries.values()), return_exceptions=True
        )
        with gc_tuning.paused():
            return self._snapshot(now, queries, answers)

    def _snapshot(
        self,
        now: datetime,
        queries: dict[str, str],
        answers: list[tuple[int, bytes] | BaseException],
    ) -> Snapshot:
        results: dict[str, RawVector] = {}
        latency_error: str | None = None
        for (quantity, promql), answer in zip(queries.items(), answers, strict=True):
            if not isinstance(answer, BaseException):
                try:
                    results[quantity] = self._vector(promql, *answer)
                    continue
                except QueryFailed as failed:
                    answer = failed
            if isinstance(answer, asyncio.CancelledError):
                raise answer
            message = redact_text(str(answer) if isinstance(answer, QueryFailed) else repr(answer))
            reason = answer.reason if isinstance(answer, QueryFailed) else REASON_METRICS_UNAVAILABLE
            if reason == REASON_AUTH:
                self._credentials = None  # refused: read the Secrets again next cycle (a rotated token)
            if quantity not in LATENCY_QUANTILES:
                return Snapshot.failed(now, message, reason=reason)
            latency_error = latency_error or f"latency quantiles missing this cycle: {message}"
        if (latency_error is None) != (self.latency_error is None):
            log = logger.info if latency_error is None else logger.warning
            log(
                "metrics from %s (%s): %s",
                self.shown_url,
                self.profile.name,
                latency_error or "latency quantiles back",
            )
        self.latency_error = latency_error
        return build_snapshot(self.profile, results, now, latency_error)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every ``interval_s`` until ``stop`` is set, keeping ``latest`` up to date."""
        while not stop.is_set():
            started = time.monotonic()
            previous_phase = self.latest.phase
            try:
                self.latest = await self.poll_once(self._clock())
            except Exception as exc:  # a bug must not end polling for every resource
                logger.exception("metrics poll of %s failed unexpectedly", self.shown_url)
                self.latest = Snapshot.failed(self._clock(), redact_text(f"unexpected error: {exc!r}"))
            if self.latest.phase != previous_phase or (self.latest.phase == "Error" and self.cycles == 1):
                log = logger.info if self.latest.phase == "Ok" else logger.warning
                log("metrics from %s (%s): %s", self.shown_url, self.profile.name, self.latest.error or "ok")
            remaining = self.interval_s - (time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(remaining, 0.0))

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


MIN_POLL_INTERVAL_S = 1.0
"""A floor whatever a resource asks: one poller serves every resource on that Prometheus."""
MAX_POLL_INTERVAL_S = 3600.0


def poll_interval(seconds: float) -> float:
    """``seconds`` within [MIN_POLL_INTERVAL_S, MAX_POLL_INTERVAL_S]; NaN gives the floor."""
    if not math.isfinite(seconds):
        return MAX_POLL_INTERVAL_S if seconds > 0 else MIN_POLL_INTERVAL_S
    return min(max(seconds, MIN_POLL_INTERVAL_S), MAX_POLL_INTERVAL_S)


@dataclass
class _Running:
    poller: PrometheusPoller
    stop: asyncio.Event
    task: asyncio.Task[None]
    intervals: dict[Hashable, float] = field(default_factory=dict)


Source = str | PrometheusSource
"""A Prometheus as a resource names it: spec.metrics.prometheus, or a bare URL (no credentials)."""
Target = tuple[str, str, str, str]
"""(URL, backend, namespace of the credentials or "", the authentication settings as JSON or "")."""


class MetricsHub:
    """One poller per (Prometheus URL, backend, credentials) that at least one resource registered.

    Pollers start on the first registration and stop when the last resource unregisters. A source
    whose credentials live in Secrets or ConfigMaps is polled once per namespace (the same names
    may hold different credentials in another namespace); without them, resources of every
    namespace share one poller. ``register`` and ``unregister`` must be called from the event loop.
    """

    def __init__(
        self,
        *,
        scrape_interval_s: float = 15.0,
        window_s: float | None = None,
        timeout_s: float = 5.0,
        clock: Clock = utc_now,
        profiles: dict[str, BackendProfile] | None = None,
        default_url: str = DEFAULT_PROMETHEUS_URL,
        credentials: CredentialReader | None = None,
    ) -> None:
        self.default_url = default_url
        """The Prometheus of resources that name none (SPECOPS_PROMETHEUS_URL)."""
        self._credentials = credentials
        self.scrape_interval_s = scrape_interval_s
        self.window_s = window_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._profiles = PROFILES if profiles is None else profiles
        self._running: dict[Target, _Running] = {}
        self._owner: dict[Hashable, Target] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def target(self, source: Source, backend: str, namespace: str = "") -> Target:
        """The poller a resource of ``namespace`` reading ``source`` shares."""
        if isinstance(source, str):
            return (source.rstrip("/"), backend, "", "")
        url = (source.url or self.default_url).rstrip("/")
        settings = source.model_dump_json(by_alias=True, exclude={"url"}, exclude_defaults=True)
        settings = "" if settings == "{}" else settings
        return (url, backend, namespace if source.uses_namespace_objects else "", settings)

    def poller(self, source: Source, backend: str, namespace: str = "") -> PrometheusPoller | None:
        running = self._running.get(self.target(source, backend, namespace))
        return running.poller if running else None

    def register(self, key: Hashable, source: Source, backend: str, interval_s: float) -> None:
        """Poll ``source`` for ``backend`` at least every ``interval_s``, never faster than
        MIN_POLL_INTERVAL_S. ``key`` is the resource's (namespace, name): credentials are read in its
        namespace."""
        interval_s = poll_interval(interval_s)
        namespace = key[0] if isinstance(key, tuple) and key and isinstance(key[0], str) else ""
        target = self.target(source, backend, namespace)
        owner = self._owner.get(key)
        if owner == target and self._running[target].intervals.get(key) == interval_s:
            return  # every tick registers again: unchanged, this costs O(1), not O(resources)
        if owner not in (None, target):
            self.unregister(key)
        profile = self._profiles.get(backend)
        if profile is None:
            return  # lookup reports the unknown backend
        running = self._running.get(target)
        if running is None:
            poller = PrometheusPoller(
                target[0],
                profile,
                interval_s,
                scrape_interval_s=self.scrape_interval_s,
                window_s=self.window_s,
                timeout_s=self.timeout_s,
                clock=self._clock,
                source=None if isinstance(source, str) else source,
                namespace=target[2],
                credentials=self._credentials,
            )
            stop = asyncio.Event()
            task = asyncio.get_running_loop().create_task(
                self._poll_until_stopped(poller, stop), name=f"metrics {target[0]} {backend}"
            )
            running = self._running[target] = _Running(poller, stop, task)
        previous = running.intervals.get(key)
        running.intervals[key] = interval_s
        if interval_s <= running.poller.interval_s:
            running.poller.interval_s = interval_s
        elif previous is not None and previous <= running.poller.interval_s:
            running.poller.interval_s = min(running.intervals.values())  # the fastest one slowed down
        self._owner[key] = target

    def unregister(self, key: Hashable) -> None:
        target = self._owner.pop(key, None)
        if target is None or target not in self._running:
            return
        running = self._running[target]
        running.intervals.pop(key, None)
        if running.intervals:
            running.poller.interval_s = min(running.intervals.values())
            return
        del self._running[target]
        running.stop.set()
        self._stopping.add(running.task)
        running.task.add_done_callback(self._stopping.discard)

    def lookup(
        self,
        source: Source,
        backend: str,
        namespace: str,
        name: str,
        variant: str,
        now: datetime,
        draft_length: int | None = None,
        draft: str | None = None,
    ) -> Measurement:
        """The latest measurement from memory; an Error measurement when none is usable (never raises).

        ``draft`` keeps only the series of pods serving that draft (the ``specops_draft`` label).
        """
        if backend not in self._profiles:
            return Measurement.failed(now, REASON_METRICS_UNAVAILABLE, f"no metrics profile for {backend!r}")
        target = self.target(source, backend, namespace)
        running = self._running.get(target)
        if running is None:
            return Measurement.failed(
                now, REASON_METRICS_UNAVAILABLE, f"{redact_url(target[0])} is not being polled"
            )
        poller = running.poller
        max_age_s = 3 * poller.interval_s + poller.query_timeout_s
        # Series carry the derived label value (names.label_value), not the raw resource name.
        return poller.latest.lookup(
            namespace, label_value(name), variant, now, max_age_s, draft_length, draft=draft
        )

    @staticmethod
    async def _poll_until_stopped(poller: PrometheusPoller, stop: asyncio.Event) -> None:
        try:
            await poller.run(stop)
        finally:
            await poller.aclose()

    async def close(self) -> None:
        """Stop every poller and wait for them to finish."""
        for key in list(self._owner):
            self.unregister(key)
        tasks = list(self._stopping)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
