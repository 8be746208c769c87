"""Triton model control against simulated Triton pods (real HTTP, tritonclient on the wire)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from specops.adapters import triton as triton_adapter
from specops.adapters.triton import BLS_MODEL, TritonModelControl
from specops.domain import perf
from specops.domain.discovery import PodEndpoint, ready_endpoints
from specops_local.sim import DRAFT_MODEL, LoadPoint, SimPod, greedy_text

pytestmark = pytest.mark.timeout(30)

SETUP = perf.ModelSetup(gpu=perf.GPUS["H100"], target_params=70e9, draft_params=1e9)


def endpoint_of(pod: SimPod, variant: str = "stable") -> PodEndpoint:
    return PodEndpoint(pod.name, "ns", pod.host, pod.http_port, variant)


def pod_object(pod: SimPod, *, ready: bool = True) -> dict[str, Any]:
    """The Pod as the API server would return it, publishing the simulated pod's address."""
    return {
        "metadata": {"name": pod.name, "namespace": "ns", "labels": {"specops.dev/variant": "stable"}},
        "spec": {
            "containers": [
                {"name": "triton", "ports": [{"name": "http", "containerPort": pod.http_port}]},
            ]
        },
        "status": {
            "podIP": pod.host,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


@pytest.fixture
async def start_pod() -> AsyncIterator[Callable[..., Any]]:
    async with contextlib.AsyncExitStack() as stack:

        async def start(name: str, **kwargs: Any) -> SimPod:
            pod = SimPod(name, SETUP, load=LoadPoint(batch=2, alpha=0.8), tick_interval=None, **kwargs)
            return await stack.enter_async_context(pod)

        yield start


@pytest.fixture
def control() -> TritonModelControl:
    return TritonModelControl(timeout_s=2.0, load_timeout_s=2.0)


async def test_reads_the_speculation_settings_the_bls_runs(
    start_pod: Callable[..., Any], control: TritonModelControl
) -> None:
    pod = await start_pod("p0", draft_length=4)

    result = await control.read_bls_settings(endpoint_of(pod))

    assert result.ok, result.message
    assert result.settings is not None
    assert result.settings.num_draft_tokens == 4
    assert result.settings.draft_model_name == DRAFT_MODEL


async def test_changing_the_draft_length_reloads_the_bls_once_and_keeps_the_rest_of_its_config(
    start_pod: Callable[..., Any], control: TritonModelControl
) -> None:
    # given a pod drafting 4 tokens
    pod = await start_pod("p0", draft_length=4, deployment="chat")
    before = pod.bls_config
    loads_before = pod.bls_loads

    # when the draft length is set to 2
    changed = await control.apply_bls_settings(endpoint_of(pod), num_draft_tokens=2)

    # then the BLS was reloaded with the new default, everything else untouched
    assert changed.ok and changed.changed, changed.message
    assert pod.draft_length == 2
    assert pod.bls_loads == loads_before + 1
    after = pod.bls_config
    assert after["input"] == before["input"]
    assert after["parameters"]["specops_deployment"] == before["parameters"]["specops_deployment"]

    # when the same setting is applied again, nothing is reloaded
    again = await control.apply_bls_settings(endpoint_of(pod), num_draft_tokens=2)
    assert again.ok and not again.changed
    assert pod.bls_loads == loads_before + 1


async def test_hot_swapping_the_draft_model(
    start_pod: Callable[..., Any], control: TritonModelControl
) -> None:
    # given a pod whose repository gained a new draft
    pod = await start_pod("p0")
    pod.add_repository_model("draft-v2", "2")
    endpoint = endpoint_of(pod)

    # when the new draft is loaded, the BLS pointed at it, and the old one unloaded
    loaded = await control.load_model(endpoint, "draft-v2")
    switched = await control.apply_bls_settings(endpoint, draft_model_name="draft-v2")
    unloaded = await control.unload_model(endpoint, DRAFT_MODEL)

    # then the pod serves with the new draft only
    assert loaded.ok and switched.ok and switched.changed and unloaded.ok
    assert pod.active_draft == "draft-v2"
    assert await control.is_ready(endpoint, "draft-v2")
    assert not await control.is_ready(endpoint, DRAFT_MODEL)
    assert await control.is_ready(endpoint)


async def test_a_refused_setting_is_reported_and_leaves_the_pod_unchanged(
    start_pod: Callable[..., Any], control: TritonModelControl
) -> None:
    pod = await start_pod("p0", max_draft_len=8, draft_length=4)

    refused = await control.apply_bls_settings(endpoint_of(pod), num_draft_tokens=12)

    assert not refused.ok
    assert "max_draft_len" in refused.message
    assert pod.draft_length == 4


async def test_loading_a_model_missing_from_the_repository_is_reported(
    start_pod: Callable[..., Any], control: TritonModelControl
) -> None:
    pod = await start_pod("p0")

    result = await control.load_model(endpoint_of(pod), "no-such-draft")

    assert not result.ok
    assert "no-such-draft" in result.message


async def test_generate_is_greedy_and_identical_with_and_without_speculation(
    start_pod: Callable[..., Any], control: TritonModelControl
) -> None:
    pod = await start_pod("p0")
    endpoint = endpoint_of(pod)

    speculative = await control.generate(endpoint, "The quick brown fox", 12, num_draft_tokens=4)
    plain = await control.generate(endpoint, "The quick brown fox", 12, num_draft_tokens=0)

    assert speculative.ok and plain.ok, (speculative.message, plain.message)
    assert speculative.text == plain.text == greedy_text("The quick brown fox", 12)


async def test_fleet_apply_reports_partial_application(
    start_pod: Callable[..., Any], control: TritonModelControl
) -> None:
    # given three discovered pods, one of which has just gone down
    pods = [await start_pod(f"p{i}", draft_length=4) for i in range(3)]
    endpoints = ready_endpoints([pod_object(p) for p in pods])
    assert [e.address for e in endpoints] == [p.url for p in pods]
    await pods[2].stop()

    # when speculation is switched off on all of them
    fleet = await control.apply_to_all(endpoints, num_draft_tokens=0, retries=1, backoff_s=0.01)

    # then two applied, and the third is named with its reason after its retries
    assert (fleet.desired, fleet.applied, fleet.changed) == (3, 2, 2)
    assert not fleet.complete
    assert set(fleet.errors) == {"p2"}
    assert [p.draft_length for p in pods[:2]] == [0, 0]
    failed = next(r for r in fleet.results if r.pod == "p2")
    assert failed.attempts == 2


# ---------------------------------------------------------------- transport failures (minimal fake Triton)


async def _accept_load(request: web.Request) -> web.Response:
    return web.Response()


@contextlib.asynccontextmanager
async def fake_triton(
    config_handler: Callable[[web.Request], Any],
) -> AsyncIterator[PodEndpoint]:
    app = web.Application()
    app.router.add_get(f"/v2/models/{BLS_MODEL}/config", config_handler)
    app.router.add_get("/v2/health/ready", config_handler)
    app.router.add_post(f"/v2/repository/models/{BLS_MODEL}/load", _accept_load)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield PodEndpoint("fake", "ns", "127.0.0.1", int(runner.addresses[0][1]), "stable")
    finally:
        await runner.cleanup()


def _bls(draft_length: int) -> dict[str, Any]:
    return {
        "name": BLS_MODEL,
        "parameters": {
            "specops_default_num_draft_tokens": {"string_value": str(draft_length)},
            "tensorrt_llm_draft_model_name": {"string_value": "draft"},
        },
    }


async def test_server_error_is_reported_with_tritons_message(control: TritonModelControl) -> None:
    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"error": "model repository is corrupt"}, status=500)

    async with fake_triton(broken) as endpoint:
        result = await control.apply_bls_settings(endpoint, num_draft_tokens=2)

    assert not result.ok
    assert "model repository is corrupt" in result.message


async def test_a_hanging_pod_times_out_as_data() -> None:
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await release.wait()
        return web.json_response(_bls(4))

    async with fake_triton(hang) as endpoint:
        try:
            control = TritonModelControl(timeout_s=0.3, load_timeout_s=0.3)
            result = await control.apply_bls_settings(endpoint, num_draft_tokens=2)
            ready = await control.is_ready(endpoint)
        finally:
            release.set()

    assert not result.ok and result.message == "timed out"
    assert not ready


async def test_connection_refused_is_data_and_not_ready(control: TritonModelControl) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = PodEndpoint("gone", "ns", "127.0.0.1", port, "stable")

    applied = await control.apply_bls_settings(endpoint, num_draft_tokens=2)
    generated = await control.generate(endpoint, "hi", 4)

    assert not applied.ok and applied.message
    assert not generated.ok and generated.message
    assert not await control.is_ready(endpoint)


async def test_fleet_apply_retries_a_pod_that_fails_transiently(control: TritonModelControl) -> None:
    answers = iter([500, 500])

    async def flaky(request: web.Request) -> web.Response:
        status = next(answers, 200)
        if status != 200:
            return web.json_response({"error": "warming up"}, status=status)
        return web.json_response(_bls(4))

    async with fake_triton(flaky) as endpoint:
        fleet = await control.apply_to_all([endpoint], num_draft_tokens=2, retries=2, backoff_s=0.01)

    assert fleet.complete and fleet.changed == 1, fleet.errors
    assert fleet.results[0].attempts == 3


async def test_a_hung_pod_never_holds_the_others_setting_beyond_the_deadline(
    start_pod: Callable[..., Any],
) -> None:
    # Given two pods, one whose model load hangs far longer than a tick may wait
    fast = await start_pod("fast")
    slow = await start_pod("slow", load_latency=3.0)
    control = TritonModelControl(timeout_s=2.0, load_timeout_s=10.0, apply_deadline_s=0.5)
    endpoints = [endpoint_of(fast), endpoint_of(slow)]

    # When a new setting goes to both
    started = asyncio.get_running_loop().time()
    fleet = await control.apply_to_all(endpoints, num_draft_tokens=2, retries=0)
    waited = asyncio.get_running_loop().time() - started

    # Then the call returns at the deadline: the fast pod runs it, the hung one is reported, not waited for
    assert waited < 2.0, waited
    assert (fleet.desired, fleet.applied) == (2, 1)
    assert "still applying" in fleet.errors["slow"]
    assert fast.draft_length == 2
    # and the next tick does not stack a second load on the busy pod; once it finished, it counts
    again = await control.apply_to_all(endpoints, num_draft_tokens=2, retries=0)
    assert "still applying" in again.errors.get("slow", "")
    await asyncio.sleep(3.0)
    done = await control.apply_to_all(endpoints, num_draft_tokens=2, retries=0)
    assert done.complete, done.errors
    assert slow.draft_length == 2


def trusting_control() -> tuple[list[float], TritonModelControl]:
    """A control that trusts a pod's confirmation for 60 s, on a clock the test moves (``clock[0]``)."""
    clock = [1000.0]
    control = TritonModelControl(
        timeout_s=2.0, load_timeout_s=2.0, confirm_ttl_s=60.0, clock=lambda: clock[0]
    )
    return clock, control


async def test_confirmed_settings_are_trusted_for_a_while_and_a_restarted_container_is_read_at_once(
    start_pod: Callable[..., Any],
) -> None:
    # given a pod drafting 4 tokens, and a control that trusts a confirmation for 60 s
    clock, control = trusting_control()
    pod = await start_pod("p0", draft_length=4)
    endpoint = PodEndpoint(pod.name, "ns", pod.host, pod.http_port, "stable", incarnation="uid-1/0")

    # when every tick asks for what the pod already runs
    first = await control.apply_to_all([endpoint], num_draft_tokens=4)
    reads = pod.config_reads
    for _ in range(5):
        clock[0] += 10.0
        again = await control.apply_to_all([endpoint], num_draft_tokens=4)
        assert again.applied == 1 and not again.errors

    # then the pod was read once, not every tick
    assert first.applied == 1 and reads == 1
    assert pod.config_reads == reads
    # a different setting is applied (read, reloaded) at once, whatever was confirmed
    changed = await control.apply_to_all([endpoint], num_draft_tokens=2)
    assert changed.changed == 1 and pod.draft_length == 2
    reads = pod.config_reads
    # a restarted container (its config back to the repository's) is read at once
    restarted = PodEndpoint(pod.name, "ns", pod.host, pod.http_port, "stable", incarnation="uid-1/1")
    await control.apply_to_all([restarted], num_draft_tokens=2)
    assert pod.config_reads == reads + 1
    # and past the trust period it is read again
    clock[0] += 61.0
    await control.apply_to_all([restarted], num_draft_tokens=2)
    assert pod.config_reads == reads + 2


async def test_without_a_trust_period_every_apply_reads_the_pod(start_pod: Callable[..., Any]) -> None:
    control = TritonModelControl(timeout_s=2.0, load_timeout_s=2.0)
    pod = await start_pod("p0", draft_length=4)
    for _ in range(3):
        await control.apply_to_all([endpoint_of(pod)], num_draft_tokens=4)
    assert pod.config_reads == 3


async def test_with_many_pods_confirmed_settings_are_trusted_longer(
    start_pod: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Re-reads of confirmed pods stay within a rate for the whole operator (10 a second: from 600
    # pods at 60 s). Here a rate of one read per 120 s, so one pod stretches the 60 s to 120 s.
    monkeypatch.setattr(triton_adapter, "CONFIRM_READS_PER_S", 1.0 / 120.0)
    clock, control = trusting_control()
    pod = await start_pod("p0", draft_length=4)
    endpoint = endpoint_of(pod)
    await control.apply_to_all([endpoint], num_draft_tokens=4)
    reads = pod.config_reads

    clock[0] += 61.0
    await control.apply_to_all([endpoint], num_draft_tokens=4)
    assert pod.config_reads == reads  # still trusted past 60 s
    clock[0] += 60.0
    await control.apply_to_all([endpoint], num_draft_tokens=4)
    assert pod.config_reads == reads + 1  # read again past 120 s


async def test_a_pod_that_went_away_is_forgotten_and_stops_stretching_the_others_trust(
    start_pod: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every confirmed pod stretches the trust window by 60 s here (one re-read per 60 s for the
    # whole operator): two pods are trusted for 120 s, one for 60 s.
    monkeypatch.setattr(triton_adapter, "CONFIRM_READS_PER_S", 1.0 / 60.0)
    clock, control = trusting_control()
    staying, leaving = await start_pod("stays", draft_length=4), await start_pod("leaves", draft_length=4)
    await control.apply_to_all([endpoint_of(staying), endpoint_of(leaving)], num_draft_tokens=4)

    # when one pod goes away (deleted: no resource asks for it again) and the other is ticked
    # every 10 s for ten minutes
    reads_at: list[float] = []
    for _ in range(60):
        clock[0] += 10.0
        before = staying.config_reads
        await control.apply_to_all([endpoint_of(staying)], num_draft_tokens=4)
        if staying.config_reads > before:
            reads_at.append(clock[0])

    # then once the gone pod is forgotten the one left is trusted for its own 60 s again: read
    # about every 70 s, not every 130 s as long as the gone pod was counted
    gaps = [later - earlier for earlier, later in itertools.pairwise(reads_at)]
    assert gaps[-3:] == [70.0, 70.0, 70.0], reads_at
