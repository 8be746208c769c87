"""Run-time control of Triton serving pods: speculation settings live in the BLS model config.

Speculation is per request in Triton's TensorRT-LLM draft-target path, so the
BLS model holds the defaults it sends (draft length, draft model name) and a
change is a reload of that CPU-only model with a config override: no pod
restart. Every failure comes back as data (``ok=False`` and a message).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
import orjson
from tritonclient.http.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from specops.adapters import operator_metrics
from specops.domain.discovery import PodEndpoint
from specops.domain.triton_repo import (
    BLS_MODEL,
    ENSEMBLE_MODEL,
    P_DEFAULT_NUM_DRAFT_TOKENS,
    P_DRAFT_MODEL_NAME,
)
from specops.ports import ApplyResult, BlsSettings, FleetResult, GenerateResult

# The names the rendered model repository uses (defined once, in domain.triton_repo).
NUM_DRAFT_TOKENS_PARAMETER = P_DEFAULT_NUM_DRAFT_TOKENS
DRAFT_MODEL_PARAMETER = P_DRAFT_MODEL_NAME
CONFIRM_READS_PER_S = 2.0
"""Re-reads of confirmed settings per second, for all pods together (see _trust_window_s): what
a pod confirmed is trusted for confirm_ttl_s, or longer when there are many pods. A re-read
costs the operator about 3.5 ms of CPU (a connection, Triton's config JSON); at 10 a second
they were a fifth of a steady fleet's CPU. Only a hand-made change to a running pod's BLS goes
unseen for that long: a restarted container is read at once, and every setting is applied at once."""

# What a pod can throw at us: refused/reset connections, timeouts, Triton error answers.
_TRANSPORT_ERRORS = (
    InferenceServerException,
    aiohttp.ClientError,
    OSError,
    TimeoutError,
)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, InferenceServerException):
        status = exc.status()
        return f"Triton error{f' {status}' if status else ''}: {exc.message()}"
    return f"{type(exc).__name__}: {exc}"


def _string_parameter(config: Mapping[str, Any], name: str) -> str | None:
    parameter = (config.get("parameters") or {}).get(name)
    if not isinstance(parameter, Mapping):
        return None
    value = parameter.get("string_value")
    return None if value in (None, "") else str(value)


def settings_from_config(config: Mapping[str, Any]) -> BlsSettings:
    """The speculation settings a BLS config holds (missing or malformed values read as None)."""
    raw_length = _string_parameter(config, NUM_DRAFT_TOKENS_PARAMETER)
    try:
        length = int(raw_length) if raw_length is not None else None
    except ValueError:
        length = None
    return BlsSettings(
        num_draft_tokens=length, draft_model_name=_string_parameter(config, DRAFT_MODEL_PARAMETER)
    )


def config_with_settings(
    config: Mapping[str, Any], *, num_draft_tokens: int | None, draft_model_name: str | None
) -> dict[str, Any]:
    """A copy of ``config`` carrying the requested settings (None leaves a setting as it is)."""
    updated = json.loads(json.dumps(config))
    parameters = updated.setdefault("parameters", {})
    if num_draft_tokens is not None:
        parameters[NUM_DRAFT_TOKENS_PARAMETER] = {"string_value": str(num_draft_tokens)}
    if draft_model_name is not None:
        parameters[DRAFT_MODEL_PARAMETER] = {"string_value": draft_model_name}
    return updated


class TritonModelControl:
    """Triton model repository and BLS settings over HTTP (tritonclient's asyncio client)."""

    def __init__(
        self,
        *,
        timeout_s: float = 10.0,
        load_timeout_s: float = 120.0,
        apply_deadline_s: float | None = None,
        confirm_ttl_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s
        self.apply_deadline_s = apply_deadline_s
        # What each pod last confirmed (read back or applied), by address: (pod incarnation,
        # settings, when). apply_to_all trusts it for confirm_ttl_s instead of reading the BLS
        # config again every tick; a restarted container (a new incarnation) is read at once.
        self.confirm_ttl_s = confirm_ttl_s
        self._clock = clock
        self._confirmed: dict[str, tuple[str, BlsSettings, float]] = {}
        self._swept_at = clock()
        # One session for every generate call: a client per call built an SSL context each time
        # (the CA bundle loaded again, about 1 MiB), which with hundreds of first-draft checks at
        # once set the operator's peak memory. aiohttp, as for the API (see adapters/kube.py):
        # a request costs a tenth of httpx's CPU.
        self._http: aiohttp.ClientSession | None = None
        # One apply at a time per pod: a pod still busy with the last one is not sent another.
        self._inflight: dict[str, tuple[tuple[int | None, str | None], asyncio.Task[ApplyResult]]] = {}

    def _client(self, endpoint: PodEndpoint, timeout_s: float | None = None) -> InferenceServerClient:
        return InferenceServerClient(endpoint.address, conn_timeout=timeout_s or self.timeout_s)

    async def _with_client(
        self,
        endpoint: PodEndpoint,
        action: Callable[[InferenceServerClient], Awaitable[ApplyResult]],
        timeout_s: float | None = None,
    ) -> ApplyResult:
        try:
            async with self._client(endpoint, timeout_s) as client:
                return await action(client)
        except _TRANSPORT_ERRORS as exc:
            operator_metrics.count_error("triton", type(exc).__name__)
            return ApplyResult(pod=endpoint.name, ok=False, message=_describe(exc))

    def _remember(self, endpoint: PodEndpoint, result: ApplyResult) -> ApplyResult:
        now = self._clock()
        if result.ok and result.settings is not None:
            self._confirmed[endpoint.address] = (endpoint.incarnation, result.settings, now)
        else:
            self._confirmed.pop(endpoint.address, None)
        self._forget_gone_pods(now)
        return result

    def _forget_gone_pods(self, now: float) -> None:
        """Drop confirmations older than two trust windows, at most once per window.

        A pod still served is read again within one window, so an older entry is a pod that went
        away (deleted, rescheduled to another address): kept, it would grow without bound and
        stretch the trust window of every pod that is still there."""
        window = self._trust_window_s()
        if window <= 0 or now - self._swept_at < window:
            return
        self._swept_at = now
        for address in [a for a, (_, _, at) in self._confirmed.items() if now - at > 2 * window]:
            del self._confirmed[address]

    def _still_confirmed(
        self, endpoint: PodEndpoint, num_draft_tokens: int | None, draft_model_name: str | None
    ) -> BlsSettings | None:
        """The pod's confirmed settings, if they are the wanted ones and recent enough to trust."""
        found = self._confirmed.get(endpoint.address)
        if found is None or self.confirm_ttl_s <= 0:
            return None
        incarnation, settings, at = found
        if incarnation != endpoint.incarnation or self._clock() - at > self._trust_window_s():
            return None
        if num_draft_tokens is not None and settings.num_draft_tokens != num_draft_tokens:
            return None
        if draft_model_name is not None and settings.draft_model_name != draft_model_name:
            return None
        return settings

    def _trust_window_s(self) -> float:
        """confirm_ttl_s, stretched so that re-reads of confirmed pods stay within
        CONFIRM_READS_PER_S for the whole operator (from 120 pods at 60 s; 1,000 s at 2,000)."""
        return max(self.confirm_ttl_s, len(self._confirmed) / CONFIRM_READS_PER_S)

    async def read_bls_settings(self, endpoint: PodEndpoint) -> ApplyResult:
        async def read(client: InferenceServerClient) -> ApplyResult:
            config = await client.get_model_config(BLS_MODEL)
            return ApplyResult(pod=endpoint.name, ok=True, settings=settings_from_config(config))

        return self._remember(endpoint, await self._with_client(endpoint, read))

    async def apply_bls_settings(
        self,
        endpoint: PodEndpoint,
        *,
        num_draft_tokens: int | None = None,
        draft_model_name: str | None = None,
    ) -> ApplyResult:
        """Reload the BLS with the requested settings, only if they differ from what it runs."""

        async def apply(client: InferenceServerClient) -> ApplyResult:
            config = await client.get_model_config(BLS_MODEL)
            current = settings_from_config(config)
            wanted = BlsSettings(
                num_draft_tokens=current.num_draft_tokens if num_draft_tokens is None else num_draft_tokens,
                draft_model_name=current.draft_model_name if draft_model_name is None else draft_model_name,
            )
            if wanted == current:
                return ApplyResult(pod=endpoint.name, ok=True, changed=False, settings=current)
            updated = config_with_settings(
                config, num_draft_tokens=num_draft_tokens, draft_model_name=draft_model_name
            )
            await client.load_model(BLS_MODEL, config=json.dumps(updated))
            return ApplyResult(pod=endpoint.name, ok=True, changed=True, settings=wanted)

        self._confirmed.pop(endpoint.address, None)  # unknown while it changes
        return self._remember(endpoint, await self._with_client(endpoint, apply, self.load_timeout_s))

    async def apply_to_all(
        self,
        endpoints: Sequence[PodEndpoint],
        *,
        num_draft_tokens: int | None = None,
        draft_model_name: str | None = None,
        retries: int = 2,
        backoff_s: float = 0.2,
    ) -> FleetResult:
        """Apply to every pod concurrently, retrying each pod with exponential backoff.

        With a deadline, the call returns once it passes: a pod still working (a slow or hung
        model load) counts as not applied this time and goes on in the background, so one pod
        never delays the decision for the others. It is not sent a second setting meanwhile.
        """

        async def one(endpoint: PodEndpoint) -> ApplyResult:
            confirmed = self._still_confirmed(endpoint, num_draft_tokens, draft_model_name)
            if confirmed is not None:
                return ApplyResult(pod=endpoint.name, ok=True, changed=False, settings=confirmed, attempts=0)
            result = ApplyResult(pod=endpoint.name, ok=False, message="not attempted")
            for attempt in range(1, max(retries, 0) + 2):
                result = await self.apply_bls_settings(
                    endpoint, num_draft_tokens=num_draft_tokens, draft_model_name=draft_model_name
                )
                if result.ok:
                    break
                if attempt <= retries:
                    await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
            return ApplyResult(
                pod=result.pod,
                ok=result.ok,
                changed=result.changed,
                message=result.message,
                settings=result.settings,
                attempts=attempt,
            )

        wanted = (num_draft_tokens, draft_model_name)
        # per endpoint, in order: a result known now (confirmed, nothing to send: most ticks of
        # most pods, and no task for them) or the task applying to it
        slots: list[ApplyResult | tuple[tuple[int | None, str | None], asyncio.Task[ApplyResult]]] = []
        for endpoint in endpoints:
            inflight = self._inflight.get(endpoint.address)
            if inflight is None:
                confirmed = self._still_confirmed(endpoint, num_draft_tokens, draft_model_name)
                if confirmed is not None:
                    slots.append(
                        ApplyResult(pod=endpoint.name, ok=True, changed=False, settings=confirmed, attempts=0)
                    )
                    continue
            if inflight is None or inflight[1].done():
                inflight = (wanted, asyncio.ensure_future(one(endpoint)))
                self._inflight[endpoint.address] = inflight
            slots.append(inflight)
        pending = [slot[1] for slot in slots if isinstance(slot, tuple)]
        if pending:
            await asyncio.wait(pending, timeout=self.apply_deadline_s)
        results: list[ApplyResult] = []
        for endpoint, slot in zip(endpoints, slots, strict=True):
            if isinstance(slot, ApplyResult):
                results.append(slot)
                continue
            settings, task = slot
            if not task.done():
                results.append(
                    ApplyResult(
                        pod=endpoint.name,
                        ok=False,
                        message=f"still applying after {self.apply_deadline_s:g}s (slow or hung pod); "
                        "keeps trying in the background",
                    )
                )
                continue
            if self._inflight.get(endpoint.address, (None, None))[1] is task:
                del self._inflight[endpoint.address]
            result = task.result()
            if settings != wanted:
                result = ApplyResult(
                    pod=endpoint.name,
                    ok=False,
                    message="was busy with an earlier setting; applies this one next",
                )
            results.append(result)
        return FleetResult(
            desired=len(endpoints),
            applied=sum(r.ok for r in results),
            changed=sum(r.changed for r in results),
            errors={r.pod: r.message for r in results if not r.ok},
            results=tuple(results),
        )

    async def load_model(
        self, endpoint: PodEndpoint, name: str, config: Mapping[str, object] | None = None
    ) -> ApplyResult:
        async def load(client: InferenceServerClient) -> ApplyResult:
            await client.load_model(name, config=json.dumps(config) if config is not None else None)
            return ApplyResult(pod=endpoint.name, ok=True, changed=True)

        self._confirmed.pop(endpoint.address, None)  # a model (re)load may change what the BLS runs
        return await self._with_client(endpoint, load, self.load_timeout_s)

    async def unload_model(self, endpoint: PodEndpoint, name: str) -> ApplyResult:
        async def unload(client: InferenceServerClient) -> ApplyResult:
            await client.unload_model(name)
            return ApplyResult(pod=endpoint.name, ok=True, changed=True)

        self._confirmed.pop(endpoint.address, None)
        return await self._with_client(endpoint, unload)

    async def is_ready(self, endpoint: PodEndpoint, model: str | None = None) -> bool:
        """Server readiness, or one model's readiness; unreachable means not ready."""

        async def ready(client: InferenceServerClient) -> ApplyResult:
            ok = await (client.is_model_ready(model) if model else client.is_server_ready())
            return ApplyResult(pod=endpoint.name, ok=bool(ok))

        return (await self._with_client(endpoint, ready)).ok

    async def aclose(self) -> None:
        """Close the shared generate session (the BLS calls open a session per call)."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def generate(
        self, endpoint: PodEndpoint, prompt: str, max_tokens: int, num_draft_tokens: int | None = None
    ) -> GenerateResult:
        """Greedy completion through the ensemble's generate endpoint (tritonclient has no generate call)."""
        body: dict[str, Any] = {"text_input": prompt, "max_tokens": max_tokens, "temperature": 0.0}
        if num_draft_tokens is not None:
            body["num_draft_tokens"] = num_draft_tokens
        url = f"http://{endpoint.address}/v2/models/{ENSEMBLE_MODEL}/generate"
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        try:
            async with self._http.post(
                url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
            ) as response:
                content = await response.read()
            if response.status != 200:
                answer = content.decode("utf-8", "replace")[:200]
                return GenerateResult(
                    pod=endpoint.name, ok=False, message=f"HTTP {response.status}: {answer}"
                )
            answer_body = orjson.loads(content)
            text = answer_body.get("text_output") if isinstance(answer_body, dict) else None
        except (*_TRANSPORT_ERRORS, ValueError) as exc:
            operator_metrics.count_error("triton", type(exc).__name__)
            return GenerateResult(pod=endpoint.name, ok=False, message=_describe(exc))
        if not isinstance(text, str):
            return GenerateResult(pod=endpoint.name, ok=False, message="answer has no text_output")
        return GenerateResult(pod=endpoint.name, ok=True, text=text)
