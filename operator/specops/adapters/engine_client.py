"""The serving engines' own HTTP APIs: greedy completions and readiness (implements ports.EngineClient).

- ``trtllm-serve``, ``vllm`` and ``sglang`` speak OpenAI completions:
  ``POST /v1/completions {"model", "prompt", "max_tokens", "temperature": 0}``, text in
  ``choices[0].text``; readiness is ``GET /health``.
- ``triton`` speaks KServe v2 with the generate extension, to specops's ``tensorrt_llm`` model:
  ``POST /v2/models/tensorrt_llm/generate {"text_input", "sampling_param_max_tokens",
  "sampling_param_temperature": 0}``, text in ``text_output``; readiness is
  ``GET /v2/models/tensorrt_llm/ready`` (the server's own ready route says nothing of the model).

Every call has a bounded timeout, and every failure comes back as data. A pod that let a call
time out is known hung: it is not waited on again until it answers. The call that timed out goes
on in the background (up to MAX_TIMEOUT_S); while it is out, every call to that pod fails at once,
and once it ends without an answer the next call probes the pod's readiness in the background
instead. Any HTTP answer from the pod ends its hung state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from specops.ports import GenerateOutput

TRITON_MODEL = "tensorrt_llm"
OPENAI_BACKENDS = frozenset({"trtllm-serve", "vllm", "sglang"})
BACKENDS = OPENAI_BACKENDS | {"triton"}
MAX_TIMEOUT_S = 600.0
"""No call waits longer than this, whatever the caller asks (a lossless check's long outputs fit)."""
MIN_TIMEOUT_S = 0.05
CONNECT_TIMEOUT_S = 5.0
HEALTH_TIMEOUT_S = 2.0
ERROR_BODY_CHARS = 300
"""How much of an error answer's body the error text keeps."""


def generate_path(backend: str) -> str:
    return f"/v2/models/{TRITON_MODEL}/generate" if backend == "triton" else "/v1/completions"


def health_path(backend: str) -> str:
    return f"/v2/models/{TRITON_MODEL}/ready" if backend == "triton" else "/health"


def generate_body(backend: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The request body of a greedy completion (temperature 0) in the backend's API."""
    if backend == "triton":
        return {
            "text_input": prompt,
            "sampling_param_max_tokens": max_tokens,
            "sampling_param_temperature": 0,
        }
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}


def completion_text(backend: str, body: Any) -> str:
    """The generated text of a successful answer; ValueError when the body has none."""
    if not isinstance(body, dict):
        raise ValueError("the answer is not a JSON object")
    if backend == "triton":
        text = body.get("text_output")
        if isinstance(text, list):  # a tensor of several elements comes back as an array
            text = "".join(str(part) for part in text)
    else:
        choices = body.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        text = first.get("text") if isinstance(first, dict) else None
    if not isinstance(text, str):
        raise ValueError("the answer carries no generated text")
    return text


def _base(url: str) -> str:
    return url.rstrip("/")


def _bounded(timeout_s: float) -> float:
    return min(MAX_TIMEOUT_S, max(MIN_TIMEOUT_S, float(timeout_s)))


def _timeout(timeout_s: float) -> aiohttp.ClientTimeout:
    total = _bounded(timeout_s)
    return aiohttp.ClientTimeout(total=total, connect=min(total, CONNECT_TIMEOUT_S))


def _error_detail(raw: bytes) -> str:
    """An error answer's message: the ``error``/``message``/``detail`` field of JSON, else the text."""
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        for key in ("error", "message", "detail"):
            value = body.get(key)
            if isinstance(value, dict):  # OpenAI style: {"error": {"message": ...}}
                value = value.get("message")
            if isinstance(value, str) and value:
                text = value
                break
    return text[:ERROR_BODY_CHARS]


def _describe(error: BaseException, timeout_s: float) -> str:
    if isinstance(error, asyncio.TimeoutError):
        return f"timed out after {_bounded(timeout_s):g} s"
    return f"{type(error).__name__}: {error}"


Answer = tuple[int, bytes]
"""An HTTP answer: status and body."""


@dataclass
class _Hung:
    """A pod that let a call time out: since when, and the background call still waiting on it."""

    since: float
    waited_s: float
    pending: asyncio.Task[Answer] | None

    def describe(self, now: float) -> str:
        return (
            f"did not answer within {self.waited_s:g} s {now - self.since:.0f} s ago; "
            "not waited on until it answers"
        )


class EngineHttpClient:
    """Calls serving engines over HTTP with one shared aiohttp session (opened on first use)."""

    def __init__(
        self,
        session: aiohttp.ClientSession | None = None,
        max_connections: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._session = session
        self._owns_session = session is None
        self._max_connections = max_connections
        self._clock = clock
        self._hung: dict[str, _Hung] = {}
        """Pods (by base URL) known hung."""

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                json_serialize=lambda data: orjson.dumps(data).decode(),
            )
            self._owns_session = True
        return self._session

    def hung(self, url: str) -> bool:
        """Whether the pod at base ``url`` is known hung (its calls fail at once)."""
        return _base(url) in self._hung

    async def _answer(self, method: str, url: str, body: Any) -> Answer:
        timeout = aiohttp.ClientTimeout(total=MAX_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        async with self._http().request(method, url, json=body, timeout=timeout) as response:
            return response.status, await response.read()

    def _ended(self, base: str, task: asyncio.Task[Answer]) -> None:
        """A background call to a hung pod ended: an answer ends the hung state."""
        hung = self._hung.get(base)
        if hung is None or hung.pending is not task:
            return
        if not task.cancelled() and task.exception() is None:
            del self._hung[base]
        else:
            hung.pending = None  # the next call probes again

    def _hang(self, base: str, waited_s: float, pending: asyncio.Task[Answer] | None) -> None:
        """The pod at ``base`` is known hung; ``pending`` (still waiting on it) ends that when answered."""
        hung = self._hung.setdefault(base, _Hung(self._clock(), waited_s, None))
        hung.pending = pending
        if pending is not None:
            pending.add_done_callback(lambda ended: self._ended(base, ended))

    async def _call(
        self, base: str, method: str, url: str, body: Any, timeout_s: float, probe: str
    ) -> Answer:
        """One request, waited on at most ``timeout_s``; raises TimeoutError (the pod is then known
        hung), _HungError without sending anything to a pod known hung (GET ``probe`` goes in the
        background when no earlier call still waits on it), or the request's own error."""
        hung = self._hung.get(base)
        if hung is not None:
            if hung.pending is None:
                self._hang(base, hung.waited_s, asyncio.ensure_future(self._answer("GET", probe, None)))
            raise _HungError(hung.describe(self._clock()))
        task = asyncio.ensure_future(self._answer(method, url, body))
        done, _ = await asyncio.wait({task}, timeout=_bounded(timeout_s))
        if task in done:
            return task.result()
        self._hang(base, _bounded(timeout_s), task)
        raise TimeoutError

    async def generate(
        self, url: str, backend: str, model: str, prompt: str, max_tokens: int, timeout_s: float
    ) -> GenerateOutput:
        """Greedy completion of ``prompt`` (at most ``max_tokens``) by the engine at base ``url``."""
        started = time.perf_counter()

        def failed(error: str, status: int | None = None) -> GenerateOutput:
            return GenerateOutput(ok=False, error=error, status=status, seconds=time.perf_counter() - started)

        if backend not in BACKENDS:
            return failed(f"unknown backend {backend!r}: expected one of {sorted(BACKENDS)}")
        if max_tokens < 1:
            return failed(f"max_tokens must be at least 1, got {max_tokens}")
        endpoint = _base(url) + generate_path(backend)
        body = generate_body(backend, model, prompt, max_tokens)
        try:
            status, raw = await self._call(
                _base(url), "POST", endpoint, body, timeout_s, _base(url) + health_path(backend)
            )
        except _HungError as hung:
            return failed(f"POST {endpoint}: {hung}")
        except Exception as error:  # refused, reset, timed out, a bad URL: all data
            return failed(f"POST {endpoint}: {_describe(error, timeout_s)}")
        if status != 200:
            return failed(f"POST {endpoint}: HTTP {status}: {_error_detail(raw)}", status)
        try:
            text = completion_text(backend, orjson.loads(raw))
        except (orjson.JSONDecodeError, ValueError) as error:
            return failed(f"POST {endpoint}: unreadable answer: {error}", status)
        return GenerateOutput(ok=True, text=text, status=status, seconds=time.perf_counter() - started)

    async def healthy(self, url: str, backend: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
        """Whether the engine's readiness endpoint answers 200 within ``timeout_s`` (a pod known
        hung is not: False at once)."""
        if backend not in BACKENDS:
            return False
        ready = _base(url) + health_path(backend)
        try:
            status, _ = await self._call(_base(url), "GET", ready, None, timeout_s, ready)
        except Exception:  # refused, reset, timed out, known hung, a bad URL: not healthy
            return False
        return status == 200

    async def close(self) -> None:
        pending = [hung.pending for hung in self._hung.values() if hung.pending is not None]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._hung.clear()
        if self._session is not None and self._owns_session and not self._session.closed:
            await self._session.close()
        self._session = None


class _HungError(Exception):
    """The pod is known hung: the call was not made."""
