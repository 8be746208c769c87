"""The Prometheus poller against Debian's real Prometheus scraping simulated vLLM engines.

Simulated engines advance with wall time, so their counters grow like a real
engine's; Prometheus scrapes them every second through file-based discovery with
the labels the production PodMonitor produces.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import math
import re
import socket
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from aiohttp import web

from specops.adapters import log_redaction
from specops.adapters.prometheus import MetricsHub, PrometheusPoller
from specops.api import conditions as cond
from specops.api.models import SpeculativeDeployment
from specops.api.status import SpeculationStatus, SpeculativeDeploymentStatus
from specops.domain import perf
from specops.domain.metrics import (
    PROFILES,
    REASON_INVALID,
    REASON_METRICS_UNAVAILABLE,
    BackendProfile,
    Measurement,
    Snapshot,
)
from specops.services.control import ControlLoop
from specops_local.prometheus import PrometheusProcess, run_prometheus
from specops_local.sim import LoadPoint, SimEngine, launch
from specops_local.sim.metrics import CORRUPTIONS, TPOT_BUCKETS
from tests.conftest import EXAMPLES
from tests.secret_shapes import URL_SHAPES, SecretShape

pytestmark = pytest.mark.timeout(60)

SETUP = perf.ModelSetup(gpu=perf.GPUS["H100"], target_params=70e9, draft_params=1e9)
BACKEND = "vllm"  # an engine that counts its verification steps: alpha and K are both measured
VLLM = PROFILES[BACKEND]
POLL_INTERVAL_S = 0.5
T = TypeVar("T")
RATE_WINDOW_S = 4.0  # four 1 s scrapes: short, so a new series' rates settle quickly


def now() -> datetime:
    return datetime.now(UTC)


def sim_engine(name: str, *, batch: float, alpha: float, draft_length: int) -> SimEngine:
    """A vLLM engine started as the renderer starts one: plain, or drafting ``draft_length``
    tokens at every batch; ready at once."""
    args = ["/models/target", "--served-model-name", "chat", "--host", "0.0.0.0", "--port", "8000"]
    if draft_length > 0:
        spec = {"method": "draft_model", "model": "/models/draft", "num_speculative_tokens": draft_length}
        args += ["--speculative-config", json.dumps(spec)]
    return launch(
        name,
        ["vllm", "serve"],
        args,
        setup=SETUP,
        load=LoadPoint(batch=batch, alpha=alpha),
        restart_s=0,
        tick_interval=0.1,
    )


def target_group(
    pod: SimEngine, namespace: str, deployment: str, variant: str, draft: str = "v1-00000000"
) -> dict[str, Any]:
    """What the PodMonitor relabelling produces for one pod."""
    return {
        "targets": [pod.metrics_url.removeprefix("http://").split("/", 1)[0]],
        "labels": {
            "namespace": namespace,
            "specops_deployment": deployment,
            "variant": variant,
            "specops_draft": draft,
            "pod": pod.name,
        },
    }


async def eventually(read: Callable[[], T], condition: Callable[[T], bool], timeout_s: float) -> T:
    """Poll ``read`` until ``condition`` holds; fail with the last value read."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = read()
        if condition(value):
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s; last: {value}")
        await asyncio.sleep(0.05)


def fully_measured(m: Measurement) -> bool:
    return m.ok and None not in (m.alpha, m.batch, m.request_rate, m.tpot_p50_s)


def bucket_around(value: float) -> tuple[float, float]:
    """The TPOT histogram bucket (lower, upper] that holds ``value`` in the simulated engines."""
    lower = 0.0
    for upper in TPOT_BUCKETS:
        if value <= upper:
            return lower, upper
        lower = upper
    return lower, math.inf


@pytest.fixture
async def prom(tmp_path: Path) -> AsyncIterator[PrometheusProcess]:
    async with run_prometheus(tmp_path, scrape_interval="1s") as server:
        yield server


@pytest.fixture
async def pods() -> AsyncIterator[Callable[..., Any]]:
    """Start simulated engines on demand; every one is stopped at teardown."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(name: str, *, batch: float, alpha: float = 0.8, draft_length: int = 4) -> SimEngine:
            engine = await stack.enter_async_context(
                sim_engine(name, batch=batch, alpha=alpha, draft_length=draft_length)
            )
            await engine.wait_ready()
            return engine

        yield start


@pytest.fixture
async def hub() -> AsyncIterator[MetricsHub]:
    metrics = MetricsHub(scrape_interval_s=1.0, window_s=RATE_WINDOW_S, timeout_s=2.0)
    yield metrics
    await metrics.close()


async def test_snapshot_reports_acceptance_batch_and_latency_per_variant(
    prom: PrometheusProcess, pods: Callable[..., Any], hub: MetricsHub
) -> None:
    # given two stable pods and one canary of deployment team-a/chat, and a deployment not speculating
    stable_a = await pods("chat-stable-a", batch=10, alpha=0.8, draft_length=4)
    stable_b = await pods("chat-stable-b", batch=20, alpha=0.8, draft_length=4)
    canary = await pods("chat-canary", batch=6, alpha=0.6, draft_length=3)
    plain = await pods("plain-0", batch=8, draft_length=0)
    prom.set_targets(
        [
            target_group(stable_a, "team-a", "chat", "stable"),
            target_group(stable_b, "team-a", "chat", "stable"),
            target_group(canary, "team-a", "chat", "canary"),
            target_group(plain, "team-b", "plain", "stable"),
        ]
    )
    for key in ("team-a/chat", "team-b/plain"):
        hub.register(key, prom.url, BACKEND, POLL_INTERVAL_S)

    def read(namespace: str, name: str, variant: str) -> Callable[[], Measurement]:
        return lambda: hub.lookup(prom.url, BACKEND, namespace, name, variant, now())

    # when Prometheus has scraped a few times
    stable = await eventually(
        read("team-a", "chat", "stable"), lambda m: fully_measured(m) and m.pods_reporting == 2, 25
    )
    canary_m = await eventually(read("team-a", "chat", "canary"), fully_measured, 5)
    plain_m = await eventually(read("team-b", "plain", "stable"), lambda m: m.ok and m.batch is not None, 5)
    # and every pod's series is older than the rate window (rate() under-reports younger ones)
    await prom.wait_for(
        f"min(count_over_time(up[{RATE_WINDOW_S:g}s]))",
        lambda v: bool(v) and float(v[0]["value"][1]) >= 4,
        10,
    )
    window_full = now()
    stable = await eventually(read("team-a", "chat", "stable"), lambda m: m.ok and m.at > window_full, 5)
    canary_m = await eventually(read("team-a", "chat", "canary"), lambda m: m.ok and m.at > window_full, 5)

    # then acceptance is converted back to the per-token alpha each variant runs at
    assert stable.alpha == pytest.approx(0.8, abs=0.02)
    assert stable.mean_draft_length == pytest.approx(4.0, rel=0.02)
    assert canary_m.alpha == pytest.approx(0.6, abs=0.02)
    assert canary_m.mean_draft_length == pytest.approx(3.0, rel=0.02)
    # and the batch is the mean of the pods' running requests
    assert stable.batch == pytest.approx(15.0)
    assert canary_m.batch == pytest.approx(6.0)
    # and the latency quantiles come from the bucket the model's per-token latency falls into
    lower, _ = bucket_around(perf.per_token_latency(SETUP, 0.8, 10, 4))
    _, upper = bucket_around(perf.per_token_latency(SETUP, 0.8, 20, 4))
    assert stable.tpot_p50_s is not None and stable.tpot_p95_s is not None and stable.tpot_p99_s is not None
    assert lower <= stable.tpot_p50_s <= stable.tpot_p95_s <= stable.tpot_p99_s <= upper
    # and throughput matches what the pods emit (tokens/s summed over pods)
    expected_tokens_per_s = 10 / perf.per_token_latency(SETUP, 0.8, 10, 4) + 20 / perf.per_token_latency(
        SETUP, 0.8, 20, 4
    )
    assert stable.tokens_per_s == pytest.approx(expected_tokens_per_s, rel=0.15)
    assert stable.request_rate == pytest.approx(expected_tokens_per_s / 200, rel=0.35)
    # and a deployment that drafts nothing is measured, with no alpha rather than an error
    assert plain_m.ok and plain_m.alpha is None and plain_m.acceptance_rate is None
    assert plain_m.batch == pytest.approx(8.0)


def _query_requests_served(metrics_text: str) -> float:
    """prometheus_http_requests_total for the instant-query handler, read from Prometheus's own /metrics."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _requests_for_one_cycle(prom: PrometheusProcess, poller: PrometheusPoller) -> tuple[int, float]:
    """(measurements in the snapshot, instant queries Prometheus served for that one cycle)."""
    async with httpx.AsyncClient() as client:
        before = _query_requests_served((await client.get(f"{prom.url}/metrics")).text)
        snapshot = await poller.poll_once(now())
        after = _query_requests_served((await client.get(f"{prom.url}/metrics")).text)
    assert snapshot.phase == "Ok", snapshot.error
    return len(snapshot.measurements), after - before


async def test_queries_per_cycle_do_not_grow_with_resources(
    prom: PrometheusProcess, pods: Callable[..., Any], hub: MetricsHub
) -> None:
    # given one resource with one pod
    first = await pods("res-0-pod", batch=4)
    prom.set_targets([target_group(first, "ns", "res-0", "stable")])
    await prom.wait_for('count(up{specops_deployment="res-0"} == 1)', lambda v: len(v) == 1, 20)
    poller = PrometheusPoller(prom.url, VLLM, POLL_INTERVAL_S, scrape_interval_s=1.0)
    try:
        # when one cycle runs, Prometheus serves exactly one query per quantity
        measured, served_for_one = await _requests_for_one_cycle(prom, poller)
        assert measured == 1
        assert served_for_one == poller.queries_last_cycle == len(VLLM.queries(10))

        # given twenty resources
        more = [await pods(f"res-{i}-pod", batch=4) for i in range(1, 20)]
        prom.set_targets(
            [target_group(first, "ns", "res-0", "stable")]
            + [target_group(pod, "ns", f"res-{i}", "stable") for i, pod in enumerate(more, start=1)]
        )
        await prom.wait_for("count(up == 1)", lambda v: bool(v) and v[0]["value"][1] == "20", 20)

        # then a cycle covering all twenty still costs the same number of queries
        # (counted before the hub's own poller starts, which would add its cycles to the count)
        measured, served_for_twenty = await _requests_for_one_cycle(prom, poller)
        assert measured == 20
        assert served_for_twenty == served_for_one
        # and the hub, with all twenty registered, serves them from one poller
        for i in range(20):
            hub.register(("ns", f"res-{i}"), prom.url, BACKEND, POLL_INTERVAL_S)
        hub_poller = hub.poller(prom.url, BACKEND)
        assert hub_poller is not None
        await eventually(
            lambda: hub.lookup(prom.url, BACKEND, "ns", "res-19", "stable", now()),
            lambda m: m.ok,
            10,
        )
        assert hub_poller.queries_last_cycle == served_for_one
    finally:
        await poller.aclose()


async def test_a_new_canary_is_measured_on_its_own_drafts_series_only(
    prom: PrometheusProcess, pods: Callable[..., Any]
) -> None:
    # given a canary of draft v4 (alpha 0.88) measured next to the stable variant, over a 10 s rate window
    hub = MetricsHub(scrape_interval_s=1.0, window_s=10.0, timeout_s=2.0)
    try:
        stable = await pods("chat-stable", batch=8, alpha=0.75)
        old = await pods("chat-canary-old", batch=8, alpha=0.88)
        prom.set_targets(
            [
                target_group(stable, "team-a", "chat", "stable", "v3-11111111"),
                target_group(old, "team-a", "chat", "canary", "v4-22222222"),
            ]
        )
        hub.register("team-a/chat", prom.url, BACKEND, POLL_INTERVAL_S)

        def canary(draft: str | None) -> Measurement:
            return hub.lookup(prom.url, BACKEND, "team-a", "chat", "canary", now(), draft=draft)

        await eventually(lambda: canary("v4-22222222"), lambda m: m.ok and m.alpha is not None, 25)
        await asyncio.sleep(3.0)  # the old draft's series fill the window

        # when it is promoted and the next canary (draft v5, alpha 0.55) replaces its pod at once
        new = await pods("chat-canary-new", batch=8, alpha=0.55)
        prom.set_targets(
            [
                target_group(stable, "team-a", "chat", "stable", "v3-11111111"),
                target_group(new, "team-a", "chat", "canary", "v5-33333333"),
            ]
        )

        # then every reading of the new draft is the new draft's alone, while the variant as a
        # whole still mixes in what the old draft left in the window
        own: list[float] = []
        whole: list[float] = []
        deadline = asyncio.get_running_loop().time() + 20.0
        while asyncio.get_running_loop().time() < deadline:
            mine, all_drafts = canary("v5-33333333"), canary(None)
            if mine.ok and mine.alpha is not None:
                own.append(mine.alpha)
            if all_drafts.ok and all_drafts.alpha is not None:
                whole.append(all_drafts.alpha)
            await asyncio.sleep(0.25)
        assert own, "the new draft was never measured"
        assert all(alpha == pytest.approx(0.55, abs=0.03) for alpha in own), own
        assert max(whole) > 0.65, whole  # the old series were really there
    finally:
        await hub.close()


def resource_named(name: str, prometheus_url: str) -> SpeculativeDeployment:
    """The example resource, on vLLM, in team-a, reading ``prometheus_url`` every POLL_INTERVAL_S."""
    body = yaml.safe_load((EXAMPLES / "dense-70b-7b.yaml").read_text())
    body["metadata"] = {"name": name, "namespace": "team-a", "uid": f"u-{name}"}
    body["spec"]["serving"]["backend"] = BACKEND
    body["spec"]["metrics"] = {"prometheus": {"url": prometheus_url}, "interval": "1s"}
    return SpeculativeDeployment.model_validate(body)


async def test_an_exporter_answering_nan_inf_or_negative_values_is_a_metrics_outage_of_its_own(
    prom: PrometheusProcess, pods: Callable[..., Any], hub: MetricsHub
) -> None:
    # Given one resource per spoiled value and one healthy resource, each measured fully first
    names = {corruption: f"spoiled-{corruption}" for corruption in CORRUPTIONS}
    engines = {name: await pods(f"{name}-0", batch=10) for name in [*names.values(), "healthy"]}
    prom.set_targets([target_group(engine, "team-a", name, "stable") for name, engine in engines.items()])
    resources = {name: resource_named(name, prom.url) for name in engines}
    for name, sdep in resources.items():
        hub.register(("team-a", name), sdep.spec.metrics.prometheus, BACKEND, POLL_INTERVAL_S)

    def read(name: str) -> Callable[[], Measurement]:
        source = resources[name].spec.metrics.prometheus
        return lambda: hub.lookup(source, BACKEND, "team-a", name, "stable", now())

    for name in engines:
        await eventually(read(name), fully_measured, 25)

    # When their engines export NaN, +Inf or negative values for every sample
    for corruption, name in names.items():
        engines[name].metrics_fault = corruption

    # Then each is a metrics outage with its own reason within a few cycles (count() and
    # histogram_quantile() still answer finite numbers over such samples), the healthy one is not
    for name in names.values():
        spoiled = await eventually(read(name), lambda m: not m.ok, 10)
        assert spoiled.reason == REASON_INVALID, (name, spoiled)
    assert fully_measured(read("healthy")())
    # and the control loop holds its revision and says so in MetricsUnavailable, status shows no value
    loop = ControlLoop(hub)
    fresh = SpeculativeDeploymentStatus(phase="Baseline", speculation=SpeculationStatus())
    for name in names.values():
        result = await loop.tick(resources[name], fresh, [], now(), draft_stale=False)
        unavailable = [u for u in result.updates if u.type == cond.METRICS_UNAVAILABLE]
        assert [(u.status, u.reason) for u in unavailable] == [("True", REASON_INVALID)], name
        assert "no finite, non-negative value" in unavailable[0].message
        assert result.status.observed.batch is None and result.status.observed.request_rate is None

    # When the exporters heal, the resources are measured again once the window holds good samples only
    for name in names.values():
        engines[name].metrics_fault = None
    for name in names.values():
        await eventually(read(name), fully_measured, RATE_WINDOW_S + 10)


async def test_prometheus_outage_reads_as_metrics_unavailable_then_recovers(
    prom: PrometheusProcess, pods: Callable[..., Any], hub: MetricsHub
) -> None:
    # given a measured deployment
    pod = await pods("chat-0", batch=10)
    prom.set_targets([target_group(pod, "team-a", "chat", "stable")])
    hub.register("team-a/chat", prom.url, BACKEND, POLL_INTERVAL_S)

    def read() -> Measurement:
        return hub.lookup(prom.url, BACKEND, "team-a", "chat", "stable", now())

    await eventually(read, fully_measured, 25)

    # when Prometheus goes away
    await prom.stop()

    # then the deployment reads as an error without numbers, not as stale numbers
    down = await eventually(read, lambda m: not m.ok, 5)
    assert down.reason == REASON_METRICS_UNAVAILABLE
    assert "cannot reach Prometheus" in (down.error or "")
    assert down.alpha is None and down.batch is None

    # when it comes back on the same address, measurements resume
    await prom.start()
    back = await eventually(read, fully_measured, 25)
    assert back.alpha == pytest.approx(0.8, abs=0.02)


async def test_prometheus_error_answer_becomes_an_error_snapshot(prom: PrometheusProcess) -> None:
    # given a profile whose query Prometheus rejects
    broken = BackendProfile(name="broken", batch_gauge="up{", request_counter="up", tpot_histogram="x")
    poller = PrometheusPoller(prom.url, broken, scrape_interval_s=1.0)
    try:
        # when a cycle runs
        snapshot = await poller.poll_once(now())
    finally:
        await poller.aclose()
    # then the cycle failed as data, with Prometheus's own explanation
    assert snapshot.phase == "Error"
    assert "bad_data" in (snapshot.error or "")
    assert not snapshot.lookup("ns", "x", "stable", now(), 60).ok


# ---------------------------------------------------------------- failures without a real Prometheus


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def fake_prometheus(handler: Callable[[web.Request], Any]) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/api/v1/query", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def one_cycle(
    handler: Callable[[web.Request], Any], release: asyncio.Event | None = None, **poller_args: Any
) -> tuple[Snapshot, PrometheusPoller]:
    """One poll cycle of a poller against a fake Prometheus answering with ``handler``; ``release``
    is set once the cycle ended, so hanging handlers return before the server stops."""
    async with fake_prometheus(handler) as url:
        poller = PrometheusPoller(url, VLLM, **poller_args)
        try:
            return await poller.poll_once(now()), poller
        finally:
            if release is not None:
                release.set()
            await poller.aclose()


async def test_connection_refused_becomes_an_error_snapshot() -> None:
    poller = PrometheusPoller(f"http://127.0.0.1:{_unused_port()}", VLLM, timeout_s=2.0)
    try:
        snapshot = await poller.poll_once(now())
    finally:
        await poller.aclose()
    assert snapshot.phase == "Error"
    assert "cannot reach Prometheus" in (snapshot.error or "")


async def test_slow_prometheus_times_out_as_an_error_snapshot() -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})

    snapshot, _ = await one_cycle(hang, release, interval_s=0.4, timeout_s=0.3)
    assert snapshot.phase == "Error"
    assert "timed out" in (snapshot.error or "")


async def test_an_answer_slower_than_the_timeout_but_within_the_interval_is_used() -> None:
    # A fleet's grouped quantiles take seconds at thousands of pods: an answer within 60 % of the
    # poll interval is this cycle's, whatever the (shorter) base timeout
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.6)
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})

    snapshots = {}
    async with fake_prometheus(slow) as url:
        for interval_s in (2.0, 0.4):
            poller = PrometheusPoller(url, VLLM, interval_s=interval_s, timeout_s=0.3)
            try:
                snapshots[interval_s] = await poller.poll_once(now())
            finally:
                await poller.aclose()
    assert snapshots[2.0].phase != "Error", snapshots[2.0].error  # 0.6 s of a 1.2 s allowance
    assert snapshots[0.4].phase == "Error" and "timed out after 0.3s" in (snapshots[0.4].error or "")


def _vector(value: float) -> dict[str, Any]:
    labels = {"namespace": "ns", "specops_deployment": "chat", "variant": "stable", "specops_draft": "v1"}
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": labels, "value": [0, str(value)]}]},
    }


async def test_a_cycle_whose_latency_quantiles_time_out_keeps_everything_else() -> None:
    # At thousands of pods the grouped histogram_quantile queries are the ones that outgrow the
    # interval; the fleet keeps deciding on the (cheap) mean while canaries pause judgement
    release = asyncio.Event()

    async def quantiles_hang(request: web.Request) -> web.Response:
        if request.query["query"].startswith("histogram_quantile"):
            await release.wait()
        return web.json_response(_vector(0.02))

    snapshot, poller = await one_cycle(quantiles_hang, release, interval_s=0.4, timeout_s=0.3)
    assert snapshot.phase == "Ok", snapshot.error
    measured = snapshot.lookup("ns", "chat", "stable", now(), 60)
    assert measured.ok and measured.batch == pytest.approx(0.02) and measured.tpot_mean_s is not None
    assert measured.tpot_p50_s is None and measured.tpot_p99_s is None
    assert "latency quantiles missing" in (measured.latency_error or "")
    assert "timed out after 0.3s" in (measured.latency_error or "")
    assert poller.latency_error == measured.latency_error


async def test_any_other_query_failing_still_fails_the_whole_cycle() -> None:
    async def batch_broken(request: web.Request) -> web.Response:
        if request.query["query"].startswith("avg by"):
            return web.json_response(
                {"status": "error", "errorType": "execution", "error": "boom"}, status=422
            )
        return web.json_response(_vector(0.02))

    snapshot, _ = await one_cycle(batch_broken)
    assert snapshot.phase == "Error" and "boom" in (snapshot.error or "")


async def test_one_cycles_quotients_come_from_one_evaluation_instant() -> None:
    # A Prometheus left to its own clock evaluates each query when it arrives; a scrape landing
    # between two of them gives drafted tokens and verification steps different samples, and the
    # mean draft length (their quotient) is read wrong. This fake advances its clock a second per
    # query, as if a scrape landed between each, unless the query names its evaluation time.
    answered: list[float] = []
    clock = iter(range(1_000_000, 2_000_000))

    async def scraped_between_queries(request: web.Request) -> web.Response:
        evaluated_at = float(request.query.get("time", next(clock)))
        answered.append(evaluated_at)
        steps_per_s = 100.0 + evaluated_at % 7  # a rate that moves with the samples in the window
        query = request.query["query"]
        if "draft_tokens" in query:
            return web.json_response(_vector(4 * steps_per_s))
        if "accepted_tokens" in query:
            return web.json_response(_vector(2.5 * steps_per_s))
        if "num_drafts_total" in query:
            return web.json_response(_vector(steps_per_s))
        return web.json_response(_vector(0.02))

    snapshot, poller = await one_cycle(scraped_between_queries)
    assert snapshot.phase == "Ok", snapshot.error
    measured = snapshot.lookup("ns", "chat", "stable", now(), 60)
    assert measured.mean_draft_length == pytest.approx(4.0)
    assert measured.acceptance_rate == pytest.approx(2.5 / 4)
    assert len(answered) == poller.queries_last_cycle and len(set(answered)) == 1
    assert answered[0] == pytest.approx(now().timestamp(), abs=30)


async def test_non_json_gateway_error_becomes_an_error_snapshot() -> None:
    async def gateway_error(request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>bad gateway</html>")

    async with fake_prometheus(gateway_error) as url:
        poller = PrometheusPoller(url, VLLM)
        try:
            snapshot = await poller.poll_once(now())
        finally:
            await poller.aclose()
    assert snapshot.phase == "Error"
    assert re.search(r"HTTP 502", snapshot.error or "")


async def test_hub_polls_while_resources_need_it_and_stops_after_the_last_leaves() -> None:
    queries: list[str] = []

    async def empty(request: web.Request) -> web.Response:
        queries.append(request.query["query"])
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})

    async with fake_prometheus(empty) as url:
        hub = MetricsHub(scrape_interval_s=1.0)
        try:
            # given nothing registered, nothing is polled
            assert hub.poller(url, BACKEND) is None
            assert not hub.lookup(url, BACKEND, "ns", "a", "stable", now()).ok

            # when two resources register against the same Prometheus and backend
            hub.register("a", url, BACKEND, 0.05)
            hub.register("b", url, BACKEND, 0.05)
            poller = hub.poller(url, BACKEND)
            assert poller is not None
            await eventually(lambda: poller.cycles, lambda cycles: cycles >= 3, 5)

            # then one poller serves both, and a resource without series reads as an error
            missing = hub.lookup(url, BACKEND, "ns", "a", "stable", now())
            assert not missing.ok and missing.reason == "NoMetricsForDeployment"

            # when one leaves, polling goes on; when the last leaves, it stops
            hub.unregister("a")
            assert hub.poller(url, BACKEND) is poller
            hub.unregister("b")
            assert hub.poller(url, BACKEND) is None
            await asyncio.sleep(0.2)
            settled = len(queries)
            await asyncio.sleep(0.3)
            assert len(queries) == settled
        finally:
            await hub.close()


async def test_credentials_in_the_url_are_sent_as_basic_auth_and_answers_asked_for_uncompressed() -> None:
    seen: list[tuple[str | None, str | None]] = []

    async def guarded(request: web.Request) -> web.Response:
        seen.append((request.headers.get("Authorization"), request.headers.get("Accept-Encoding")))
        if request.headers.get("Authorization") != "Basic " + base64.b64encode(b"metrics:s3cr3t").decode():
            return web.json_response({"status": "error", "errorType": "unauthorized"}, status=401)
        return web.json_response(_vector(1.0))

    async with fake_prometheus(guarded) as url:
        poller = PrometheusPoller(url.replace("http://", "http://metrics:s3cr3t@"), VLLM)
        try:
            snapshot = await poller.poll_once(now())
        finally:
            await poller.aclose()
    assert snapshot.phase == "Ok", snapshot.error
    assert snapshot.lookup("ns", "chat", "stable", now(), 60).ok
    # a dozen answers of a few hundred KB each at a large fleet: inflating them is the operator's CPU
    assert seen and all(encoding == "identity" for _, encoding in seen)


@pytest.mark.parametrize("shape", URL_SHAPES, ids=[s.name for s in URL_SHAPES])
async def test_a_password_in_the_prometheus_url_is_in_no_message_whatever_it_holds(
    shape: SecretShape, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a Prometheus URL whose password holds raw '#', '/', '?' or '@', and nothing listening
    log_redaction.install()
    caplog.set_level(logging.DEBUG)
    userinfo = shape.url.partition("://")[2].rpartition("@")[0] if shape.url else ""
    url = f"http://{userinfo}@127.0.0.1:{_unused_port()}"
    poller = PrometheusPoller(url, VLLM, timeout_s=2.0)
    try:
        snapshot = await poller.poll_once(now())
    finally:
        await poller.aclose()
    # Then the failure (what MetricsUnavailable and its Warning Event say) and every log line
    # name the Prometheus without the password
    assert snapshot.phase == "Error" and "127.0.0.1" in (snapshot.error or "")
    shown = [snapshot.error or "", poller.shown_url, *(r.getMessage() for r in caplog.records)]
    assert not [text for text in shown if shape.secret in text], shown
