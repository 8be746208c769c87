"""Prometheus behind authentication: Debian's real Prometheus with a web config (TLS and basic
auth), credentials in Secrets and the CA in a ConfigMap of the emulated API server, read by the
operator's own client. Also a gateway in front of it that wants a bearer token and a tenant
header, as Mimir, Cortex and the managed services' proxies do."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import shutil
import signal
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import httpx
import pytest
from aiohttp import web

from specops.adapters import log_redaction
from specops.adapters.kube import KubeClient
from specops.adapters.prometheus import KubeCredentialReader, MetricsHub, PrometheusPoller
from specops.api.models import PrometheusSource
from specops.domain.metrics import PROFILES, REASON_AUTH, Measurement
from specops_local.prometheus import free_port
from tests.component.test_prometheus_adapter import eventually, sim_engine, target_group
from tests.secret_shapes import SHAPES

pytestmark = pytest.mark.timeout(90)

NAMESPACE = "default"
USER, PASSWORD = "specops", "c0rrect-Horse-battery"
BACKEND = "vllm"


def now() -> datetime:
    return datetime.now(UTC)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(directory: Path) -> None:
    """A CA and a certificate for 127.0.0.1 signed by it (ca.crt, server.crt, server.key)."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        "req",
        "-x509",
        *ec,
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        cwd=directory,
    )
    _openssl(
        "req", *ec, "-subj", "/CN=prometheus", "-keyout", "server.key", "-out", "server.csr", cwd=directory
    )
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:prometheus.monitoring.svc\n")
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "san.ext", "-out", "server.crt", cwd=directory,
    )  # fmt: skip


def trusting(ca_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


@dataclass
class SecuredPrometheus:
    url: str
    ca_pem: str
    targets_file: Path

    def set_targets(self, groups: list[dict[str, Any]]) -> None:
        partial = self.targets_file.with_suffix(".tmp")
        partial.write_text(json.dumps(groups))
        partial.replace(self.targets_file)


@contextlib.asynccontextmanager
async def secured_prometheus(workdir: Path) -> AsyncIterator[SecuredPrometheus]:
    """Prometheus serving its API over TLS with basic auth (--web.config.file); stopped by its PID."""
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus package is needed (make install-system)"
    make_certificates(workdir)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    (workdir / "web.yml").write_text(
        json.dumps(
            {
                "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
                "basic_auth_users": {USER: hashed},
            }
        )
    )
    targets = workdir / "targets.json"
    targets.write_text("[]")
    (workdir / "prometheus.yml").write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "pods",
                        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                    }
                ],
            }
        )
    )
    port = free_port()
    with (workdir / "prometheus.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            binary,
            "--config.file=prometheus.yml",
            "--web.config.file=web.yml",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            cwd=workdir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    server = SecuredPrometheus(f"https://127.0.0.1:{port}", (workdir / "ca.crt").read_text(), targets)
    try:
        async with httpx.AsyncClient(
            verify=trusting(workdir / "ca.crt"), auth=(USER, PASSWORD), timeout=2
        ) as http:
            for _ in range(300):
                assert process.returncode is None, (workdir / "prometheus.log").read_text()
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{server.url}/-/ready")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise TimeoutError((workdir / "prometheus.log").read_text())
        yield server
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


@pytest.fixture
async def prom(tmp_path: Path) -> AsyncIterator[SecuredPrometheus]:
    async with secured_prometheus(tmp_path) as server:
        yield server


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def put_secret(kube: KubeClient, name: str, data: dict[str, str]) -> None:
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NAMESPACE}}
    if await kube.get("v1", "Secret", NAMESPACE, name) is not None:
        await kube.delete("v1", "Secret", NAMESPACE, name)
    await kube.create({**body, "type": "Opaque", "data": {key: _b64(value) for key, value in data.items()}})


async def put_ca(kube: KubeClient, pem: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "prometheus-ca", "namespace": NAMESPACE},
    }
    await kube.create({**body, "data": {"ca.crt": pem}})


def source(url: str, **auth: Any) -> PrometheusSource:
    return PrometheusSource.model_validate(
        {"url": url, "tlsConfig": {"ca": {"configMap": {"name": "prometheus-ca", "key": "ca.crt"}}}, **auth}
    )


BASIC = {
    "basicAuth": {
        "username": {"name": "prometheus-auth", "key": "username"},
        "password": {"name": "prometheus-auth", "key": "password"},
    }
}


@pytest.fixture
async def hub(kube: KubeClient) -> AsyncIterator[MetricsHub]:
    metrics = MetricsHub(
        scrape_interval_s=1.0, window_s=4.0, timeout_s=2.0, credentials=KubeCredentialReader(kube)
    )
    yield metrics
    await metrics.close()


def reader(hub: MetricsHub, spec: PrometheusSource, name: str = "chat") -> Callable[[], Measurement]:
    return lambda: hub.lookup(spec, BACKEND, NAMESPACE, name, "stable", now())


async def test_basic_auth_over_tls_reads_metrics_and_wrong_credentials_say_why(
    prom: SecuredPrometheus, kube: KubeClient, hub: MetricsHub, caplog: pytest.LogCaptureFixture
) -> None:
    log_redaction.install()
    caplog.set_level(logging.DEBUG)
    async with sim_engine("chat-0", batch=8, alpha=0.8, draft_length=4) as pod:
        await pod.wait_ready()
        prom.set_targets([target_group(pod, NAMESPACE, "chat", "stable")])
        await put_ca(kube, prom.ca_pem)
        wrong = "Wr0ng-pass-" + "x" * 8
        await put_secret(kube, "prometheus-auth", {"username": USER, "password": wrong})
        spec = source(prom.url, **BASIC)
        hub.register((NAMESPACE, "chat"), spec, BACKEND, 0.5)

        # given the wrong password: metrics unavailable, a reason that says what to check, no secret
        refused = await eventually(reader(hub, spec), lambda m: m.reason == REASON_AUTH, 20)
        assert refused.error is not None
        assert "refused the credentials" in refused.error and "HTTP 401" in refused.error, refused.error
        assert wrong not in refused.error and wrong not in caplog.text

        # when the Secret is corrected, the next cycle reads it again (a refusal drops the cached one)
        await put_secret(kube, "prometheus-auth", {"username": USER, "password": PASSWORD})
        measured = await eventually(reader(hub, spec), lambda m: m.ok and m.batch is not None, 30)
        # then the pod's metrics come through TLS verified by the ConfigMap's CA
        assert measured.batch == pytest.approx(8.0)
        assert PASSWORD not in caplog.text


async def test_a_missing_secret_or_key_is_named_in_the_reason(
    prom: SecuredPrometheus, kube: KubeClient, hub: MetricsHub
) -> None:
    await put_ca(kube, prom.ca_pem)
    spec = source(prom.url, **BASIC)
    hub.register((NAMESPACE, "chat"), spec, BACKEND, 0.5)
    missing = await eventually(reader(hub, spec), lambda m: m.reason == REASON_AUTH, 10)
    assert (
        missing.error
        == f"Secret {NAMESPACE}/prometheus-auth (spec.metrics.prometheus.basicAuth.username) not found"
    )
    await put_secret(kube, "prometheus-auth", {"username": USER})
    no_key = await eventually(reader(hub, spec), lambda m: "has no key" in (m.error or ""), 10)
    assert no_key.error == (
        f"Secret {NAMESPACE}/prometheus-auth (spec.metrics.prometheus.basicAuth.password) has no key 'password'"
    )


async def test_no_credentials_or_an_unknown_ca_are_reported_plainly(
    prom: SecuredPrometheus, kube: KubeClient, hub: MetricsHub
) -> None:
    await put_ca(kube, prom.ca_pem)
    bare = source(prom.url)
    hub.register((NAMESPACE, "bare"), bare, BACKEND, 0.5)
    wants = await eventually(reader(hub, bare, "bare"), lambda m: m.reason == REASON_AUTH, 10)
    assert wants.error is not None and "wants credentials" in wants.error, wants.error
    # the system CAs do not know the test CA: verification fails, and the message says so
    untrusted = PrometheusSource.model_validate({"url": prom.url, **BASIC})
    await put_secret(kube, "prometheus-auth", {"username": USER, "password": PASSWORD})
    hub.register((NAMESPACE, "untrusted"), untrusted, BACKEND, 0.5)
    failed = await eventually(
        reader(hub, untrusted, "untrusted"),
        lambda m: not m.ok and m.error is not None and "cannot reach" in m.error,
        10,
    )
    assert failed.error is not None and "CERTIFICATE_VERIFY_FAILED" in failed.error, failed.error


async def test_no_secret_shape_reaches_a_message_or_a_log_line(
    prom: SecuredPrometheus, kube: KubeClient, caplog: pytest.LogCaptureFixture
) -> None:
    # Every shape of the corpus as the password (refused): the measurement's
    # message (what status, conditions and Events show) and the operator's logs hold none of them.
    log_redaction.install()
    caplog.set_level(logging.DEBUG)
    await put_ca(kube, prom.ca_pem)
    spec = source(prom.url, **BASIC)
    poller = PrometheusPoller(
        prom.url, PROFILES[BACKEND], 60, timeout_s=10, source=spec, namespace=NAMESPACE,
        credentials=KubeCredentialReader(kube),
    )  # fmt: skip
    messages = []
    for shape in SHAPES:
        secret = shape.secret.replace("\n", " ")
        await put_secret(kube, "prometheus-auth", {"username": USER, "password": secret})
        snapshot = await poller.poll_once(now())  # read again: the last cycle was refused
        assert snapshot.phase == "Error" and snapshot.reason == REASON_AUTH, (shape.name, snapshot.error)
        messages.append(snapshot.error or "")
    await poller.aclose()
    for shape, message in zip(SHAPES, messages, strict=True):
        assert shape.secret not in message, shape.name
        assert shape.secret not in caplog.text, shape.name


# ---------------------------------------------------------------- a gateway wanting a token and a tenant

TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJzcGVjb3BzIn0.c2lnbmF0dXJl"


@contextlib.asynccontextmanager
async def tenant_gateway(
    upstream: SecuredPrometheus, ca_file: Path
) -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP gateway that forwards queries to Prometheus only with `Authorization: Bearer TOKEN`
    and an X-Scope-OrgID header, as a Mimir or Cortex gateway does."""
    seen: list[dict[str, str]] = []
    client = aiohttp.ClientSession(
        headers={"Authorization": f"Basic {_b64(f'{USER}:{PASSWORD}')}"},
        connector=aiohttp.TCPConnector(ssl=trusting(ca_file)),
    )

    async def query(request: web.Request) -> web.StreamResponse:
        seen.append(
            {
                key: value
                for key, value in request.headers.items()
                if key.lower() in ("authorization", "x-scope-orgid")
            }
        )
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.Response(status=401, text="unauthorized")
        if request.headers.get("X-Scope-OrgID") != "team-a":
            return web.Response(status=401, text="no org id")
        async with client.get(f"{upstream.url}/api/v1/query", params=request.query) as answer:
            return web.Response(
                status=answer.status, body=await answer.read(), content_type="application/json"
            )

    app = web.Application()
    app.router.add_get("/prometheus/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/prometheus", seen
    finally:
        await runner.cleanup()
        await client.close()


async def test_a_bearer_token_and_a_tenant_header_reach_a_mimir_style_gateway(
    prom: SecuredPrometheus, tmp_path: Path, kube: KubeClient, hub: MetricsHub
) -> None:
    async with (
        sim_engine("chat-0", batch=6, alpha=0.8, draft_length=4) as pod,
        tenant_gateway(prom, tmp_path / "ca.crt") as (url, seen),
    ):
        await pod.wait_ready()
        prom.set_targets([target_group(pod, NAMESPACE, "chat", "stable")])
        await put_secret(kube, "prometheus-token", {"token": TOKEN + "\n"})  # a trailing newline is dropped
        spec = PrometheusSource.model_validate(
            {
                "url": url,
                "bearerTokenSecret": {"name": "prometheus-token", "key": "token"},
                "headers": [{"name": "X-Scope-OrgID", "value": "team-a"}],
            }
        )
        hub.register((NAMESPACE, "chat"), spec, BACKEND, 0.5)
        measured = await eventually(reader(hub, spec), lambda m: m.ok and m.batch is not None, 30)
        assert measured.batch == pytest.approx(6.0)
        assert seen[-1] == {"Authorization": f"Bearer {TOKEN}", "X-Scope-OrgID": "team-a"}
        # a resource in another namespace with the same settings reads its own namespace's Secret
        assert hub.target(spec, BACKEND, "team-b") != hub.target(spec, BACKEND, NAMESPACE)


async def test_a_resource_without_url_reads_the_operators_default_prometheus() -> None:
    hub = MetricsHub(default_url="http://prometheus.example:9090/")
    spec = PrometheusSource()
    try:
        hub.register((NAMESPACE, "chat"), spec, BACKEND, 15.0)
        poller = hub.poller(spec, BACKEND, NAMESPACE)
        assert poller is not None and poller.url == "http://prometheus.example:9090"
        # a bare URL string and a spec naming the same URL without credentials share one poller
        assert hub.poller("http://prometheus.example:9090", BACKEND) is poller
    finally:
        await hub.close()
