"""EngineHttpClient (adapters/engine_client.py) against a small engine on 127.0.0.1.

The fake engine speaks both API shapes: OpenAI completions (trtllm-serve, vLLM, SGLang) and
KServe v2 generate for Triton's ``tensorrt_llm`` model. It records each request body, answers
with the greedy text of the prompt, and can be told to fail, hang or be not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from specops.adapters.engine_client import EngineHttpClient
from specops.ports import EngineClient, GenerateOutput

OPENAI = ["trtllm-serve", "vllm", "sglang"]


@dataclass
class FakeEngine:
    ready: bool = True
    status: int = 200
    body: Any = None  # answer this instead of a completion
    raw: bytes | None = None  # answer these bytes instead
    delay_s: float = 0.0
    hold: asyncio.Event | None = None  # answer only once this is set
    requests: list[tuple[str, str, Any]] = field(default_factory=list)

    @staticmethod
    def complete(prompt: str, max_tokens: int) -> str:
        return " ".join(f"{prompt.split()[-1]}{i}" for i in range(max_tokens))

    async def _wait(self) -> None:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.hold is not None:
            await self.hold.wait()

    async def _answer(self, request: web.Request, completion: Any) -> web.Response:
        await self._wait()
        if self.raw is not None:
            return web.Response(status=self.status, body=self.raw)
        return web.json_response(self.body if self.body is not None else completion, status=self.status)

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((request.method, request.path, body))
        text = self.complete(body["prompt"], body["max_tokens"])
        return await self._answer(
            request, {"object": "text_completion", "choices": [{"index": 0, "text": text}]}
        )

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append((request.method, request.path, body))
        text = self.complete(body["text_input"], body["sampling_param_max_tokens"])
        completion = {"model_name": "tensorrt_llm", "model_version": "1", "text_output": text}
        return await self._answer(request, completion)

    async def health(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path, None))
        await self._wait()
        return web.Response(status=200 if self.ready else 503)


@contextlib.asynccontextmanager
async def serving(engine: FakeEngine) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/completions", engine.completions)
    app.router.add_post("/v2/models/tensorrt_llm/generate", engine.generate)
    app.router.add_get("/health", engine.health)
    app.router.add_get("/v2/models/tensorrt_llm/ready", engine.health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/"
    finally:
        await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[EngineHttpClient]:
    engine_client = EngineHttpClient()
    yield engine_client
    await engine_client.close()


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_adapter_implements_the_port() -> None:
    port: EngineClient = EngineHttpClient()
    assert port is not None


@pytest.mark.parametrize("backend", OPENAI)
async def test_openai_engines_get_a_greedy_completion_request(client: EngineHttpClient, backend: str) -> None:
    engine = FakeEngine()
    async with serving(engine) as url:
        result = await client.generate(url, backend, "/models/target", "Count: one two", 3, timeout_s=5)
    assert result == GenerateOutput(ok=True, text="two0 two1 two2", status=200, seconds=result.seconds)
    assert result.seconds > 0
    assert engine.requests == [
        (
            "POST",
            "/v1/completions",
            {"model": "/models/target", "prompt": "Count: one two", "max_tokens": 3, "temperature": 0},
        )
    ]


async def test_triton_gets_a_greedy_generate_request(client: EngineHttpClient) -> None:
    engine = FakeEngine()
    async with serving(engine) as url:
        result = await client.generate(url, "triton", "ignored", "Count: one two", 2, timeout_s=5)
    assert result.ok and result.text == "two0 two1"
    assert engine.requests == [
        (
            "POST",
            "/v2/models/tensorrt_llm/generate",
            {"text_input": "Count: one two", "sampling_param_max_tokens": 2, "sampling_param_temperature": 0},
        )
    ]


@pytest.mark.parametrize(
    ("backend", "path"),
    [("triton", "/v2/models/tensorrt_llm/ready"), *[(b, "/health") for b in OPENAI]],
)
async def test_health_reads_each_engine_s_own_endpoint(
    client: EngineHttpClient, backend: str, path: str
) -> None:
    engine = FakeEngine()
    async with serving(engine) as url:
        assert await client.healthy(url, backend)
        engine.ready = False
        assert not await client.healthy(url, backend)
    assert [request[1] for request in engine.requests] == [path, path]


async def test_an_engine_that_refuses_connections_is_an_error_not_an_exception(
    client: EngineHttpClient,
) -> None:
    url = f"http://127.0.0.1:{_unused_port()}"
    result = await client.generate(url, "vllm", "m", "hi", 4, timeout_s=2)
    assert not result.ok and result.status is None
    assert result.error.startswith(f"POST {url}/v1/completions: ")
    assert not await client.healthy(url, "vllm")
    assert not await client.healthy(url, "triton")


@pytest.mark.parametrize(
    ("backend", "body", "detail"),
    [
        (
            "vllm",
            {"object": "error", "message": "max_tokens is too large", "code": 400},
            "max_tokens is too large",
        ),
        ("trtllm-serve", {"error": {"message": "model not found", "type": "NotFound"}}, "model not found"),
        ("triton", {"error": "Error generating request: CUDA out of memory"}, "CUDA out of memory"),
    ],
)
async def test_an_error_answer_carries_its_status_and_message(
    client: EngineHttpClient, backend: str, body: Any, detail: str
) -> None:
    engine = FakeEngine(status=400, body=body)
    async with serving(engine) as url:
        result = await client.generate(url, backend, "m", "hi", 4, timeout_s=5)
    assert not result.ok and result.status == 400
    assert "HTTP 400" in result.error and detail in result.error


async def test_a_long_non_json_error_body_is_cut_short(client: EngineHttpClient) -> None:
    engine = FakeEngine(status=503, raw=b"x" * 10_000)
    async with serving(engine) as url:
        result = await client.generate(url, "sglang", "m", "hi", 4, timeout_s=5)
    assert not result.ok and result.status == 503
    assert len(result.error) < 500


@pytest.mark.parametrize(
    ("backend", "raw"),
    [
        ("vllm", b"not json"),
        ("vllm", b'{"choices": []}'),
        ("sglang", b"[1, 2]"),
        ("triton", b'{"model_name": "tensorrt_llm"}'),
    ],
)
async def test_an_answer_without_text_is_an_error(client: EngineHttpClient, backend: str, raw: bytes) -> None:
    engine = FakeEngine(raw=raw)
    async with serving(engine) as url:
        result = await client.generate(url, backend, "m", "hi", 4, timeout_s=5)
    assert not result.ok and result.status == 200
    assert "unreadable answer" in result.error


async def test_a_triton_output_of_several_elements_is_joined(client: EngineHttpClient) -> None:
    engine = FakeEngine(body={"text_output": ["Paris", " is"]})
    async with serving(engine) as url:
        result = await client.generate(url, "triton", "m", "hi", 4, timeout_s=5)
    assert result.ok and result.text == "Paris is"


async def test_a_hanging_engine_times_out_within_the_bound(client: EngineHttpClient) -> None:
    hold = asyncio.Event()
    engine = FakeEngine(hold=hold)
    async with serving(engine) as url:
        started = time.monotonic()
        result = await client.generate(url, "vllm", "m", "hi", 4, timeout_s=0.2)
        assert not await client.healthy(url, "vllm", timeout_s=0.2)
        elapsed = time.monotonic() - started
        hold.set()
    assert not result.ok and "timed out after 0.2 s" in result.error
    assert elapsed < 2.0


async def test_unknown_backends_and_bad_arguments_are_errors(client: EngineHttpClient) -> None:
    unknown = await client.generate("http://127.0.0.1:1", "tgi", "m", "hi", 4, timeout_s=1)
    assert not unknown.ok and "unknown backend 'tgi'" in unknown.error
    no_tokens = await client.generate("http://127.0.0.1:1", "vllm", "m", "hi", 0, timeout_s=1)
    assert not no_tokens.ok and "max_tokens" in no_tokens.error
    bad_url = await client.generate("not a url", "vllm", "m", "hi", 4, timeout_s=1)
    assert not bad_url.ok and bad_url.error
    assert not await client.healthy("http://127.0.0.1:1", "tgi")
    assert not await client.healthy("not a url", "triton")


async def test_concurrent_calls_share_one_session_and_close_releases_it() -> None:
    engine = FakeEngine(delay_s=0.1)
    engine_client = EngineHttpClient()
    async with serving(engine) as url:
        started = time.monotonic()
        results = await asyncio.gather(
            *(engine_client.generate(url, "sglang", "m", f"prompt {i}", 2, timeout_s=5) for i in range(8))
        )
        elapsed = time.monotonic() - started
        assert [r.text for r in results] == [f"{i}0 {i}1" for i in range(8)]
        assert elapsed < 0.8  # eight 0.1 s answers, not one after another
        await engine_client.close()
        # a closed client opens a new session on its next call
        again = await engine_client.generate(url, "sglang", "m", "prompt x", 1, timeout_s=5)
        assert again.ok and again.text == "x0"
    await engine_client.close()


async def test_a_pod_that_timed_out_is_not_waited_on_again_until_it_answers(client: EngineHttpClient) -> None:
    hold = asyncio.Event()
    engine = FakeEngine(hold=hold)
    async with serving(engine) as url:
        first = await client.generate(url, "vllm", "m", "hi", 4, timeout_s=0.2)
        assert not first.ok and "timed out after 0.2 s" in first.error
        # known hung: the next calls fail at once, and nothing more reaches the pod
        again = await client.generate(url, "vllm", "m", "hi", 4, timeout_s=30)
        assert not again.ok and "not waited on until it answers" in again.error
        assert again.seconds < 1.0
        assert not await client.healthy(url, "vllm", timeout_s=30)
        assert [path for _, path, _ in engine.requests] == ["/v1/completions"]
        hold.set()  # the call that timed out gets its answer: the pod answers again
        for _ in range(100):
            if not client.hung(url):
                break
            await asyncio.sleep(0.01)
        answered = await client.generate(url, "vllm", "m", "hi", 2, timeout_s=5)
    assert answered.ok and answered.text == "hi0 hi1"
