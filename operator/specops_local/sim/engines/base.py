"""The runtime every simulated engine shares: start-up, the clock, the per-iteration model, generation.

An engine is built from an `EngineConfig` (what `config.parse` read from the container's
command, args and files). `start()` binds its ports at once but serves nothing until it has
"loaded": each backend says when its port starts accepting connections (`listen_fraction` of
`restart_s`) and answers its health endpoint with success only after `restart_s` seconds.

Time is simulated: `advance(dt)` integrates dt seconds of decoding at the load in force. Each
integration tick is a run of engine iterations at one batch (the load's, with noise): the engine
takes K from its own schedule at that batch (`spec.k_at`), and one iteration lasts

- ``plain_ms`` for an engine started without speculation,
- ``k0_ms`` (default ``plain_ms``) for a speculating engine whose schedule gives K=0,
- the profile's speculative round at K otherwise, emitting E(alpha, K) tokens per request,

from the serving profile, else from the roofline (`specops.domain.perf`). The batch and K of
the last tick are `batch` and `k`; `seconds_at_k` and `iterations_at_k` add them up.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web

from specops.domain import perf
from specops.domain.profile import ServingProfile
from specops_local.sim.engines.config import Backend, EngineConfig
from specops_local.sim.load import LoadPoint, LoadSchedule, constant
from specops_local.sim.metrics import (
    E2E_BUCKETS,
    PROMETHEUS_TEXT_CONTENT_TYPE,
    TPOT_BUCKETS,
    Exposition,
    Histogram,
)
from specops_local.sim.text import greedy_text

MAX_RUNNING_REQUESTS = 256
MAX_TICK_SECONDS = 0.25
LATENCY_SAMPLES_PER_SECOND = 40.0
DEFAULT_SETUP = perf.ModelSetup(
    gpu=perf.GPUS["H100"], target_params=70e9, draft_params=1e9, tensor_parallel=4, efficiency=0.5
)
"""The roofline world of an engine given neither a profile nor a setup."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Totals:
    """What an engine has done since it started (each backend exports its own view of it)."""

    iterations: float = 0.0
    spec_steps: float = 0.0
    """Request-iterations that carried draft tokens (vLLM's num_drafts, SGLang's verify calls)."""
    verify_calls: float = 0.0
    """Request-iterations of a speculating engine, K=0 included (SGLang counts them all)."""
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    requests: int = 0
    failures: int = 0
    request_duration_s: float = 0.0
    token_tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    """One observation per emitted token (an inter-token latency histogram)."""
    request_tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    """One observation per finished request: its mean time per output token."""
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    last_accept_rate: float = 0.0
    last_accept_length: float = 1.0
    completion_carry: float = 0.0
    token_carry: float = 0.0
    sample_carry: float = 0.0


class SimEngine:
    """One simulated serving engine (subclasses: one per backend)."""

    backend: ClassVar[Backend]
    listen_fraction: ClassVar[float] = 1.0
    """When the API port starts accepting connections, as a fraction of restart_s (1: at ready)."""
    metrics_path: ClassVar[str] = "/metrics"

    def __init__(
        self,
        name: str,
        config: EngineConfig,
        *,
        setup: perf.ModelSetup | None = None,
        serving_profile: ServingProfile | None = None,
        load: LoadPoint | None = None,
        draft_alpha: float | None = None,
        lossless: bool = True,
        draft_identity: str = "",
        restart_s: float | None = None,
        noise_sigma: float = 0.0,
        batch_noise: float = 0.0,
        alpha_noise: float = 0.0,
        seed: int = 0,
        host: str = "127.0.0.1",
        tick_interval: float | None = 0.2,
        realtime_generate: bool = False,
    ) -> None:
        if config.backend != self.backend:
            raise ValueError(f"a {self.backend} engine cannot run a {config.backend} configuration")
        self.name = name
        self.config = config
        self.metrics_fault: str | None = None
        """A faulty exporter: every sample served as NaN, +Inf or negative (sim.metrics.CORRUPTIONS)."""
        self.spec = config.spec
        self.setup = setup or DEFAULT_SETUP
        self.serving_profile = serving_profile
        self.draft_alpha = draft_alpha
        self.lossless = lossless
        self.draft_identity = draft_identity or (self.spec.draft_model or "" if self.spec else "")
        if restart_s is None:
            restart_s = serving_profile.restart_seconds if serving_profile is not None else 120.0
        if restart_s < 0:
            raise ValueError("restart_s must be >= 0")
        self.restart_s = restart_s
        self.noise_sigma = noise_sigma
        self.batch_noise = batch_noise
        self.alpha_noise = alpha_noise
        self.host = host
        self.tick_interval = tick_interval
        self.realtime_generate = realtime_generate
        self.max_running = int(config.options.get("max_num_seqs", MAX_RUNNING_REQUESTS))
        self._random = random.Random(seed)
        default_alpha = 0.7
        if serving_profile is not None and serving_profile.alpha is not None:
            default_alpha = serving_profile.alpha
        self._schedule: LoadSchedule = constant(load or LoadPoint(batch=0.0, alpha=default_alpha))
        self._schedule_origin = 0.0
        self._time = 0.0
        self.totals = Totals()
        self.batch = 0
        """Running requests in the last simulated iteration."""
        self.waiting = 0
        self.k = 0
        """The draft length the engine's schedule gave at that batch (0 when plain or off)."""
        self.seconds_at_k: dict[int, float] = {}
        self.iterations_at_k: dict[int, float] = {}
        self.generate_requests = 0
        self.http_port = 0
        self.metrics_port = 0
        self.state = "stopped"
        """stopped, starting (refusing or answering 503), ready."""
        self.started_at: float | None = None
        self._sockets: dict[str, socket.socket] = {}
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._in_flight = 0
        self._context_tokens = 0.0
        self._ready_event = asyncio.Event()

    # ----------------------------------------------------------------- schedule

    def k_at(self, batch: int) -> int:
        """The K this engine drafts at ``batch`` running requests (0 without speculation)."""
        return self.spec.k_at(batch) if self.spec is not None else 0

    @property
    def max_k(self) -> int:
        return self.spec.max_k if self.spec is not None else 0

    # ----------------------------------------------------------------- lifecycle

    @property
    def running(self) -> bool:
        return self.state != "stopped"

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def url(self) -> str:
        """The API's base URL."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}{self.metrics_path}"

    @property
    def separate_metrics_port(self) -> bool:
        return False

    @property
    def metrics_mounted(self) -> bool:
        """Whether the metrics path answers (trtllm-serve mounts it only with return_perf_metrics)."""
        return True

    async def start(self) -> None:
        """Start the process: bind the ports now, listen and become ready as the backend does."""
        if self.running:
            return
        self.totals = Totals()
        self.seconds_at_k.clear()
        self.iterations_at_k.clear()
        self.batch = self.waiting = self.k = 0
        self._sockets["http"] = self._bind(self.http_port)
        self.http_port = self._sockets["http"].getsockname()[1]
        if self.separate_metrics_port:
            self._sockets["metrics"] = self._bind(self.metrics_port)
            self.metrics_port = self._sockets["metrics"].getsockname()[1]
        else:
            self.metrics_port = self.http_port
        self.state = "starting"
        self.started_at = time.monotonic()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._boot(), name=f"sim-engine-{self.name}-boot"))
        if self.tick_interval is not None:
            self._tasks.append(loop.create_task(self._tick_forever(), name=f"sim-engine-{self.name}-ticker"))

    def _bind(self, port: int) -> socket.socket:
        """Bound without listening: connections are refused until the server takes the socket over."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, port))
        except OSError:
            sock.close()
            raise
        return sock

    async def _boot(self) -> None:
        await asyncio.sleep(self.restart_s * self.listen_fraction)
        await self._listen()
        await asyncio.sleep(self.restart_s * (1.0 - self.listen_fraction))
        self.state = "ready"
        self._ready_event.set()

    async def _listen(self) -> None:
        app = web.Application(middlewares=[self._middleware])
        self.add_routes(app)
        if not self.separate_metrics_port and self.metrics_mounted:
            app.router.add_get(self.metrics_path, self._handle_metrics)
        await self._serve(app, self._sockets["http"])
        if self.separate_metrics_port:
            metrics = web.Application()
            metrics.router.add_get(self.metrics_path, self._handle_metrics)
            await self._serve(metrics, self._sockets["metrics"])

    async def _serve(self, app: web.Application, sock: socket.socket) -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._runners.append(runner)
        await web.SockSite(runner, sock).start()

    async def stop(self) -> None:
        """Stop the process: close the ports; `start()` again is a fresh start (restart_s again)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()
        for sock in self._sockets.values():
            with contextlib.suppress(OSError):
                sock.close()
        self._sockets.clear()
        self.state = "stopped"
        self._ready_event.clear()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def wait_ready(self) -> None:
        """Until the engine is ready (wrap in asyncio.timeout: a refused config never is)."""
        await self._ready_event.wait()

    async def __aenter__(self) -> SimEngine:
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

    # ----------------------------------------------------------------- load and clock

    @property
    def time(self) -> float:
        """Simulated seconds integrated so far."""
        return self._time

    def set_load(self, point: LoadPoint) -> None:
        self.set_schedule(constant(point))

    def set_schedule(self, schedule: LoadSchedule) -> None:
        """Install a load schedule; its t = 0 is now."""
        self._schedule = schedule
        self._schedule_origin = self._time

    @property
    def load_point(self) -> LoadPoint:
        return self._schedule(self._time - self._schedule_origin)

    def alpha(self, offered: float) -> float:
        """Per-token acceptance of this engine's draft: the draft's own where given, else the load's."""
        return self.draft_alpha if self.draft_alpha is not None else offered

    def advance(self, dt: float, max_tick: float = MAX_TICK_SECONDS) -> None:
        """Integrate dt simulated seconds in ticks of at most ``max_tick``."""
        if dt < 0:
            raise ValueError("time only moves forward")
        if max_tick <= 0:
            raise ValueError("max_tick must be positive")
        while dt > 1e-12:
            tick = min(dt, max_tick)
            self._integrate(tick)
            self._time += tick
            dt -= tick

    def step_seconds(self, batch: float, k: int) -> float:
        """One iteration at this batch and K (see the module docstring)."""
        profile = self.serving_profile
        if profile is not None:
            if self.spec is None:
                return profile.plain_ms_at(batch) / 1e3
            if k <= 0:
                return profile.k0_ms_at(batch) / 1e3
            if k > profile.max_length:
                return _extrapolated_round_ms(profile, k, batch) / 1e3
            return profile.round_ms_at(k, batch) / 1e3
        setup = self.setup.with_context(self._context_tokens) if self._context_tokens else self.setup
        return perf.speculative_step_time(setup, batch, k)

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
        offered = self._sample_batch(point.batch)
        self.batch = min(offered, self.max_running)
        self.waiting = offered - self.batch
        self.k = self.k_at(self.batch) if self.batch > 0 else self.k
        if not self.ready or self.batch == 0:
            return
        self._context_tokens = point.context_tokens
        alpha = self.alpha(point.alpha)
        if self.alpha_noise > 0:
            alpha = min(0.99, max(0.01, self._random.gauss(alpha, self.alpha_noise)))
        self._record(self.batch, self.k, alpha, dt, point.mean_output_tokens)

    def _record(self, batch: int, k: int, alpha: float, dt: float, mean_output_tokens: float) -> None:
        step = self.step_seconds(batch, k)
        per_step = perf.expected_tokens(alpha, k)
        iterations = dt / step
        t = self.totals
        self.seconds_at_k[k] = self.seconds_at_k.get(k, 0.0) + dt
        self.iterations_at_k[k] = self.iterations_at_k.get(k, 0.0) + iterations
        t.iterations += iterations
        if self.spec is not None:
            t.verify_calls += batch * iterations
        if k > 0:
            t.spec_steps += batch * iterations
            t.draft_tokens += batch * k * iterations
            t.accepted_tokens += batch * (per_step - 1.0) * iterations
            t.last_accept_rate = (per_step - 1.0) / k
        if self.spec is not None:
            t.last_accept_length = per_step
        t.generation_tokens += batch * per_step * iterations

        tpot = step / per_step
        t.token_carry += batch * per_step * iterations
        tokens = math.floor(t.token_carry)
        t.token_carry -= tokens
        t.sample_carry += LATENCY_SAMPLES_PER_SECOND * dt
        samples = math.floor(t.sample_carry)
        t.sample_carry -= samples
        if tokens > 0 and self.noise_sigma <= 0:
            t.token_tpot.observe(tpot, tokens)
        elif tokens > 0:
            groups = min(tokens, max(1, samples))
            share, remainder = divmod(tokens, groups)
            for group in range(groups):
                t.token_tpot.observe(self._noisy(tpot), share + (1 if group < remainder else 0))

        t.completion_carry += batch * per_step * iterations / mean_output_tokens
        completed = math.floor(t.completion_carry)
        t.completion_carry -= completed
        self._finish(completed, tpot, mean_output_tokens)

    def _finish(self, completed: int, tpot: float, output_tokens: float) -> None:
        t = self.totals
        t.requests += completed
        t.prompt_tokens += completed * 16
        if completed > 0 and self.noise_sigma <= 0:
            t.request_tpot.observe(tpot, completed)
            t.e2e.observe(tpot * output_tokens, completed)
            t.request_duration_s += tpot * output_tokens * completed
            return
        for _ in range(completed):
            observed = self._noisy(tpot)
            t.request_tpot.observe(observed)
            t.e2e.observe(observed * output_tokens)
            t.request_duration_s += observed * output_tokens

    # ----------------------------------------------------------------- generation

    def output_salt(self) -> str | None:
        """A lossy draft's outputs part from the target's greedy ones (only while it speculates)."""
        if self.spec is None or self.lossless:
            return None
        return f"{self.draft_identity}:{self.spec.method}"

    async def complete(self, prompt: str, max_tokens: int, temperature: float = 0.0) -> str:
        """The text the engine returns; greedy and deterministic at temperature 0."""
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        self.generate_requests += 1
        if temperature > 0:
            prompt = f"{prompt}\x00sample{self._random.random()}"
        if self.realtime_generate:
            await self._decode_in_real_time(max_tokens)
        return greedy_text(prompt, max_tokens, self.output_salt())

    async def _decode_in_real_time(self, max_tokens: int) -> None:
        """Take the wall time ``max_tokens`` would take at the batch in flight, in ~20 ms chunks."""
        point = self.load_point
        alpha = self.alpha(point.alpha)
        loop = asyncio.get_running_loop()
        due = loop.time()
        started = due
        self._in_flight += 1
        try:
            produced = 0.0
            while produced < max_tokens - 1e-9:
                batch = max(1, self._in_flight + round(self.load_point.batch))
                k = self.k_at(batch)
                self.batch, self.k = batch, k
                step = self.step_seconds(batch, k)
                per_step = perf.expected_tokens(alpha, k)
                iterations = min(max(1.0, 0.02 / step), (max_tokens - produced) / per_step)
                due += iterations * step  # sleep to a deadline, so timer lateness does not add up
                await asyncio.sleep(max(0.0, due - loop.time()))
                produced += iterations * per_step
                self._record_request_iterations(k, per_step, step, iterations)
            elapsed = loop.time() - started
            self._finish(1, elapsed / max(1, max_tokens), max_tokens)
        finally:
            self._in_flight -= 1

    def _record_request_iterations(self, k: int, per_step: float, step: float, iterations: float) -> None:
        """One request's share of ``iterations`` engine iterations (realtime generation)."""
        t = self.totals
        self.seconds_at_k[k] = self.seconds_at_k.get(k, 0.0) + iterations * step
        self.iterations_at_k[k] = self.iterations_at_k.get(k, 0.0) + iterations
        t.iterations += iterations
        if self.spec is not None:
            t.verify_calls += iterations
            t.last_accept_length = per_step
        if k > 0:
            t.spec_steps += iterations
            t.draft_tokens += k * iterations
            t.accepted_tokens += (per_step - 1.0) * iterations
            t.last_accept_rate = (per_step - 1.0) / k
        t.generation_tokens += per_step * iterations
        t.token_tpot.observe(step / per_step, max(1, round(iterations * per_step)))

    # ----------------------------------------------------------------- HTTP

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def health_paths(self) -> frozenset[str]:
        """Paths answered while starting (everything else is 503 until ready)."""
        return frozenset()

    def starting_response(self) -> web.Response:
        return web.json_response({"error": "the server is starting"}, status=503)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.ready and request.path not in self.health_paths():
            return self.starting_response()
        try:
            return await handler(request)
        except BadRequest as error:
            return self.error_response(error.status, str(error))
        except web.HTTPException as error:
            return self.error_response(error.status, error.reason)

    def error_response(self, status: int, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status)

    async def _handle_metrics(self, request: web.Request) -> web.Response:
        out = Exposition(self.metrics_fault)
        self.render_metrics(out)
        return web.Response(body=out.text().encode(), headers={"Content-Type": PROMETHEUS_TEXT_CONTENT_TYPE})

    def render_metrics(self, out: Exposition) -> None:
        raise NotImplementedError

    def metrics_text(self) -> str:
        out = Exposition()
        self.render_metrics(out)
        return out.text()


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


async def json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as error:
        raise BadRequest(f"malformed JSON body: {error}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def int_field(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{key} must be an integer")
    if value < 0:
        raise BadRequest(f"{key} must be >= 0")
    return value


def float_field(body: dict[str, Any], key: str, default: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{key} must be a number")
    return float(value)


def _extrapolated_round_ms(profile: ServingProfile, k: int, batch: float) -> float:
    """A round longer than the profile measured: linear in K from its two longest lengths."""
    lengths = profile.lengths
    top = profile.round_ms_at(lengths[-1], batch)
    below = profile.round_ms_at(lengths[-2], batch) if len(lengths) > 1 else profile.plain_ms_at(batch)
    span = lengths[-1] - (lengths[-2] if len(lengths) > 1 else 0)
    return top + (top - below) * (k - lengths[-1]) / span
