"""A simulated Triton + TensorRT-LLM draft-target pod.

Tests and the demo cannot run Triton (no GPU), so each pod is a real HTTP server
speaking the Triton v2 endpoints that tritonclient uses (health, metadata, model
config, explicit model control, the generate extension) plus a Prometheus
/metrics listener exposing the same metric names as production. The operator's
unchanged code drives it; its numbers follow specops.domain.perf under a load
that tests control, so what the operator predicts and what it measures agree.
A pod given a `serving_profile` serves that profile's step times instead, so a test
can put the operator in a world its roofline model gets wrong.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from specops.domain import perf
from specops.domain.profile import ServingProfile
from specops_local.sim.load import LoadPoint, LoadSchedule, constant

TARGET_MODEL = "tensorrt_llm"
DRAFT_MODEL = "tensorrt_llm_draft"
BLS_MODEL = "tensorrt_llm_bls"
ENSEMBLE_MODEL = "ensemble"
MODEL_VERSION = "1"

TARGET_NAME_PARAMETER = "tensorrt_llm_model_name"
DRAFT_NAME_PARAMETER = "tensorrt_llm_draft_model_name"
DRAFT_LENGTH_PARAMETER = "specops_default_num_draft_tokens"
DRAFT_VERSION_PARAMETER = "specops_draft_version"

MAX_ACTIVE_REQUESTS = 256
TPOT_BUCKETS: tuple[float, ...] = (
    0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.0006, 0.0007, 0.0008, 0.0009, 0.001, 0.00125, 0.0015,
    0.00175, 0.002, 0.0025, 0.003, 0.0035, 0.004, 0.0045, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01,
    0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
)  # fmt: skip
E2E_BUCKETS: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)
LATENCY_SAMPLES_PER_SECOND = 40.0
MAX_TICK_SECONDS = 0.25
PROMETHEUS_TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Profile = Literal["triton", "vllm"]
ModelKind = Literal["target", "draft", "bls", "ensemble"]
JsonDict = dict[str, Any]

_VOCABULARY = tuple(
    onset + vowel + coda
    for onset in "bdfgklmnprstvz"
    for vowel in ("a", "e", "i", "o", "u")
    for coda in ("", "n", "r")
)


class ModelLoadError(Exception):
    """A load Triton would refuse (answered 400 with the message)."""


@dataclass
class _RepositoryModel:
    """One model directory of the repository and what is loaded from it."""

    name: str
    kind: ModelKind
    repository_config: JsonDict
    config: JsonDict | None = None  # the loaded config; None while not loaded
    reason: str = "unloaded"
    draft_version: str | None = None
    alpha: float | None = None
    lossless: bool | None = None

    @property
    def ready(self) -> bool:
        return self.config is not None


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float, times: int = 1) -> None:
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += times
        self.total += value * times
        self.count += times


@dataclass
class _SpecCounters:
    """What the BLS records per active draft (Triton custom metrics)."""

    drafted: float = 0.0
    accepted: float = 0.0
    steps: float = 0.0
    output_tokens: float = 0.0
    tpot: _Histogram = field(default_factory=lambda: _Histogram(TPOT_BUCKETS))


@dataclass
class _Totals:
    successes: int = 0
    failures: int = 0
    request_duration_us: float = 0.0
    target_inferences: float = 0.0
    target_executions: float = 0.0
    completion_carry: float = 0.0
    failure_carry: float = 0.0
    latency_sample_carry: float = 0.0
    token_carry: float = 0.0
    all_drafts: _SpecCounters = field(default_factory=_SpecCounters)
    by_draft: dict[str, _SpecCounters] = field(default_factory=dict)
    e2e: _Histogram = field(default_factory=lambda: _Histogram(E2E_BUCKETS))


def _param(value: str) -> JsonDict:
    return {"string_value": value}


def _io(name: str, data_type: str, dims: list[int], optional: bool = False) -> JsonDict:
    spec: JsonDict = {"name": name, "data_type": data_type, "dims": dims}
    if optional:
        spec["optional"] = True
    return spec


_GENERATE_INPUTS = [
    _io("text_input", "TYPE_STRING", [1]),
    _io("max_tokens", "TYPE_INT32", [1]),
    _io("temperature", "TYPE_FP32", [1], optional=True),
    _io("num_draft_tokens", "TYPE_INT32", [1], optional=True),
]
_GENERATE_OUTPUTS = [_io("text_output", "TYPE_STRING", [-1])]


def target_config(max_draft_len: int) -> JsonDict:
    return {
        "name": TARGET_MODEL,
        "backend": "tensorrtllm",
        "max_batch_size": MAX_ACTIVE_REQUESTS,
        "model_transaction_policy": {"decoupled": False},
        "input": [_io("input_ids", "TYPE_INT32", [-1]), _io("draft_input_ids", "TYPE_INT32", [-1], True)],
        "output": [_io("output_ids", "TYPE_INT32", [-1, -1])],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {
            "gpt_model_type": _param("inflight_fused_batching"),
            "batching_strategy": _param("inflight_fused_batching"),
            "engine_dir": _param(f"/engines/{TARGET_MODEL}"),
            "max_draft_len": _param(str(max_draft_len)),
        },
    }


def draft_config(name: str, draft_version: str) -> JsonDict:
    return {
        "name": name,
        "backend": "tensorrtllm",
        "max_batch_size": MAX_ACTIVE_REQUESTS,
        "model_transaction_policy": {"decoupled": False},
        "input": [_io("input_ids", "TYPE_INT32", [-1])],
        "output": [_io("output_ids", "TYPE_INT32", [-1, -1])],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "parameters": {
            "gpt_model_type": _param("inflight_fused_batching"),
            "engine_dir": _param(f"/engines/{name}"),
            DRAFT_VERSION_PARAMETER: _param(draft_version),
        },
    }


def bls_config(draft_model: str, draft_length: int, deployment: str, variant: str) -> JsonDict:
    return {
        "name": BLS_MODEL,
        "backend": "python",
        "max_batch_size": 64,
        "model_transaction_policy": {"decoupled": False},
        "input": _GENERATE_INPUTS,
        "output": _GENERATE_OUTPUTS,
        "instance_group": [{"count": 4, "kind": "KIND_CPU"}],
        "parameters": {
            TARGET_NAME_PARAMETER: _param(TARGET_MODEL),
            DRAFT_NAME_PARAMETER: _param(draft_model),
            DRAFT_LENGTH_PARAMETER: _param(str(draft_length)),
            "specops_deployment": _param(deployment),
            "specops_variant": _param(variant),
        },
    }


def ensemble_config() -> JsonDict:
    return {
        "name": ENSEMBLE_MODEL,
        "platform": "ensemble",
        "max_batch_size": 64,
        "input": _GENERATE_INPUTS,
        "output": _GENERATE_OUTPUTS,
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": BLS_MODEL,
                    "model_version": -1,
                    "input_map": {i["name"]: i["name"] for i in _GENERATE_INPUTS},
                    "output_map": {"text_output": "text_output"},
                }
            ]
        },
    }


def greedy_text(prompt: str, max_tokens: int, divergence_salt: str | None = None) -> str:
    """Deterministic 'greedy decoding' of a prompt; with a salt it diverges at one position.

    The divergent continuation mimics a speculation bug: identical up to the first
    wrongly accepted token, different from there on.
    """
    words: list[str] = []
    diverge_at = max_tokens
    if divergence_salt is not None and max_tokens > 0:
        diverge_at = _hash_int(divergence_salt, prompt, "diverge") % max_tokens
    for position in range(max_tokens):
        index = _hash_int(prompt, str(position)) % len(_VOCABULARY)
        if position >= diverge_at:
            shift = 1 + _hash_int(str(divergence_salt), prompt, str(position)) % (len(_VOCABULARY) - 1)
            index = (index + shift) % len(_VOCABULARY)
        words.append(_VOCABULARY[index])
    return " ".join(words)


def _hash_int(*parts: str) -> int:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _string_parameter(config: Mapping[str, Any], key: str) -> str | None:
    parameters = config.get("parameters") or {}
    entry = parameters.get(key)
    if isinstance(entry, Mapping):
        value = entry.get("string_value")
        return None if value is None else str(value)
    return None


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


class SimPod:
    """One simulated serving pod: Triton HTTP on `http_port`, Prometheus metrics on `metrics_port`.

    Time is simulated: `advance(dt)` integrates the performance model over dt seconds.
    With `tick_interval` set (the default), a background task advances by the event
    loop's elapsed time while the pod runs; tests pass `tick_interval=None` and call
    `advance` themselves so nothing depends on wall time.
    """

    def __init__(
        self,
        name: str,
        setup: perf.ModelSetup,
        *,
        draft_model: str = DRAFT_MODEL,
        draft_version: str = "1",
        max_draft_len: int = 8,
        draft_length: int = 4,
        load: LoadPoint | None = None,
        engine_alpha_by_draft: Mapping[str, float] | None = None,
        lossless: bool = True,
        noise_sigma: float = 0.0,
        batch_noise: float = 0.0,
        alpha_noise: float = 0.0,
        seed: int = 0,
        deployment: str = "",
        variant: str = "stable",
        profile: Profile = "triton",
        host: str = "127.0.0.1",
        http_port: int = 0,
        metrics_port: int = 0,
        tick_interval: float | None = 0.2,
        load_latency: float = 0.0,
        serving_profile: ServingProfile | None = None,
        realtime_generate: bool = False,
    ) -> None:
        if not 0 <= draft_length <= max_draft_len:
            raise ValueError(f"draft_length {draft_length} outside [0, {max_draft_len}]")
        if serving_profile is not None and max_draft_len > serving_profile.max_length:
            raise ValueError(
                f"max_draft_len {max_draft_len} exceeds the serving profile's longest length "
                f"{serving_profile.max_length}"
            )
        self.name = name
        self.setup = setup
        self.serving_profile = serving_profile
        # generate answers after the time the engine would take, at a batch of the requests in
        # flight (plus the load's), and counts its tokens: what `specops profile` measures
        self.realtime_generate = realtime_generate
        self._in_flight = 0
        self.max_draft_len = max_draft_len
        self.lossless = lossless
        self.noise_sigma = noise_sigma
        self.batch_noise = batch_noise
        self.alpha_noise = alpha_noise  # sd of the acceptance each integration step draws around its mean
        self.profile: Profile = profile
        self.host = host
        self.http_port = http_port
        self.metrics_port = metrics_port
        self.tick_interval = tick_interval
        self.load_latency = load_latency
        self._deployment = deployment
        self._variant = variant
        self._initial_draft = (draft_model, draft_version, draft_length)
        self._alpha_by_draft = dict(engine_alpha_by_draft or {})
        self._random = random.Random(seed)
        self._time = 0.0
        default_alpha = 0.7
        if serving_profile is not None and serving_profile.alpha is not None:
            default_alpha = serving_profile.alpha
        self._schedule: LoadSchedule = constant(load or LoadPoint(batch=0.0, alpha=default_alpha))
        self._schedule_origin = 0.0
        self._ready = True
        self._runners: list[web.AppRunner] = []
        self._ticker: asyncio.Task[None] | None = None
        self._models: dict[str, _RepositoryModel] = {}
        self._totals = _Totals()
        self._active = 0
        self._waiting = 0
        self.bls_loads = 0
        self.config_reads = 0
        self.model_loads: dict[str, int] = {}
        self.generate_requests = 0
        self._build_repository()

    # ----------------------------------------------------------------- repository

    def _build_repository(self) -> None:
        draft_model, draft_version, draft_length = self._initial_draft
        self._models = {
            TARGET_MODEL: _RepositoryModel(TARGET_MODEL, "target", target_config(self.max_draft_len)),
            BLS_MODEL: _RepositoryModel(
                BLS_MODEL, "bls", bls_config(draft_model, draft_length, self._deployment, self._variant)
            ),
            ENSEMBLE_MODEL: _RepositoryModel(ENSEMBLE_MODEL, "ensemble", ensemble_config()),
        }
        self.add_repository_model(draft_model, draft_version)
        for model in self._models.values():
            model.config = copy.deepcopy(model.repository_config)
            model.reason = ""

    def add_repository_model(
        self, name: str, draft_version: str, *, alpha: float | None = None, lossless: bool | None = None
    ) -> None:
        """Put a draft model directory into the repository (not loaded): what a rollout ships.

        alpha/lossless override the pod-wide values while this draft is active.
        """
        if name in (TARGET_MODEL, BLS_MODEL, ENSEMBLE_MODEL):
            raise ValueError(f"{name!r} is not a draft model name")
        self._models[name] = _RepositoryModel(
            name,
            "draft",
            draft_config(name, draft_version),
            draft_version=draft_version,
            alpha=alpha,
            lossless=lossless,
        )

    def reset(self) -> None:
        """Forget what a container restart forgets: loaded configs back to the repository, counters to 0."""
        registered = {n: m for n, m in self._models.items() if m.kind == "draft"}
        self._build_repository()
        for name, model in registered.items():
            if name not in self._models:
                model.config, model.reason = None, "unloaded"
                self._models[name] = model
        self._totals = _Totals()
        self._active = self._waiting = 0

    @property
    def bls_config(self) -> JsonDict:
        bls = self._models[BLS_MODEL]
        return copy.deepcopy(bls.config if bls.config is not None else bls.repository_config)

    @property
    def active_draft(self) -> str:
        """The draft model the loaded BLS config names ('' when none)."""
        return _string_parameter(self.bls_config, DRAFT_NAME_PARAMETER) or ""

    @property
    def draft_length(self) -> int:
        """The BLS's default num_draft_tokens (0 = speculation off)."""
        return int(_string_parameter(self.bls_config, DRAFT_LENGTH_PARAMETER) or 0)

    def is_loaded(self, model: str) -> bool:
        return model in self._models and self._models[model].ready

    def _validate_bls(self, config: Mapping[str, Any]) -> None:
        target = _string_parameter(config, TARGET_NAME_PARAMETER) or TARGET_MODEL
        if not self.is_loaded(target):
            raise ModelLoadError(f"target model '{target}' is not loaded")
        raw_length = _string_parameter(config, DRAFT_LENGTH_PARAMETER) or "0"
        try:
            length = int(raw_length)
        except ValueError:
            raise ModelLoadError(f"{DRAFT_LENGTH_PARAMETER} must be an integer, got '{raw_length}'") from None
        if not 0 <= length <= self.max_draft_len:
            raise ModelLoadError(
                f"{DRAFT_LENGTH_PARAMETER}={length} outside [0, max_draft_len={self.max_draft_len}]"
            )
        draft = _string_parameter(config, DRAFT_NAME_PARAMETER) or ""
        if draft:
            model = self._models.get(draft)
            if model is None or model.kind != "draft" or not model.ready:
                raise ModelLoadError(f"draft model '{draft}' is not loaded")
        elif length > 0:
            raise ModelLoadError(f"{DRAFT_LENGTH_PARAMETER}={length} but no {DRAFT_NAME_PARAMETER} is set")

    def load_model(self, name: str, config_override: JsonDict | None = None) -> None:
        """Explicit model control load; raises ModelLoadError where Triton answers 400."""
        model = self._models.get(name)
        if model is None:
            raise ModelLoadError(f"failed to load '{name}', failed to poll from model repository")
        config = copy.deepcopy(config_override if config_override is not None else model.repository_config)
        if config.get("name", name) != name:
            raise ModelLoadError(
                f"failed to load '{name}': config name '{config.get('name')}' does not match model name"
            )
        config["name"] = name
        if model.kind == "bls":
            try:
                self._validate_bls(config)
            except ModelLoadError as error:
                raise ModelLoadError(f"failed to load '{name}': {error}") from None
            self.bls_loads += 1
        model.config, model.reason = config, ""
        self.model_loads[name] = self.model_loads.get(name, 0) + 1

    def unload_model(self, name: str) -> None:
        model = self._models.get(name)
        if model is None:
            raise ModelLoadError(f"failed to unload '{name}', model is not in the repository")
        model.config, model.reason = None, "unloaded"

    # ----------------------------------------------------------------- load and clock

    @property
    def time(self) -> float:
        """Simulated seconds integrated so far."""
        return self._time

    def set_load(self, point: LoadPoint) -> None:
        self.set_schedule(constant(point))

    def set_schedule(self, schedule: LoadSchedule) -> None:
        """Install a schedule; its t = 0 is now."""
        self._schedule = schedule
        self._schedule_origin = self._time

    @property
    def load_point(self) -> LoadPoint:
        return self._schedule(self._time - self._schedule_origin)

    def alpha_for(self, draft: str, offered_alpha: float) -> float:
        """The engine's per-token acceptance with this draft: a registered override, else the load's."""
        model = self._models.get(draft)
        if model is not None and model.alpha is not None:
            return model.alpha
        if draft in self._alpha_by_draft:
            return self._alpha_by_draft[draft]
        if model is not None and model.draft_version in self._alpha_by_draft:
            return self._alpha_by_draft[model.draft_version]
        return offered_alpha

    def _draft_is_lossless(self, draft: str) -> bool:
        model = self._models.get(draft)
        if model is not None and model.lossless is not None:
            return model.lossless
        return self.lossless

    def advance(self, dt: float, max_tick: float = MAX_TICK_SECONDS) -> None:
        """Integrate dt simulated seconds in ticks of at most ``max_tick`` (MAX_TICK_SECONDS).

        Under a constant load the counters come out the same for any tick, so a caller that
        advances many such pods may pass a coarser one (the scale benchmark's pod farms do)."""
        if dt < 0:
            raise ValueError("time only moves forward")
        if max_tick <= 0:
            raise ValueError("max_tick must be positive")
        while dt > 1e-12:
            tick = min(dt, max_tick)
            self._integrate(tick)
            self._time += tick
            dt -= tick

    def _sample_batch(self, mean: float) -> int:
        value = mean
        if self.batch_noise > 0 and mean > 0:
            value = self._random.gauss(mean, self.batch_noise * math.sqrt(mean))
        return max(0, math.floor(value + 0.5))

    def _noisy(self, value: float) -> float:
        if self.noise_sigma <= 0:
            return value
        sigma = self.noise_sigma
        return value * math.exp(self._random.gauss(-sigma * sigma / 2, sigma))

    def _integrate(self, dt: float) -> None:
        point = self.load_point
        batch = self._sample_batch(point.batch)
        self._active = min(batch, MAX_ACTIVE_REQUESTS)
        self._waiting = batch - self._active
        totals = self._totals
        if self._active == 0 or not self.running:
            return
        if not (self.is_loaded(TARGET_MODEL) and self.is_loaded(BLS_MODEL)):
            return
        setup = self.setup.with_context(point.context_tokens)
        draft = self.active_draft
        length = self.draft_length
        if length > 0 and not self.is_loaded(draft):
            # The BLS names a draft that is gone: every speculative request fails fast.
            plain_step = self._round_seconds(setup, self._active, 0)
            totals.failure_carry += self._active * dt / (plain_step * point.mean_output_tokens)
            failed = math.floor(totals.failure_carry)
            totals.failure_carry -= failed
            totals.failures += failed
            return
        alpha = self.alpha_for(draft, point.alpha)
        if self.alpha_noise > 0:
            alpha = min(0.99, max(0.01, self._random.gauss(alpha, self.alpha_noise)))
        step = self._round_seconds(setup, self._active, length)
        tokens_per_step = perf.expected_tokens(alpha, length)
        steps_per_request = dt / step
        counters = totals.by_draft.setdefault(draft, _SpecCounters())
        for sink in (counters, totals.all_drafts):
            sink.drafted += self._active * length * steps_per_request
            sink.accepted += self._active * (tokens_per_step - 1.0) * steps_per_request
            if length > 0:
                sink.steps += self._active * steps_per_request
            sink.output_tokens += self._active * tokens_per_step * steps_per_request
        totals.target_executions += steps_per_request
        totals.target_inferences += self._active * steps_per_request

        # Engines observe latency once per emitted token (vLLM's inter-token histogram count is
        # read as tokens), so weigh a handful of noisy samples by the tokens they stand for.
        tpot = step / tokens_per_step
        totals.token_carry += self._active * tokens_per_step * steps_per_request
        tokens = math.floor(totals.token_carry)
        totals.token_carry -= tokens
        totals.latency_sample_carry += LATENCY_SAMPLES_PER_SECOND * dt
        samples = math.floor(totals.latency_sample_carry)
        totals.latency_sample_carry -= samples
        if tokens > 0 and self.noise_sigma <= 0:
            # Without noise every sample is tpot: one weighted observation, the same histogram.
            counters.tpot.observe(tpot, tokens)
            totals.all_drafts.tpot.observe(tpot, tokens)
        elif tokens > 0:
            groups = min(tokens, max(1, samples))
            share, remainder = divmod(tokens, groups)
            for group in range(groups):
                observed = self._noisy(tpot)
                weight = share + (1 if group < remainder else 0)
                counters.tpot.observe(observed, weight)
                totals.all_drafts.tpot.observe(observed, weight)

        totals.completion_carry += (
            self._active * tokens_per_step * steps_per_request / point.mean_output_tokens
        )
        completed = math.floor(totals.completion_carry)
        totals.completion_carry -= completed
        totals.successes += completed
        if completed > 0 and self.noise_sigma <= 0:
            e2e = tpot * point.mean_output_tokens
            totals.e2e.observe(e2e, completed)
            totals.request_duration_us += e2e * 1e6 * completed
        else:
            for _ in range(completed):
                e2e = self._noisy(tpot * point.mean_output_tokens)
                totals.e2e.observe(e2e)
                totals.request_duration_us += e2e * 1e6

    def _round_seconds(self, setup: perf.ModelSetup, batch: int, length: int) -> float:
        """One decode step (length 0) or speculative round: from the serving profile, else the roofline."""
        if self.serving_profile is not None:
            return self.serving_profile.round_ms_at(length, batch) / 1e3
        return perf.speculative_step_time(setup, batch, length)

    # ----------------------------------------------------------------- lifecycle

    @property
    def running(self) -> bool:
        return bool(self._runners)

    @property
    def ready(self) -> bool:
        return self._ready

    def set_ready(self, ready: bool) -> None:
        self._ready = ready

    @property
    def url(self) -> str:
        """host:port as tritonclient wants it (no scheme)."""
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    async def start(self) -> None:
        """Listen (again) on the pod's ports; port 0 picks a free one the first time."""
        if self._runners:
            return
        http_app = web.Application(middlewares=[_json_errors])
        self._add_triton_routes(http_app)
        metrics_app = web.Application()
        metrics_app.router.add_get("/metrics", self._handle_metrics)
        if self.profile == "vllm":
            http_app.router.add_get("/metrics", self._handle_metrics)
        try:
            self.http_port = await self._listen(http_app, self.http_port)
            self.metrics_port = await self._listen(metrics_app, self.metrics_port)
        except BaseException:
            await self.stop()
            raise
        if self.tick_interval is not None:
            self._ticker = asyncio.create_task(self._tick_forever(), name=f"sim-pod-{self.name}-ticker")

    async def _listen(self, app: web.Application, port: int) -> int:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, self.host, port, reuse_address=True)
        await site.start()
        return int(runner.addresses[-1][1])

    async def stop(self) -> None:
        """Close both listeners (an outage); state survives, so start() resumes serving it."""
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    async def restart(self, *, reset: bool = True) -> None:
        """Stop and start on the same ports; with reset, as a fresh container (counters, configs)."""
        await self.stop()
        if reset:
            self.reset()
        await self.start()

    async def __aenter__(self) -> SimPod:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _tick_forever(self) -> None:
        assert self.tick_interval is not None
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(self.tick_interval)
            now = loop.time()
            self.advance(now - last)
            last = now

    # ----------------------------------------------------------------- Triton HTTP

    def _add_triton_routes(self, app: web.Application) -> None:
        get, post = app.router.add_get, app.router.add_post
        get("/v2/health/live", self._handle_live)
        get("/v2/health/ready", self._handle_ready)
        get("/v2", self._handle_server_metadata)
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            get(prefix, self._handle_model_metadata)
            get(prefix + "/ready", self._handle_model_ready)
            get(prefix + "/config", self._handle_model_config)
            post(prefix + "/generate", self._handle_generate)
        post("/v2/repository/index", self._handle_repository_index)
        post("/v2/repository/models/{model}/load", self._handle_load)
        post("/v2/repository/models/{model}/unload", self._handle_unload)

    def _loaded_model(self, request: web.Request) -> _RepositoryModel | None:
        name = request.match_info["model"]
        version = request.match_info.get("version", MODEL_VERSION)
        model = self._models.get(name)
        if model is None or not model.ready or version != MODEL_VERSION:
            return None
        return model

    @staticmethod
    def _unknown_model(request: web.Request) -> web.Response:
        name = request.match_info["model"]
        version = request.match_info.get("version")
        suffix = f" version {version}" if version else ""
        return _error(400, f"Request for unknown model: '{name}'{suffix} is not found")

    async def _handle_live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _handle_ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._ready else 503)

    async def _handle_server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": "triton",
                "version": "2.53.0",
                "extensions": [
                    "classification",
                    "sequence",
                    "model_repository",
                    "model_repository(unload_dependents)",
                    "schedule_policy",
                    "model_configuration",
                    "system_shared_memory",
                    "cuda_shared_memory",
                    "binary_tensor_data",
                    "parameters",
                    "statistics",
                    "trace",
                    "logging",
                    "generate",
                ],
            }
        )

    async def _handle_model_ready(self, request: web.Request) -> web.Response:
        if self._loaded_model(request) is None:
            return self._unknown_model(request)
        return web.Response(status=200)

    async def _handle_model_metadata(self, request: web.Request) -> web.Response:
        model = self._loaded_model(request)
        if model is None or model.config is None:
            return self._unknown_model(request)
        platform = {
            "target": "tensorrt_llm",
            "draft": "tensorrt_llm",
            "bls": "python",
            "ensemble": "ensemble",
        }
        tensors = [
            {
                "name": io["name"],
                "datatype": io["data_type"].removeprefix("TYPE_").replace("STRING", "BYTES"),
                "shape": [-1, *io["dims"]],
            }
            for io in model.config.get("input", [])
        ]
        outputs = [
            {
                "name": io["name"],
                "datatype": io["data_type"].removeprefix("TYPE_").replace("STRING", "BYTES"),
                "shape": [-1, *io["dims"]],
            }
            for io in model.config.get("output", [])
        ]
        return web.json_response(
            {
                "name": model.name,
                "versions": [MODEL_VERSION],
                "platform": platform[model.kind],
                "inputs": tensors,
                "outputs": outputs,
            }
        )

    async def _handle_model_config(self, request: web.Request) -> web.Response:
        model = self._loaded_model(request)
        if model is None:
            return self._unknown_model(request)
        self.config_reads += 1
        return web.json_response(model.config)

    async def _handle_repository_index(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        only_ready = bool(body.get("ready", False))
        index = [
            {
                "name": m.name,
                "version": MODEL_VERSION,
                "state": "READY" if m.ready else "UNAVAILABLE",
                "reason": m.reason,
            }
            for m in sorted(self._models.values(), key=lambda m: m.name)
            if m.ready or not only_ready
        ]
        return web.json_response(index)

    async def _handle_load(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        body = await _json_body(request)
        override: JsonDict | None = None
        raw = (body.get("parameters") or {}).get("config")
        if raw is not None:
            try:
                override = json.loads(raw) if isinstance(raw, str) else raw
            except json.JSONDecodeError as error:
                return _error(400, f"failed to load '{name}': config override is not JSON: {error}")
            if not isinstance(override, dict):
                return _error(400, f"failed to load '{name}': config override must be a JSON object")
        if self.load_latency > 0:
            await asyncio.sleep(self.load_latency)
        try:
            self.load_model(name, override)
        except ModelLoadError as error:
            return _error(400, str(error))
        return web.Response(status=200)

    async def _handle_unload(self, request: web.Request) -> web.Response:
        try:
            self.unload_model(request.match_info["model"])
        except ModelLoadError as error:
            return _error(400, str(error))
        return web.Response(status=200)

    async def _handle_generate(self, request: web.Request) -> web.Response:
        model = self._loaded_model(request)
        if model is None:
            return self._unknown_model(request)
        if model.kind not in ("bls", "ensemble"):
            return _error(400, f"model '{model.name}' does not support the generate extension here")
        body = await _json_body(request)
        prompt = body.get("text_input")
        if not isinstance(prompt, str):
            return _error(400, "missing or non-string input 'text_input'")
        try:
            max_tokens = int(body.get("max_tokens", 16))
            requested = body.get("num_draft_tokens")
            length = self.draft_length if requested is None else int(requested)
            temperature = float(body.get("temperature", 0.0))
        except (TypeError, ValueError) as error:
            return _error(400, f"invalid generate parameter: {error}")
        if max_tokens < 0:
            return _error(400, "max_tokens must be >= 0")
        if not self.is_loaded(BLS_MODEL) or not self.is_loaded(TARGET_MODEL):
            return _error(400, f"model '{model.name}' depends on a model that is not loaded")
        if length > self.max_draft_len:
            return _error(
                400, f"num_draft_tokens ({length}) exceeds the engine's max_draft_len ({self.max_draft_len})"
            )
        draft = self.active_draft
        if length > 0 and not self.is_loaded(draft):
            self._totals.failures += 1
            return _error(400, f"draft model '{draft}' is not loaded")
        salt: str | None = None
        if length > 0 and not self._draft_is_lossless(draft):
            salt = f"{draft}:{self._models[draft].draft_version}"
        if temperature > 0:
            prompt = f"{prompt}\x00sample{self._random.random()}"
        self.generate_requests += 1
        if self.realtime_generate:
            await self._decode_in_real_time(draft, length, max_tokens)
        self._totals.successes += 1
        return web.json_response(
            {
                "model_name": model.name,
                "model_version": MODEL_VERSION,
                "text_output": greedy_text(prompt, max_tokens, salt),
            }
        )

    async def _decode_in_real_time(self, draft: str, length: int, max_tokens: int) -> None:
        """Take the wall time `max_tokens` would take at the batch in flight, in ~20 ms chunks."""
        point = self.load_point
        setup = self.setup.with_context(point.context_tokens)
        alpha = self.alpha_for(draft, point.alpha)
        per_step = perf.expected_tokens(alpha, length)
        counters = self._totals.by_draft.setdefault(draft, _SpecCounters())
        loop = asyncio.get_running_loop()
        due = loop.time()
        self._in_flight += 1
        try:
            produced = 0.0
            while produced < max_tokens - 1e-9:
                batch = max(1, self._in_flight + round(self.load_point.batch))
                step = self._round_seconds(setup, batch, length)
                steps = min(max(1.0, 0.02 / step), (max_tokens - produced) / per_step)
                due += steps * step  # sleep to a deadline, so timer lateness does not add up
                await asyncio.sleep(max(0.0, due - loop.time()))
                produced += steps * per_step
                for sink in (counters, self._totals.all_drafts):
                    sink.drafted += steps * length
                    sink.accepted += steps * (per_step - 1.0)
                    if length > 0:
                        sink.steps += steps
                    sink.output_tokens += steps * per_step
                    sink.tpot.observe(step / per_step, max(1, round(steps * per_step)))
        finally:
            self._in_flight -= 1

    # ----------------------------------------------------------------- metrics

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.render_metrics().encode(), headers={"Content-Type": PROMETHEUS_TEXT_CONTENT_TYPE}
        )

    def render_metrics(self) -> str:
        """Prometheus text format 0.0.4 with the production metric names of this profile."""
        out = _Exposition()
        if self.profile == "vllm":
            self._render_vllm(out)
        else:
            self._render_triton(out)
        return out.text()

    def _render_triton(self, out: _Exposition) -> None:
        t = self._totals
        ensemble = {"model": ENSEMBLE_MODEL, "version": MODEL_VERSION}
        target = {"model": TARGET_MODEL, "version": MODEL_VERSION}
        out.family("nv_inference_request_success", "counter", "Number of successful inference requests")
        out.sample("nv_inference_request_success", ensemble, t.successes)
        out.sample(
            "nv_inference_request_success", {"model": BLS_MODEL, "version": MODEL_VERSION}, t.successes
        )
        out.family("nv_inference_request_failure", "counter", "Number of failed inference requests")
        out.sample("nv_inference_request_failure", ensemble, t.failures)
        out.family("nv_inference_count", "counter", "Number of inferences performed")
        out.sample("nv_inference_count", ensemble, t.successes)
        out.sample("nv_inference_count", target, t.target_inferences)
        out.family("nv_inference_exec_count", "counter", "Number of model executions performed")
        out.sample("nv_inference_exec_count", ensemble, t.successes)
        out.sample("nv_inference_exec_count", target, t.target_executions)
        out.family("nv_inference_request_duration_us", "counter", "Cumulative inference request duration")
        out.sample("nv_inference_request_duration_us", ensemble, t.request_duration_us)
        out.family("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests")
        out.sample("nv_inference_pending_request_count", ensemble, self._waiting)

        out.family("nv_trt_llm_request_metrics", "gauge", "TRT LLM request metrics")
        for request_type, value in (
            ("active", self._active),
            ("max", MAX_ACTIVE_REQUESTS),
            ("scheduled", self._active),
            ("context", 0),
            ("waiting", self._waiting),
        ):
            out.sample("nv_trt_llm_request_metrics", {**target, "request_type": request_type}, value)
        out.family("nv_trt_llm_inflight_batcher_metrics", "gauge", "TRT LLM inflight batcher metrics")
        out.sample(
            "nv_trt_llm_inflight_batcher_metrics",
            {**target, "inflight_batcher_specific_metric": "generation_requests"},
            self._active,
        )

        # The active draft's series exists from the first scrape, so rate() works at once.
        series = sorted({self.active_draft: _SpecCounters(), **t.by_draft}.items())
        for metric, attribute, help_text in (
            ("specops_spec_decode_draft_tokens_total", "drafted", "Draft tokens proposed"),
            ("specops_spec_decode_accepted_tokens_total", "accepted", "Draft tokens accepted by the target"),
            ("specops_spec_decode_steps_total", "steps", "Verification steps that carried draft tokens"),
            ("specops_output_tokens_total", "output_tokens", "Tokens emitted"),
        ):
            out.family(metric, "counter", help_text)
            for draft, counters in series:
                out.sample(metric, self._bls_labels(draft), getattr(counters, attribute))
        histogram = "specops_time_per_output_token_seconds"
        out.family(histogram, "histogram", "Time per output token")
        for draft, counters in series:
            out.histogram(histogram, self._bls_labels(draft), counters.tpot)

    @staticmethod
    def _bls_labels(draft: str) -> dict[str, str]:
        return {"model": BLS_MODEL, "version": MODEL_VERSION, "draft": draft}

    def _render_vllm(self, out: _Exposition) -> None:
        t = self._totals
        spec = t.all_drafts
        labels = {"model_name": self.name}
        for metric, kind, value in (
            ("vllm:num_requests_running", "gauge", self._active),
            ("vllm:num_requests_waiting", "gauge", self._waiting),
            ("vllm:spec_decode_num_drafts_total", "counter", spec.steps),
            ("vllm:spec_decode_num_draft_tokens_total", "counter", spec.drafted),
            ("vllm:spec_decode_num_accepted_tokens_total", "counter", spec.accepted),
            ("vllm:generation_tokens_total", "counter", spec.output_tokens),
        ):
            out.family(metric, kind, metric.removeprefix("vllm:").replace("_", " "))
            out.sample(metric, labels, value)
        out.family("vllm:request_success_total", "counter", "request success")
        out.sample("vllm:request_success_total", {**labels, "finished_reason": "length"}, t.successes)
        out.family("vllm:inter_token_latency_seconds", "histogram", "inter token latency")
        out.histogram("vllm:inter_token_latency_seconds", labels, spec.tpot)
        out.family("vllm:e2e_request_latency_seconds", "histogram", "end to end request latency")
        out.histogram("vllm:e2e_request_latency_seconds", labels, t.e2e)


class _Exposition:
    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Mapping[str, str], value: float) -> None:
        rendered = ",".join(f'{key}="{_escape(val)}"' for key, val in labels.items())
        self._lines.append(f"{name}{{{rendered}}} {_number(value)}")

    def histogram(self, name: str, labels: Mapping[str, str], histogram: _Histogram) -> None:
        for bound, count in zip(histogram.buckets, histogram.counts, strict=True):
            self.sample(f"{name}_bucket", {**labels, "le": _number(bound)}, count)
        self.sample(f"{name}_bucket", {**labels, "le": "+Inf"}, histogram.count)
        self.sample(f"{name}_sum", labels, histogram.total)
        self.sample(f"{name}_count", labels, histogram.count)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


async def _json_body(request: web.Request) -> JsonDict:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as error:
        raise _BadRequest(f"malformed JSON body: {error}") from None
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    return body


class _BadRequest(Exception):
    pass


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer unknown paths and methods with Triton's JSON error body, which tritonclient decodes."""
    try:
        return await handler(request)
    except _BadRequest as error:
        return _error(400, str(error))
    except web.HTTPException as error:
        return _error(error.status, error.reason)
