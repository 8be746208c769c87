"""Simulated serving pods: the Triton side through tritonclient, the metrics side through /metrics."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import httpx
import pytest
import tritonclient.http.aio as triton_http
from tritonclient.utils import InferenceServerException

from specops.domain import perf
from specops.domain.acceptance import acceptance_rate_from_alpha
from specops.domain.profile import ServingProfile
from specops.profiles import load_builtin
from specops_local.sim import LoadPoint, SimPod, parse_csv_trace, steps

SETUP = perf.ModelSetup(
    gpu=perf.GPUS["H100"], target_params=70e9, draft_params=1e9, tensor_parallel=4, efficiency=0.5
)
BLS = "tensorrt_llm_bls"
DRAFT_LENGTH = "specops_default_num_draft_tokens"
DRAFT_NAME = "tensorrt_llm_draft_model_name"

PodFactory = Callable[..., Coroutine[Any, Any, SimPod]]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> Samples:
    samples: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a Prometheus text sample: {line!r}"
        name, labels, value = match.groups()
        samples[(name, frozenset(_LABEL.findall(labels or "")))] = float(value)
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the series of `name` whose labels include `labels` (like a PromQL sum)."""
    wanted = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and wanted <= ls]
    assert found, f"no series {name}{labels}"
    return sum(found)


async def scrape(pod: SimPod) -> Samples:
    async with httpx.AsyncClient() as client:
        response = await client.get(pod.metrics_url)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse_metrics(response.text)


async def bls_config(client: triton_http.InferenceServerClient) -> dict[str, Any]:
    config: dict[str, Any] = await client.get_model_config(BLS)
    return config


async def load_bls(client: triton_http.InferenceServerClient, **parameters: str) -> None:
    """What the operator does: GET the BLS config, change parameters, load it back as an override."""
    config = await bls_config(client)
    for key, string_value in parameters.items():
        config["parameters"][key] = {"string_value": string_value}
    await client.load_model(BLS, config=json.dumps(config))


async def generate(pod: SimPod, prompt: str, **extra: Any) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(
            f"http://{pod.url}/v2/models/ensemble/generate",
            json={"text_input": prompt, "max_tokens": 24, "temperature": 0, **extra},
        )


@pytest.fixture
async def make_pod() -> AsyncIterator[PodFactory]:
    pods: list[SimPod] = []

    async def factory(**kwargs: Any) -> SimPod:
        kwargs.setdefault("load", LoadPoint(batch=8, alpha=0.8))
        kwargs.setdefault("tick_interval", None)
        pod = SimPod(kwargs.pop("name", f"pod-{len(pods)}"), SETUP, **kwargs)
        pods.append(pod)
        await pod.start()
        return pod

    yield factory
    for pod in pods:
        await pod.stop()


@pytest.fixture
async def pod(make_pod: PodFactory) -> SimPod:
    return await make_pod()


@pytest.fixture
async def client(pod: SimPod) -> AsyncIterator[triton_http.InferenceServerClient]:
    async with triton_http.InferenceServerClient(url=pod.url) as triton:
        yield triton


async def test_readiness_follows_set_ready_while_liveness_stays(
    pod: SimPod, client: triton_http.InferenceServerClient
) -> None:
    assert await client.is_server_live()
    assert await client.is_server_ready()

    pod.set_ready(False)
    assert await client.is_server_live()
    assert not await client.is_server_ready()

    pod.set_ready(True)
    assert await client.is_server_ready()


async def test_repository_lists_the_draft_target_models_and_shipped_drafts(
    pod: SimPod, client: triton_http.InferenceServerClient
) -> None:
    pod.add_repository_model("tensorrt_llm_draft_v4", "4")

    index = {entry["name"]: entry for entry in await client.get_model_repository_index()}

    assert {name for name, entry in index.items() if entry["state"] == "READY"} == {
        "tensorrt_llm",
        "tensorrt_llm_draft",
        "tensorrt_llm_bls",
        "ensemble",
    }
    assert index["tensorrt_llm_draft_v4"]["state"] == "UNAVAILABLE"
    assert await client.is_model_ready("ensemble")
    assert await client.is_model_ready("tensorrt_llm", "1")
    assert not await client.is_model_ready("tensorrt_llm_draft_v4")
    assert (await client.get_server_metadata())["name"] == "triton"
    assert (await client.get_model_metadata("ensemble"))["versions"] == ["1"]
    with pytest.raises(InferenceServerException, match="unknown model"):
        await client.get_model_config("tensorrt_llm_draft_v4")


async def test_bls_config_is_triton_json_naming_target_draft_and_length(
    client: triton_http.InferenceServerClient,
) -> None:
    config = await bls_config(client)

    assert config["name"] == BLS
    assert config["backend"] == "python"
    assert config["parameters"]["tensorrt_llm_model_name"] == {"string_value": "tensorrt_llm"}
    assert config["parameters"][DRAFT_NAME] == {"string_value": "tensorrt_llm_draft"}
    assert config["parameters"][DRAFT_LENGTH] == {"string_value": "4"}
    assert {"specops_deployment", "specops_variant"} <= set(config["parameters"])


async def test_turning_speculation_off_stops_the_drafted_counter_but_not_the_output(
    pod: SimPod, client: triton_http.InferenceServerClient
) -> None:
    pod.advance(5)
    before = await scrape(pod)
    assert value(before, "specops_spec_decode_draft_tokens_total") > 0

    await load_bls(client, **{DRAFT_LENGTH: "0"})
    pod.advance(5)
    after = await scrape(pod)

    assert pod.bls_loads == 1
    assert pod.draft_length == 0
    assert (await bls_config(client))["parameters"][DRAFT_LENGTH]["string_value"] == "0"
    drafted = "specops_spec_decode_draft_tokens_total"
    assert value(after, drafted) == value(before, drafted)
    assert value(after, "specops_spec_decode_steps_total") == value(before, "specops_spec_decode_steps_total")
    assert value(after, "specops_output_tokens_total") > value(before, "specops_output_tokens_total")
    assert value(after, "nv_inference_request_success", model="ensemble") > value(
        before, "nv_inference_request_success", model="ensemble"
    )


async def test_accepted_over_drafted_is_the_acceptance_rate_of_the_offered_alpha(pod: SimPod) -> None:
    pod.set_load(LoadPoint(batch=16, alpha=0.7))

    pod.advance(10)
    samples = await scrape(pod)

    rate = value(samples, "specops_spec_decode_accepted_tokens_total") / value(
        samples, "specops_spec_decode_draft_tokens_total"
    )
    assert rate == pytest.approx(acceptance_rate_from_alpha(0.7, 4), rel=1e-9)
    assert value(samples, "nv_trt_llm_request_metrics", request_type="active") == 16
    assert value(samples, "nv_trt_llm_request_metrics", request_type="max") == 256


async def _mean_tpot_over(pod: SimPod, seconds: float) -> float:
    name = "specops_time_per_output_token_seconds"
    before = await scrape(pod)
    pod.advance(seconds)
    after = await scrape(pod)
    total = value(after, f"{name}_sum") - value(before, f"{name}_sum")
    count = value(after, f"{name}_count") - value(before, f"{name}_count")
    assert count > 0
    return total / count


async def test_time_per_output_token_grows_with_batch_as_the_performance_model_says(
    make_pod: PodFactory,
) -> None:
    pod = await make_pod(load=LoadPoint(batch=4, alpha=0.8))
    small_batch = await _mean_tpot_over(pod, 5)

    pod.set_load(LoadPoint(batch=200, alpha=0.8))
    large_batch = await _mean_tpot_over(pod, 5)

    assert large_batch > 2 * small_batch
    assert small_batch == pytest.approx(perf.per_token_latency(SETUP, 0.8, 4, 4))
    assert large_batch == pytest.approx(perf.per_token_latency(SETUP, 0.8, 200, 4))


async def test_pod_serving_a_profile_streams_at_the_profiles_speed_where_the_roofline_disagrees(
    make_pod: PodFactory,
) -> None:
    profile = load_builtin("llama70b-small-draft-4xh100")
    pod = await make_pod(load=LoadPoint(batch=64, alpha=0.75), serving_profile=profile)
    async with triton_http.InferenceServerClient(url=pod.url) as client:
        speculating = await _mean_tpot_over(pod, 5)
        await load_bls(client, **{DRAFT_LENGTH: "0"})
        plain = await _mean_tpot_over(pod, 5)

    assert speculating == pytest.approx(profile.per_token_ms(0.75, 4, 64) / 1e3)
    assert plain == pytest.approx(profile.plain_ms_at(64) / 1e3)
    # The profile says 4 draft tokens at batch 64 are a slowdown; the roofline prior says a gain.
    assert speculating > 1.2 * plain
    assert perf.per_token_latency(SETUP, 0.75, 64, 4) < perf.per_token_latency(SETUP, 0.75, 64, 0)


async def test_pod_serving_a_profile_refuses_lengths_the_profile_does_not_cover(make_pod: PodFactory) -> None:
    profile = ServingProfile(
        name="short", batches=(1.0, 64.0), plain_ms=(10.0, 20.0), round_ms={1: (12.0, 30.0), 2: (14.0, 40.0)}
    )
    with pytest.raises(ValueError, match="longest length 2"):
        await make_pod(serving_profile=profile, max_draft_len=4, draft_length=2)


async def test_noisy_pod_scatters_latency_around_the_model_and_stays_monotonic(make_pod: PodFactory) -> None:
    pod = await make_pod(load=LoadPoint(batch=32, alpha=0.8), noise_sigma=0.2, batch_noise=1.0, seed=7)

    first = await _mean_tpot_over(pod, 10)
    second = await scrape(pod)
    pod.advance(1)
    third = await scrape(pod)

    assert first == pytest.approx(perf.per_token_latency(SETUP, 0.8, 32, 4), rel=0.25)
    buckets = sorted(
        (float(dict(labels)["le"]), v)
        for (name, labels), v in third.items()
        if name == "specops_time_per_output_token_seconds_bucket"
    )
    assert len({count for _, count in buckets}) > 2, "noise should spread observations over buckets"
    for key, later in third.items():
        if key[0].endswith(("_total", "_count", "_sum", "_bucket")):
            assert later >= second.get(key, 0.0), key


async def test_draft_length_above_the_engine_maximum_is_refused_and_nothing_changes(
    pod: SimPod, client: triton_http.InferenceServerClient
) -> None:
    with pytest.raises(InferenceServerException, match="max_draft_len") as refused:
        await load_bls(client, **{DRAFT_LENGTH: str(pod.max_draft_len + 1)})

    assert refused.value.status() == "400"
    assert pod.draft_length == 4
    assert pod.bls_loads == 0
    assert (await bls_config(client))["parameters"][DRAFT_LENGTH]["string_value"] == "4"


async def test_loading_a_model_missing_from_the_repository_fails_like_triton(
    client: triton_http.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException, match="failed to poll from model repository") as refused:
        await client.load_model("tensorrt_llm_draft_v9")

    assert refused.value.status() == "400"


async def test_switching_drafts_moves_acceptance_to_the_new_draft(make_pod: PodFactory) -> None:
    pod = await make_pod(load=LoadPoint(batch=8, alpha=0.6), engine_alpha_by_draft={"4": 0.9})
    pod.add_repository_model("tensorrt_llm_draft_v4", "4")
    async with triton_http.InferenceServerClient(url=pod.url) as client:
        with pytest.raises(InferenceServerException, match="not loaded"):
            await load_bls(client, **{DRAFT_NAME: "tensorrt_llm_draft_v4"})
        pod.advance(5)

        await client.load_model("tensorrt_llm_draft_v4")
        await load_bls(client, **{DRAFT_NAME: "tensorrt_llm_draft_v4"})
        await client.unload_model("tensorrt_llm_draft")
        pod.advance(5)
        samples = await scrape(pod)

        assert not await client.is_model_ready("tensorrt_llm_draft")

    def rate(draft: str) -> float:
        accepted = value(samples, "specops_spec_decode_accepted_tokens_total", draft=draft)
        return accepted / value(samples, "specops_spec_decode_draft_tokens_total", draft=draft)

    assert pod.active_draft == "tensorrt_llm_draft_v4"
    assert rate("tensorrt_llm_draft") == pytest.approx(acceptance_rate_from_alpha(0.6, 4))
    assert rate("tensorrt_llm_draft_v4") == pytest.approx(acceptance_rate_from_alpha(0.9, 4))


async def test_unloading_the_draft_the_bls_still_names_fails_speculative_requests(
    pod: SimPod, client: triton_http.InferenceServerClient
) -> None:
    await client.unload_model("tensorrt_llm_draft")
    pod.advance(5)

    response = await generate(pod, "hello")
    plain = await generate(pod, "hello", num_draft_tokens=0)

    assert response.status_code == 400
    assert "not loaded" in response.json()["error"]
    assert plain.status_code == 200
    assert value(await scrape(pod), "nv_inference_request_failure", model="ensemble") > 1


async def test_greedy_generation_is_deterministic_and_lossless_with_speculation(pod: SimPod) -> None:
    plain = await generate(pod, "the capital of France", num_draft_tokens=0)
    speculative = await generate(pod, "the capital of France")
    again = await generate(pod, "the capital of France", num_draft_tokens=3)
    other = await generate(pod, "the capital of Spain")

    assert plain.status_code == 200
    assert plain.json()["model_name"] == "ensemble"
    assert len(plain.json()["text_output"].split()) == 24
    assert speculative.json()["text_output"] == plain.json()["text_output"] == again.json()["text_output"]
    assert other.json()["text_output"] != plain.json()["text_output"]


async def test_a_broken_draft_changes_greedy_output_only_when_speculating(make_pod: PodFactory) -> None:
    reference = await make_pod(lossless=True)
    broken = await make_pod(lossless=False)
    prompts = [f"prompt number {i}" for i in range(5)]

    expected = [(await generate(reference, p)).json()["text_output"] for p in prompts]
    without_speculation = [
        (await generate(broken, p, num_draft_tokens=0)).json()["text_output"] for p in prompts
    ]
    with_speculation = [(await generate(broken, p)).json()["text_output"] for p in prompts]

    assert without_speculation == expected
    assert all(got != want for got, want in zip(with_speculation, expected, strict=True))


async def test_generate_refuses_more_draft_tokens_than_the_engine_allows(pod: SimPod) -> None:
    response = await generate(pod, "hello", num_draft_tokens=pod.max_draft_len + 1)

    assert response.status_code == 400
    assert "max_draft_len" in response.json()["error"]


async def test_stopped_pod_refuses_connections_and_restarts_on_the_same_ports(pod: SimPod) -> None:
    http_port, metrics_port = pod.http_port, pod.metrics_port
    pod.advance(2)
    await pod.stop()

    async with triton_http.InferenceServerClient(url=pod.url, conn_timeout=2) as client:
        with pytest.raises(OSError):
            await client.is_server_live()

        await pod.restart(reset=False)
        assert (pod.http_port, pod.metrics_port) == (http_port, metrics_port)
        assert await client.is_server_ready()
    assert value(await scrape(pod), "specops_output_tokens_total") > 0


async def test_restart_with_reset_comes_back_like_a_fresh_container(
    pod: SimPod, client: triton_http.InferenceServerClient
) -> None:
    await load_bls(client, **{DRAFT_LENGTH: "2"})
    pod.advance(2)

    await pod.restart(reset=True)

    assert pod.draft_length == 4
    assert value(await scrape(pod), "specops_output_tokens_total") == 0


async def test_background_ticker_advances_simulated_time_while_serving(make_pod: PodFactory) -> None:
    pod = await make_pod(tick_interval=0.02)

    deadline = asyncio.get_running_loop().time() + 5
    while pod.time < 0.1:
        assert asyncio.get_running_loop().time() < deadline, "ticker did not advance the clock"
        await asyncio.sleep(0.02)

    assert value(await scrape(pod), "specops_output_tokens_total") > 0


async def test_load_schedule_steps_through_a_csv_trace(pod: SimPod) -> None:
    trace = parse_csv_trace("t_seconds,batch,alpha,context_tokens\n0,4,0.8,0\n10,64,0.5,2048\n")
    pod.set_schedule(trace)

    pod.advance(5)
    early = value(await scrape(pod), "nv_trt_llm_request_metrics", request_type="active")
    pod.advance(10)
    late = value(await scrape(pod), "nv_trt_llm_request_metrics", request_type="active")

    assert (early, late) == (4, 64)
    assert trace(12) == LoadPoint(batch=64, alpha=0.5, context_tokens=2048)
    looping = steps([(0, LoadPoint(1, 0.5)), (5, LoadPoint(2, 0.5)), (10, LoadPoint(3, 0.5))], loop=True)
    assert looping(12).batch == 1
    with pytest.raises(ValueError, match="lacks columns"):
        parse_csv_trace("t,batch\n0,1\n")


async def test_vllm_profile_exposes_the_same_quantities_under_vllm_names(make_pod: PodFactory) -> None:
    pod = await make_pod(profile="vllm", load=LoadPoint(batch=16, alpha=0.7))

    pod.advance(20)
    samples = await scrape(pod)

    assert value(samples, "vllm:num_requests_running") == 16
    accepted = value(samples, "vllm:spec_decode_num_accepted_tokens_total")
    assert accepted / value(samples, "vllm:spec_decode_num_draft_tokens_total") == pytest.approx(
        acceptance_rate_from_alpha(0.7, 4)
    )
    mean_accepted_length = 1 + accepted / value(samples, "vllm:spec_decode_num_drafts_total")
    assert mean_accepted_length == pytest.approx(perf.expected_tokens(0.7, 4))
    assert value(samples, "vllm:e2e_request_latency_seconds_count") == value(
        samples, "vllm:request_success_total"
    )
    tokens = value(samples, "vllm:generation_tokens_total")
    assert tokens - 1 <= value(samples, "vllm:inter_token_latency_seconds_count") <= tokens
