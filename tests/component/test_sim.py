"""Simulated engines fed the exact command, args and files of the rendering contract.

Each engine must start and answer health only after restart_s, refuse malformed configs with
a clear message, draft the K its own schedule gives at the batch it carries, export its native
metric names, and answer completions / generate with deterministic greedy text.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from typing import Any

import httpx
import pytest

from specops.domain.profile import ServingProfile
from specops_local.sim import EngineConfigError, LoadPoint, SimEngine, greedy_text, launch, parse

MODEL = "llama"
RESTART_S = 0.4
PROFILE = ServingProfile.from_dict(
    {
        "name": "test",
        "batches": [1, 64],
        "plain_ms": [10.0, 20.0],
        "k0_ms": [11.0, 23.0],
        "round_ms": {"1": [14.0, 30.0], "2": [16.0, 36.0], "4": [20.0, 50.0]},
        "alpha": 0.8,
        "restart_s": 120,
    }
)

# ----------------------------------------------------------------------------- the contract

VLLM_CMD = ["vllm", "serve"]
SGLANG_CMD = ["python3", "-m", "sglang.launch_server"]
TRTLLM_CMD = ["trtllm-serve"]
TRITON_CMD = ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
TRTLLM_CONFIG = "/etc/specops/engine/config.yaml"
SGLANG_ADAPTIVE = "/etc/specops/engine/adaptive.json"
TRITON_REPO = "/models/llmapi_repo"
TRITON_PBTXT = 'name: "tensorrt_llm"\nbackend: "python"\nmax_batch_size: 0\ninstance_group [{ count: 1 kind: KIND_CPU }]\n'


def vllm_args(spec: Mapping[str, Any] | None = None) -> list[str]:
    args = ["/models/target", "--served-model-name", MODEL, "--host", "0.0.0.0", "--port", "8000"]
    args += ["--tensor-parallel-size", "2"]
    if spec is not None:
        args += ["--speculative-config", json.dumps(spec)]
    return args


def sglang_args(algorithm: str | None = "EAGLE3", k: int = 4, adaptive: bool = False) -> list[str]:
    args = ["--model-path", "/models/target", "--served-model-name", MODEL, "--host", "0.0.0.0"]
    args += ["--port", "30000", "--tp-size", "2", "--enable-metrics"]
    if algorithm is None:
        return args
    args += ["--speculative-algorithm", algorithm]
    if algorithm in ("STANDALONE", "EAGLE3"):
        args += ["--speculative-draft-model-path", "/models/draft"]
    args += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
    args += ["--speculative-num-draft-tokens", str(k + 1)]
    if adaptive:
        args += ["--speculative-adaptive", "--speculative-adaptive-config", SGLANG_ADAPTIVE]
    return args


def trtllm_args() -> list[str]:
    return [
        "/models/target",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--tp_size",
        "2",
        "--config",
        TRTLLM_CONFIG,
    ]


def trtllm_yaml(spec: Mapping[str, Any] | None = None, **top: Any) -> str:
    data: dict[str, Any] = {"return_perf_metrics": True, "enable_iter_perf_stats": True, **top}
    if spec is not None:
        data["speculative_config"] = dict(spec)
    return json.dumps(data)  # JSON is YAML


EAGLE3 = {
    "decoding_type": "Eagle3",
    "max_draft_len": 4,
    "speculative_model": "/models/draft",
    "draft_len_schedule": {4: 4, 16: 2, 64: 1},
}
TRITON_ARGS = [
    f"--model-repository={TRITON_REPO}",
    "--http-port=8000",
    "--grpc-port=8001",
    "--metrics-port=8002",
    "--disable-auto-complete-config",
    "--backend-config=python,shm-region-prefix-name=prefix0_",
]


def triton_files(spec: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, str]:
    model_yaml: dict[str, Any] = {
        "model": "/models/target",
        "backend": "pytorch",
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "triton_config": {"max_batch_size": 0, "decoupled": False},
        **extra,
    }
    if spec is not None:
        model_yaml["speculative_config"] = dict(spec)
    return {
        f"{TRITON_REPO}/tensorrt_llm/config.pbtxt": TRITON_PBTXT,
        f"{TRITON_REPO}/tensorrt_llm/1/model.py": "# specops's LLM API model\n",
        f"{TRITON_REPO}/tensorrt_llm/1/model.yaml": json.dumps(model_yaml),
    }


def adaptive(slots: Mapping[str, int], **top: Any) -> dict[str, str]:
    data: dict[str, Any] = {"strategy": "ema", **top}
    data.update({edge: {"candidate_steps": [k]} for edge, k in slots.items()})
    return {SGLANG_ADAPTIVE: json.dumps(data)}


CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "vllm": (
        VLLM_CMD
        + vllm_args(
            {
                "method": "eagle3",
                "model": "/models/draft",
                "num_speculative_tokens": 4,
                "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 16, 2], [17, 64, 1], [65, 1024, 0]],
            }
        ),
        {},
    ),
    "sglang": (
        SGLANG_CMD + sglang_args("EAGLE3", 4, adaptive=True),
        adaptive({"1": 4, "5": 2, "17": 1, "65": 0}),
    ),
    "trtllm-serve": (TRTLLM_CMD + trtllm_args(), {TRTLLM_CONFIG: trtllm_yaml(EAGLE3)}),
    "triton": (TRITON_CMD + TRITON_ARGS, triton_files(EAGLE3)),
}
"""One speculating pod per backend whose schedule is 1-4: 4, 5-16: 2, 17-64: 1, above: 0."""


def engine(backend: str, **options: Any) -> SimEngine:
    argv, files = CASES[backend]
    options.setdefault("restart_s", RESTART_S)
    options.setdefault("tick_interval", None)
    options.setdefault("serving_profile", PROFILE)
    return launch(f"{backend}-0", argv, files=files, **options)


# ----------------------------------------------------------------------------- helpers

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[str, float]:
    """Series name -> the sum of its samples (labels dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a Prometheus text sample: {line!r}"
        name, labels, value = match.groups()
        if 'le="' in (labels or "") and name.endswith("_bucket"):
            continue
        out[name] = out.get(name, 0.0) + float(value)
    return out


async def scrape(e: SimEngine) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        response = await client.get(e.metrics_url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse_metrics(response.text)


HEALTH = {
    "vllm": "/health",
    "sglang": "/health",
    "trtllm-serve": "/health",
    "triton": "/v2/models/tensorrt_llm/ready",
}


async def health(e: SimEngine, client: httpx.AsyncClient) -> int | None:
    """The health endpoint's status, None while connections are refused."""
    try:
        return (await client.get(e.url + HEALTH[e.backend])).status_code
    except httpx.ConnectError:
        return None


async def generate(e: SimEngine, prompt: str, max_tokens: int) -> str:
    async with httpx.AsyncClient() as client:
        if e.backend == "triton":
            body = {
                "text_input": prompt,
                "sampling_param_max_tokens": max_tokens,
                "sampling_param_temperature": 0,
            }
            response = await client.post(e.url + "/v2/models/tensorrt_llm/generate", json=body)
            assert response.status_code == 200, response.text
            return str(response.json()["text_output"])
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        response = await client.post(e.url + "/v1/completions", json=body)
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["text"])


# ----------------------------------------------------------------------------- start-up and health


@pytest.mark.parametrize("backend", list(CASES))
async def test_health_answers_only_after_restart_s(backend: str) -> None:
    e = engine(backend)
    async with httpx.AsyncClient(timeout=2.0) as client:
        await e.start()
        try:
            early = await health(e, client)
            assert not e.ready
            if backend == "trtllm-serve":
                assert early == 503  # listens at once and answers "starting"
                response = await client.get(e.url + "/health")
                assert response.headers["x-trtllm-server-state"] == "starting"
            else:
                assert early is None  # connections refused while loading
            loop = asyncio.get_running_loop()
            started = loop.time()
            async with asyncio.timeout(5):
                await e.wait_ready()
            assert loop.time() - started >= RESTART_S * 0.8
            assert await health(e, client) == 200
            if backend == "triton":
                for path in ("/v2/health/live", "/v2/health/ready"):
                    assert (await client.get(e.url + path)).status_code == 200
        finally:
            await e.stop()
    async with httpx.AsyncClient() as client:
        assert await health(e, client) is None  # stopped: nothing listens


async def test_sglang_answers_503_during_warm_up() -> None:
    e = engine("sglang", restart_s=1.0)
    await e.start()
    try:
        async with httpx.AsyncClient() as client:
            statuses = set()
            async with asyncio.timeout(5):
                while not e.ready:
                    statuses.add(await health(e, client))
                    await asyncio.sleep(0.05)
            assert {None, 503} <= statuses
            assert await health(e, client) == 200
    finally:
        await e.stop()


def test_restart_s_comes_from_the_profile_else_120() -> None:
    assert engine("vllm", restart_s=None).restart_s == 120
    fast = ServingProfile.from_dict({**PROFILE.to_dict(), "restart_s": 3})
    assert engine("vllm", restart_s=None, serving_profile=fast).restart_s == 3
    assert engine("vllm", restart_s=None, serving_profile=None).restart_s == 120


# ----------------------------------------------------------------------------- strict parsing


def refused(argv: list[str], files: Mapping[str, str] | None = None, match: str = "") -> str:
    with pytest.raises(EngineConfigError, match=match) as caught:
        parse(argv, files or {})
    return str(caught.value)


def trt_spec(**changes: Any) -> dict[str, Any]:
    spec = {**EAGLE3, **changes}
    return {k: v for k, v in spec.items() if v is not None}


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (
            trt_spec(draft_len_schedule={4: 3, 16: 2}),
            r"smallest batch size \(4\) must map to max_draft_len \(4\)",
        ),
        (trt_spec(draft_len_schedule={4: 4, 16: 5}), r"= 5 exceeds max_draft_len \(4\)"),
        (trt_spec(draft_len_schedule={0: 4, 16: 2}), r"keys must be >= 1"),
        (trt_spec(draft_len_schedule={4: 4, 16: -1}), r"must be >= 0"),
        (trt_spec(draft_len_schedule=[[4, 4]]), r"must be a mapping"),
        (trt_spec(num_draft_tokens=4), r"unknown field\(s\) num_draft_tokens"),
        (trt_spec(decoding_type="DraftTarget"), r"decoding_type must be one of"),
        (trt_spec(speculative_model=None), r"needs speculative_model"),
        (trt_spec(decoding_type="MTP"), r"takes no speculative_model"),
        (trt_spec(max_concurrency=8), r"cannot be used together"),
        (trt_spec(max_draft_len=None), r"max_draft_len is required"),
    ],
)
def test_tensorrt_llm_refuses_malformed_speculative_config(spec: dict[str, Any], match: str) -> None:
    refused(TRTLLM_CMD + trtllm_args(), {TRTLLM_CONFIG: trtllm_yaml(spec)}, match)
    refused(TRITON_CMD + TRITON_ARGS, triton_files(spec), match)  # the same LLM API, in model.yaml


def test_trtllm_serve_refuses_unknown_flags_keys_and_missing_files() -> None:
    refused(
        [*TRTLLM_CMD, *trtllm_args(), "--num_draft_tokens", "4"],
        {TRTLLM_CONFIG: trtllm_yaml()},
        "unrecognized",
    )
    refused(
        TRTLLM_CMD + trtllm_args(),
        {TRTLLM_CONFIG: trtllm_yaml(bls_model="x")},
        r"unknown field\(s\) bls_model",
    )
    refused(TRTLLM_CMD + trtllm_args(), {}, r"config\.yaml does not exist")
    refused(TRTLLM_CMD + trtllm_args(), {TRTLLM_CONFIG: "speculative_config: [unclosed"}, "not valid YAML")
    refused([*TRTLLM_CMD, *trtllm_args(), "--backend", "tensorrt"], {TRTLLM_CONFIG: trtllm_yaml()}, "removed")


def test_triton_refuses_a_broken_repository() -> None:
    files = triton_files(EAGLE3)
    without_yaml = {k: v for k, v in files.items() if not k.endswith("model.yaml")}
    refused(TRITON_CMD + TRITON_ARGS, without_yaml, "model.yaml does not exist")
    refused(TRITON_CMD + TRITON_ARGS, {}, "'tensorrt_llm' is not in the repository")
    refused(TRITON_CMD + TRITON_ARGS, triton_files(EAGLE3, backend="tensorrt"), "only pytorch")
    refused(
        TRITON_CMD + TRITON_ARGS, triton_files(None, triton_config={"num_draft_tokens": 4}), "unknown field"
    )
    refused([*TRITON_CMD, *TRITON_ARGS, "--model-control=explicit"], files, "unrecognized argument")
    refused(["mpirun", "-n", "2", "tritonserver", *TRITON_ARGS], files, r"-n 1")


def test_triton_reads_model_yaml_from_llm_config_path() -> None:
    files = triton_files(None)
    files[f"{TRITON_REPO}/tensorrt_llm/1/other.yaml"] = files[
        f"{TRITON_REPO}/tensorrt_llm/1/model.yaml"
    ].replace('"tensor_parallel_size": 2', '"tensor_parallel_size": 4')
    config = parse(TRITON_CMD + TRITON_ARGS, files, {"LLM_CONFIG_PATH": "other.yaml"})
    assert config.tensor_parallel == 4 and config.spec is None


def vllm_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "method": "eagle3",
        "model": "/models/draft",
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 4, 4], [5, 16, 2]],
    }
    spec.update(changes)
    return {k: v for k, v in spec.items() if v is not None}


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (vllm_spec(num_speculative_tokens_per_batch_size=[[1, 8, 4], [8, 16, 2]]), r"overlap"),
        (vllm_spec(num_speculative_tokens_per_batch_size=[[2, 8, 4]]), r"first range must start at 1"),
        (
            vllm_spec(num_speculative_tokens_per_batch_size=[[1, 8, 5]]),
            r"K=5 exceeds num_speculative_tokens \(4\)",
        ),
        (vllm_spec(num_speculative_tokens_per_batch_size={"1-16": 3}), r"not a dict"),
        (vllm_spec(num_speculative_tokens_per_batch_size=[[1, 8]]), r"must be \[start, end, K\]"),
        (vllm_spec(num_draft_tokens=4), r"unknown field\(s\) num_draft_tokens"),
        (vllm_spec(method="medusa"), r"method must be one of"),
        (vllm_spec(model=None), r"needs a draft model"),
        (vllm_spec(method="ngram", prompt_lookup_max=4), r"takes no draft model"),
        (vllm_spec(prompt_lookup_max=4), r"only apply to method ngram"),
        (vllm_spec(num_speculative_tokens=None), r"num_speculative_tokens is required"),
    ],
)
def test_vllm_refuses_malformed_speculative_config(spec: dict[str, Any], match: str) -> None:
    refused(VLLM_CMD + vllm_args(spec), match=match)


def test_vllm_refuses_unknown_flags_and_bad_json() -> None:
    refused([*VLLM_CMD, *vllm_args(), "--num-speculative-tokens", "4"], match="unrecognized argument")
    refused([*VLLM_CMD, *vllm_args(), "--speculative-config", "{method: eagle3}"], match="not JSON")
    refused([*VLLM_CMD, "--port", "8000"], match="missing model_tag")
    refused([*VLLM_CMD, *vllm_args(), "--port", "9000"], match="given twice")


def test_sglang_refuses_malformed_flags_and_adaptive_config() -> None:
    spec_args = sglang_args("EAGLE3", 4, adaptive=True)
    good = adaptive({"1": 4, "8": 2})
    parse(SGLANG_CMD + spec_args, good)
    refused(
        SGLANG_CMD + spec_args,
        {SGLANG_ADAPTIVE: json.dumps({"strategy": "ema"})},
        "integer batch-size slot key",
    )
    refused(SGLANG_CMD + spec_args, {SGLANG_ADAPTIVE: json.dumps({"candidate_steps": [1, 3]})}, "flat form")
    refused(
        SGLANG_CMD + spec_args,
        {SGLANG_ADAPTIVE: json.dumps({"1": {"steps": [1]}})},
        r"unknown field\(s\) steps",
    )
    refused(SGLANG_CMD + spec_args, {SGLANG_ADAPTIVE: json.dumps({"1": {"candidate_steps": [5]}})}, "exceeds")
    refused(
        SGLANG_CMD + spec_args,
        {SGLANG_ADAPTIVE: json.dumps({"bogus": 1, "1": {"candidate_steps": [1]}})},
        "bogus",
    )
    refused(SGLANG_CMD + spec_args, {}, "adaptive.json does not exist")
    for algorithm in ("STANDALONE", "NGRAM"):
        refused(
            SGLANG_CMD + sglang_args(algorithm, 4, adaptive=True),
            good,
            f"EAGLE and EAGLE3 only, not {algorithm}",
        )
    partial = [a for a in sglang_args("EAGLE3", 4) if a not in ("--speculative-eagle-topk",)]
    partial.remove("1")  # the topk value
    refused(SGLANG_CMD + partial, match="set all of")
    refused(
        SGLANG_CMD + sglang_args(None) + ["--speculative-num-steps", "3"],
        match="need --speculative-algorithm",
    )
    refused([*SGLANG_CMD, *sglang_args(None), "--num-draft-tokens", "3"], match="unrecognized argument")
    refused(SGLANG_CMD + sglang_args("STANDALONE", 4)[:-8], match="needs --speculative-draft-model-path")


def test_an_unknown_command_is_not_an_engine() -> None:
    refused(["python3", "-m", "http.server"], match="not a serving engine command")
    refused(["tritonserver_wrapper.sh"], match="not a serving engine command")


# ----------------------------------------------------------------------------- the schedule per iteration

BATCH_TO_K = {1: 4, 4: 4, 5: 2, 16: 2, 17: 1, 64: 1, 65: 0, 300: 0}


@pytest.mark.parametrize("backend", list(CASES))
def test_each_engine_reads_the_contract_schedule_its_own_way(backend: str) -> None:
    e = engine(backend)
    assert {b: e.k_at(b) for b in BATCH_TO_K} == BATCH_TO_K


def test_schedule_semantics_differ_per_engine() -> None:
    # TensorRT-LLM: keys are upper edges, K=0 above the largest.
    trt = parse(
        TRTLLM_CMD + trtllm_args(), {TRTLLM_CONFIG: trtllm_yaml(trt_spec(draft_len_schedule={4: 4, 8: 2}))}
    )
    assert trt.spec is not None
    assert [trt.spec.k_at(b) for b in (1, 4, 5, 8, 9, 100)] == [4, 4, 2, 2, 0, 0]
    # vLLM: inclusive ranges; a gap keeps the previous K, above the last range the last K carries on.
    v = parse(VLLM_CMD + vllm_args(vllm_spec(num_speculative_tokens_per_batch_size=[[1, 4, 4], [9, 16, 2]])))
    assert v.spec is not None
    assert [v.spec.k_at(b) for b in (1, 4, 5, 8, 9, 16, 17, 1000)] == [4, 4, 4, 4, 2, 2, 2, 2]
    # SGLang: slot keys are lower edges, the largest key <= batch applies.
    s = parse(SGLANG_CMD + sglang_args("EAGLE3", 4, adaptive=True), adaptive({"1": 4, "8": 2, "32": 0}))
    assert s.spec is not None
    assert [s.spec.k_at(b) for b in (1, 7, 8, 31, 32, 500)] == [4, 4, 2, 2, 0, 0]
    # Without a schedule every engine drafts its maximum at every batch.
    plain_schedule = parse(VLLM_CMD + vllm_args(vllm_spec(num_speculative_tokens_per_batch_size=None)))
    assert plain_schedule.spec is not None and plain_schedule.spec.k_at(500) == 4


@pytest.mark.parametrize("backend", list(CASES))
async def test_k_follows_the_batch_carried_and_step_time_follows_the_profile(backend: str) -> None:
    e = engine(backend, restart_s=0.0, load=LoadPoint(batch=3, alpha=0.8))
    async with e:
        await e.wait_ready()
        for batch, k in ((3, 4), (10, 2), (40, 1), (100, 0)):
            e.set_load(LoadPoint(batch=batch, alpha=0.8))
            e.advance(1.0)
            assert (e.batch, e.k) == (batch, k)
            expected_ms = PROFILE.k0_ms_at(batch) if k == 0 else PROFILE.round_ms_at(k, batch)
            assert e.step_seconds(batch, k) * 1e3 == pytest.approx(expected_ms)
        assert set(e.seconds_at_k) == {4, 2, 1, 0}


async def test_a_plain_engine_steps_at_plain_ms_and_a_speculating_one_at_k0_ms() -> None:
    plain = launch("plain", VLLM_CMD + vllm_args(), serving_profile=PROFILE, restart_s=0, tick_interval=None)
    spec = engine("vllm")
    assert plain.step_seconds(100, 0) * 1e3 == pytest.approx(PROFILE.plain_ms_at(100))
    assert spec.step_seconds(100, 0) * 1e3 == pytest.approx(PROFILE.k0_ms_at(100))
    assert PROFILE.k0_ms_at(100) > PROFILE.plain_ms_at(100)
    default_k0 = ServingProfile.from_dict({k: v for k, v in PROFILE.to_dict().items() if k != "k0_ms"})
    assert default_k0.k0_ms_at(30) == default_k0.plain_ms_at(30)


# ----------------------------------------------------------------------------- metrics

NATIVE = {
    "vllm": (
        "vllm:num_requests_running",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ),
    "sglang": (
        "sglang:num_running_reqs",
        "sglang:spec_verify_calls_total",
        "sglang:spec_accept_length",
        "sglang:spec_accept_rate",
        "sglang:spec_num_steps",
        "sglang:generation_tokens_total",
        "sglang:num_requests_total",
        "sglang:inter_token_latency_seconds_count",
        "sglang:e2e_request_latency_seconds_count",
    ),
    "trtllm-serve": (
        "trtllm_num_requests_running",
        "trtllm_spec_decode_num_draft_tokens_total",
        "trtllm_spec_decode_num_accepted_tokens_total",
        "trtllm_generation_tokens_total",
        "trtllm_time_per_output_token_seconds_count",
        "trtllm_e2e_request_latency_seconds_count",
        "trtllm_speculative_config_info",
    ),
    "triton": (
        "specops_num_requests_running",
        "specops_spec_decode_draft_tokens_total",
        "specops_spec_decode_accepted_tokens_total",
        "specops_generation_tokens_total",
        "specops_request_success_total",
        "specops_time_per_output_token_seconds_count",
        "nv_inference_request_success",
    ),
}
DRAFTED = {
    "vllm": "vllm:spec_decode_num_draft_tokens_total",
    "sglang": "sglang:spec_verify_calls_total",
    "trtllm-serve": "trtllm_spec_decode_num_draft_tokens_total",
    "triton": "specops_spec_decode_draft_tokens_total",
}
RUNNING = {
    "vllm": "vllm:num_requests_running",
    "sglang": "sglang:num_running_reqs",
    "trtllm-serve": "trtllm_num_requests_running",
    "triton": "specops_num_requests_running",
}
METRICS_PATH = {
    "vllm": "/metrics",
    "sglang": "/metrics",
    "trtllm-serve": "/prometheus/metrics",
    "triton": "/metrics",
}


@pytest.mark.parametrize("backend", list(CASES))
async def test_native_metrics_move_with_the_schedule(backend: str) -> None:
    e = engine(backend, restart_s=0.0, load=LoadPoint(batch=8, alpha=0.8, mean_output_tokens=50))
    async with e:
        await e.wait_ready()
        assert e.metrics_url.endswith(METRICS_PATH[backend])
        assert (e.metrics_port != e.http_port) == (backend == "triton")
        e.advance(5.0)
        first = await scrape(e)
        for name in NATIVE[backend]:
            assert name in first, f"{name} missing from {backend}'s metrics"
        assert first[RUNNING[backend]] == 8
        assert first[DRAFTED[backend]] > 0
        # K=0 above the schedule: nothing is drafted, tokens still flow.
        e.set_load(LoadPoint(batch=100, alpha=0.8, mean_output_tokens=50))
        e.advance(5.0)
        second = await scrape(e)
        tokens = next(n for n in NATIVE[backend] if "generation_tokens" in n)
        assert second[tokens] > first[tokens]
        if backend != "sglang":  # SGLang counts verify calls at K=0 too
            assert second[DRAFTED[backend]] == pytest.approx(first[DRAFTED[backend]])
        else:
            assert second["sglang:spec_num_steps"] == 0


@pytest.mark.parametrize("backend", list(CASES))
async def test_acceptance_in_metrics_matches_the_draft_alpha(backend: str) -> None:
    e = engine(backend, restart_s=0.0, draft_alpha=0.6, load=LoadPoint(batch=2, alpha=0.9))
    async with e:
        await e.wait_ready()
        e.advance(10.0)
        assert e.k == 4
        t = e.totals
        expected = (1 - 0.6**5) / (1 - 0.6)  # E(alpha, 4): tokens per round
        assert 1 + t.accepted_tokens / t.spec_steps == pytest.approx(expected)
        assert t.draft_tokens / t.spec_steps == pytest.approx(4)


async def test_trtllm_serve_mounts_prometheus_only_with_return_perf_metrics() -> None:
    files = {TRTLLM_CONFIG: json.dumps({"speculative_config": EAGLE3})}
    e = launch("t", TRTLLM_CMD + trtllm_args(), files=files, restart_s=0, tick_interval=None)
    async with e, httpx.AsyncClient() as client:
        await e.wait_ready()
        assert (await client.get(e.metrics_url)).status_code == 404


async def test_a_plain_vllm_engine_exports_no_speculation_counters() -> None:
    e = launch(
        "p", VLLM_CMD + vllm_args(), restart_s=0, tick_interval=None, load=LoadPoint(batch=4, alpha=0.8)
    )
    async with e:
        await e.wait_ready()
        e.advance(1.0)
        samples = await scrape(e)
        assert "vllm:spec_decode_num_draft_tokens_total" not in samples
        assert samples["vllm:generation_tokens_total"] > 0
        assert e.k == 0


# ----------------------------------------------------------------------------- generation


@pytest.mark.parametrize("backend", list(CASES))
async def test_generation_is_deterministic_greedy_text(backend: str) -> None:
    e = engine(backend, restart_s=0.0)
    async with e:
        await e.wait_ready()
        text = await generate(e, "The capital of France is", 12)
        assert text == greedy_text("The capital of France is", 12)
        assert text == await generate(e, "The capital of France is", 12)


@pytest.mark.parametrize("backend", list(CASES))
async def test_a_lossy_draft_diverges_from_the_plain_target(backend: str) -> None:
    e = engine(backend, restart_s=0.0, lossless=False, draft_identity="draft:v9")
    async with e:
        await e.wait_ready()
        prompts = [f"prompt {i}" for i in range(5)]
        outputs = [await generate(e, p, 24) for p in prompts]
    diverged = [o != greedy_text(p, 24) for o, p in zip(outputs, prompts, strict=True)]
    assert all(diverged)  # each diverges at some token (possibly the first)


async def test_sglang_native_generate() -> None:
    e = engine("sglang", restart_s=0.0)
    async with e, httpx.AsyncClient() as client:
        await e.wait_ready()
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
        response = await client.post(e.url + "/generate", json=body)
        assert response.status_code == 200
        assert response.json()["text"] == greedy_text("hello", 6)
        assert response.json()["meta_info"]["completion_tokens"] == 6


async def test_requests_before_ready_are_refused() -> None:
    e = engine("trtllm-serve", restart_s=5.0)
    async with e, httpx.AsyncClient() as client:
        response = await client.post(e.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert response.status_code == 503


async def test_vllm_refuses_another_model_name() -> None:
    e = engine("vllm", restart_s=0.0)
    async with e, httpx.AsyncClient() as client:
        await e.wait_ready()
        response = await client.post(e.url + "/v1/completions", json={"model": "other", "prompt": "x"})
        assert response.status_code == 404


def test_profile_keys_k0_ms_and_restart_s_are_validated() -> None:
    from specops.domain.profile import ProfileError

    base = PROFILE.to_dict()
    assert ServingProfile.from_dict(base).to_dict() == base
    with pytest.raises(ProfileError, match=r"'k0_ms' has 1 values for 2 batches"):
        ServingProfile.from_dict({**base, "k0_ms": [1.0]})
    with pytest.raises(ProfileError, match="'restart_s'"):
        ServingProfile.from_dict({**base, "restart_s": -1})
    with pytest.raises(ProfileError, match="'restart_s'"):
        ServingProfile.from_dict({**base, "restart_s": "soon"})
