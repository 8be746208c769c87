"""`specops profile`: measure a serving profile (docs/profiles.md) from live engines, one revision per K.

A speculating engine drafts what its start-up configuration says, so each draft length is its
own engine: the user passes every engine's URL with the draft length it was started with
(`0`: a plain revision, started without speculation; `K`: a constant schedule drafting K;
`k0`: started with speculation whose schedule gives K=0 at every batch swept). For each engine
and batch N, N workers hold N greedy requests in flight through the engine's own completions
(OpenAI) or generate (KServe) endpoint, so the engine decodes a batch of N. After a warm-up,
one window of `duration` seconds is measured between two scrapes of the engine's metrics:

- per-token latency: the mean of the engine's own latency histogram over the window (vLLM's and
  SGLang's inter-token latency, trtllm's and specops's Triton model's per-request time per
  output token: the `tpot_histogram` of its adapter), else the client's wall time per token
  (which includes HTTP and the client's scheduling, so it reads slower);
- tokens per round E: from the engine's speculation counters over the window (1 + accepted /
  drafts; 1 + K x accepted / drafted tokens; 1 + K x the acceptance-rate gauge), else from
  `--alpha`.

A cell gives ``plain_ms[N]`` (engine 0), ``round_ms[K][N] = per-token x E`` (engine K), and
``k0_ms[N]`` (engine k0). The profile's alpha is inverted from the measured E. The raw cells
are written under ``measured`` (the loader ignores them).

Pure parts (parsing the options and the exposition, building the profile, the summary) are
separate from the I/O (`run`), and every failure is a `ProfilingError` with one line of text.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson

from specops.adapters.engine_client import BACKENDS, generate_body, generate_path, health_path
from specops.domain.acceptance import alpha_from_mean_accepted_length
from specops.domain.engines import engine_for
from specops.domain.engines.base import Engine
from specops.domain.perf import expected_tokens
from specops.domain.profile import ProfileError, ServingProfile

Kind = Literal["plain", "spec", "k0"]
Timing = Literal["engine", "client"]

PROMPT = "Explain speculative decoding in one paragraph, then give three examples of where it helps."
DEFAULT_BATCHES = "1,2,4,8,16,32"
DEFAULT_DURATION = "30s"
DEFAULT_MAX_TOKENS = 128
DEFAULT_TIMEOUT = "5m"
PROBE_TIMEOUT_S = 5.0
MAX_BATCH = 1024
OLD_OPTIONS = {
    "--lengths": "draft lengths come from the engines: pass --engine K=URL once per revision (0 = plain)",
    "--url": "pass each engine as --engine K=URL (0 = plain)",
    "--concurrency": "the concurrencies to sweep are --batches",
    "--metrics-url": "pass --metrics K=URL for an engine whose metrics are not at its default path",
}
"""Options of the former per-request interface, and what takes their place."""


class ProfilingError(Exception):
    """Why a profile cannot be measured, in one line."""


# ----------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class EngineRef:
    """One engine as the user named it: the revision it runs and where it answers."""

    label: str
    """"0", "K" or "k0", as given."""
    kind: Kind
    k: int
    """The draft length it was started with (0 for plain and k0)."""
    url: str
    metrics_url: str | None = None
    """None: the backend's default metrics endpoint on the same host."""

    @property
    def name(self) -> str:
        return f"{self.label}={self.url}"


def parse_label(text: str) -> tuple[Kind, int]:
    label = text.strip().lower()
    if label == "k0":
        return "k0", 0
    if not label.isdigit():
        raise ProfilingError(
            f"draft length {text!r}: expected 0 (a plain revision), a draft length K >= 1, or k0 "
            "(a speculating revision whose schedule gives K=0)"
        )
    k = int(label)
    return ("plain", 0) if k == 0 else ("spec", k)


def normalise_url(text: str, what: str) -> str:
    url = text.strip()
    if "://" not in url:
        url = f"http://{url}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProfilingError(f"{what}: {text!r} is not an http(s) URL")
    try:
        parts.port  # noqa: B018 (raises on a malformed port)
    except ValueError:
        raise ProfilingError(f"{what}: {text!r} has an invalid port") from None
    return url.rstrip("/")


def _split_pair(text: str, option: str) -> tuple[str, str]:
    label, sep, url = text.partition("=")
    if not sep or not label.strip() or not url.strip():
        raise ProfilingError(f"{option} {text!r}: expected K=URL, e.g. {option} 2=http://spec-k2:8000")
    return label, url


def parse_engines(engines: Sequence[str], metrics: Sequence[str] = ()) -> list[EngineRef]:
    """``--engine K=URL`` (repeatable) and ``--metrics K=URL`` into engines, sorted plain, k0, K."""
    refs: dict[str, EngineRef] = {}
    for text in engines:
        label, url = _split_pair(text, "--engine")
        kind, k = parse_label(label)
        key = "k0" if kind == "k0" else str(k)
        if key in refs:
            raise ProfilingError(f"--engine {key} is given twice: one engine per draft length")
        refs[key] = EngineRef(key, kind, k, normalise_url(url, f"--engine {key}"))
    for text in metrics:
        label, url = _split_pair(text, "--metrics")
        kind, k = parse_label(label)
        key = "k0" if kind == "k0" else str(k)
        if key not in refs:
            raise ProfilingError(f"--metrics {key}: no --engine {key}=URL to go with it")
        refs[key] = EngineRef(key, kind, k, refs[key].url, normalise_url(url, f"--metrics {key}"))
    if "0" not in refs:
        raise ProfilingError(
            "no plain engine: pass --engine 0=URL (a revision started without speculation) for plain_ms"
        )
    if not any(ref.kind == "spec" for ref in refs.values()):
        raise ProfilingError("no speculating engine: pass --engine K=URL (started drafting K) for round_ms")
    order = {"plain": 0, "k0": 1, "spec": 2}
    return sorted(refs.values(), key=lambda ref: (order[ref.kind], ref.k))


def parse_batches(text: str) -> list[int]:
    """``1,2,4,8`` into sorted distinct batches in 1..MAX_BATCH."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ProfilingError(f"--batches {text!r}: expected comma-separated integers, e.g. 1,4,16") from None
    if not values or any(v < 1 or v > MAX_BATCH for v in values):
        raise ProfilingError(f"--batches {text!r}: every batch must be between 1 and {MAX_BATCH}")
    return sorted(set(values))


# ----------------------------------------------------------------------------------- metrics


def parse_exposition(text: str) -> dict[str, float]:
    """Sample name -> the sum of its values over every label set (Prometheus text format)."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, _, rest = line.partition("{")
            rest = rest.rpartition("}")[2]
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            sums[name.strip()] = sums.get(name.strip(), 0.0) + value
    return sums


def default_metrics_url(engine: Engine, url: str) -> str:
    """The engine's metrics endpoint: its adapter's path, on the API port or its own metrics port."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if engine.metrics_port != engine.http_port:
        port = next(p.number for p in engine.ports if p.name == engine.metrics_port)
        host = parts.hostname or ""
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, engine.metrics_path, "", ""))


@dataclass(frozen=True)
class Window:
    """What the engine's metrics say about one measured window (None: not exported)."""

    per_token_s: float | None
    tokens_per_step: float | None
    drafted_tokens: float | None
    draft_length: float | None


def read_window(engine: Engine, k: int, before: Mapping[str, float], after: Mapping[str, float]) -> Window:
    """The window between two scrapes, read through the adapter's metric names."""
    names = engine.metrics

    def delta(name: str | None) -> float | None:
        if name is None or name not in after:
            return None
        return after[name] - before.get(name, 0.0)

    count = delta(f"{names.tpot_histogram}_count")
    total = delta(f"{names.tpot_histogram}_sum")
    per_token = total / count if count and total is not None and count > 0 and total > 0 else None
    accepted = delta(names.accepted_tokens)
    steps = delta(names.draft_steps)
    drafted = delta(names.drafted_tokens)
    tokens_per_step = None
    if k > 0:
        if accepted is not None and steps is not None and steps > 0:
            tokens_per_step = 1.0 + accepted / steps
        elif accepted is not None and drafted is not None and drafted > 0:
            tokens_per_step = 1.0 + k * accepted / drafted
        elif names.acceptance_rate_gauge is not None and names.acceptance_rate_gauge in after:
            tokens_per_step = 1.0 + k * after[names.acceptance_rate_gauge]
        if tokens_per_step is not None:
            tokens_per_step = min(max(tokens_per_step, 1.0), k + 1.0)
    gauge = names.draft_length_gauge
    draft_length = after.get(gauge) if gauge is not None else None
    return Window(per_token, tokens_per_step, drafted, draft_length)


def measures_acceptance(engine: Engine, samples: Mapping[str, float]) -> bool:
    names = engine.metrics
    if names.accepted_tokens is not None and names.accepted_tokens in samples:
        return (names.draft_steps or "") in samples or (names.drafted_tokens or "") in samples
    return names.acceptance_rate_gauge is not None and names.acceptance_rate_gauge in samples


# ----------------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class Cell:
    """One (engine, batch) measurement."""

    label: str
    kind: Kind
    k: int
    batch: int
    requests: int
    """Requests that finished inside the window."""
    per_token_s: float
    """The engine's per-token latency (or the client's, when timing is client-side)."""
    client_per_token_s: float | None
    tokens_per_step: float | None
    """E measured from the engine's counters (None: not measured; plain and k0 are 1)."""
    timing: Timing

    def round_ms(self, alpha: float | None) -> float:
        """ms per round (a decode step for plain and k0): per-token latency x tokens per round."""
        e = self.tokens_per_step
        if e is None:
            if self.kind != "spec":
                e = 1.0
            elif alpha is None:
                raise ProfilingError(
                    f"engine {self.label}: acceptance is not measured (no speculation counters): pass --alpha"
                )
            else:
                e = expected_tokens(alpha, self.k)
        return self.per_token_s * e * 1e3

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.label,
            "draft_length": self.k,
            "batch": self.batch,
            "requests": self.requests,
            "timing": self.timing,
            "per_token_ms": round(self.per_token_s * 1e3, 4),
            "client_per_token_ms": None
            if self.client_per_token_s is None
            else round(self.client_per_token_s * 1e3, 4),
            "tokens_per_step": None if self.tokens_per_step is None else round(self.tokens_per_step, 4),
        }


def measured_alpha(cells: Sequence[Cell]) -> float | None:
    """The mean of the per-token acceptance inverted from each speculating cell's measured E."""
    values = [
        alpha_from_mean_accepted_length(c.tokens_per_step, c.k)
        for c in cells
        if c.kind == "spec" and c.tokens_per_step is not None
    ]
    return sum(values) / len(values) if values else None


def build_profile(
    name: str, cells: Sequence[Cell], *, alpha: float | None = None, source: str = ""
) -> dict[str, Any]:
    """The serving profile of the cells (every engine at every batch), plus the raw cells."""
    batches = sorted({c.batch for c in cells})
    by = {(c.label, c.batch): c for c in cells}
    labels = {c.label: c for c in cells}
    missing = [(label, b) for label in labels for b in batches if (label, b) not in by]
    if missing:
        raise ProfilingError(f"engine {missing[0][0]} has no measurement at batch {missing[0][1]}")
    found = measured_alpha(cells)
    use_alpha = alpha if alpha is not None else found
    if use_alpha is not None:
        use_alpha = min(max(use_alpha, 0.0), 0.9999)

    def row(label: str) -> list[float]:
        return [round(by[(label, b)].round_ms(use_alpha), 4) for b in batches]

    lengths = sorted(c.k for c in labels.values() if c.kind == "spec")
    profile: dict[str, Any] = {
        "name": name,
        "batches": batches,
        "plain_ms": row("0"),
        "round_ms": {str(k): row(str(k)) for k in lengths},
        "alpha": None if use_alpha is None else round(use_alpha, 4),
    }
    if "k0" in labels:
        profile["k0_ms"] = row("k0")
    profile["source"] = source or "specops profile"
    profile["measured"] = [c.to_dict() for c in cells]
    try:
        ServingProfile.from_dict(profile)  # what is written must load
    except ProfileError as error:
        raise ProfilingError(f"the measured profile is not valid: {error}") from None
    return profile


def best_measured(profile: ServingProfile, alpha: float, batch: float) -> tuple[int, float]:
    """The measured draft length (0: off) with the highest speedup at this alpha and batch."""
    best_k, best_s = 0, 1.0
    for k in profile.lengths:
        speedup = profile.speedup(alpha, k, batch)
        if speedup > best_s:
            best_k, best_s = k, speedup
    return best_k, best_s


def summary(profile: ServingProfile, alpha_source: str = "") -> str:
    """Per batch: ms per step and per round, the speedup of each length at the profile's alpha."""
    alpha = profile.alpha
    lengths = profile.lengths
    head = f"{'batch':>6} {'plain ms':>9}"
    if profile.k0_ms is not None:
        head += f" {'K=0 ms':>8}"
    head += "".join(f" {f'K={k} ms':>9}" for k in lengths)
    if alpha is not None:
        head += "".join(f" {f'K={k}':>7}" for k in lengths) + "  best"
    lines = [head]
    for index, batch in enumerate(profile.batches):
        line = f"{batch:>6g} {profile.plain_ms[index]:>9.2f}"
        if profile.k0_ms is not None:
            line += f" {profile.k0_ms[index]:>8.2f}"
        line += "".join(f" {profile.round_ms[k][index]:>9.2f}" for k in lengths)
        if alpha is not None:
            line += "".join(f" {profile.speedup(alpha, k, batch):>6.2f}x" for k in lengths)
            best_k, best_s = best_measured(profile, alpha, batch)
            line += "  off" if best_k == 0 else f"  K={best_k} {best_s:.2f}x"
        lines.append(line)
    if alpha is None:
        lines.append("acceptance not measured: pass --alpha for speedups")
        return "\n".join(lines)
    top = int(profile.batches[-1])
    found = next((b for b in range(1, top + 1) if best_measured(profile, alpha, b)[0] == 0), None)
    if found == 1:
        verdict = "never pays"
    else:
        verdict = (
            f"pays at every batch up to {top}"
            if found is None
            else f"pays up to batch {found - 1}; break-even batch {found}"
        )
    shown = f" ({alpha_source})" if alpha_source else ""
    lines.append(f"alpha {alpha:.2f}{shown}; speculation {verdict}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- I/O


@dataclass(frozen=True)
class Settings:
    backend: str
    engines: Sequence[EngineRef]
    batches: Sequence[int]
    duration_s: float
    warmup_s: float
    max_tokens: int
    model: str | None = None
    prompt: str = PROMPT
    alpha: float | None = None
    use_metrics: bool = True
    client_timing: bool = False
    timeout_s: float = 300.0
    name: str = "measured"


@dataclass
class Target:
    """An engine ready to be measured: where to send requests and what its metrics offer."""

    ref: EngineRef
    model: str
    metrics_url: str | None
    samples: dict[str, float] | None
    """The preflight scrape (None: metrics not read)."""
    note: str = ""
    """Why the engine's metrics are not used, when they are not."""


class Progress(Protocol):
    """How `run` reports while it measures (the CLI draws a progress bar)."""

    def start(self, total: int) -> None:
        """``total`` cells are about to be measured."""

    def begin(self, label: str, batch: int) -> None:
        """Engine ``label`` is about to be measured at ``batch``."""

    def cell(self, cell: Cell) -> None:
        """One cell is measured."""

    def warn(self, text: str) -> None:
        """Something the user should know that does not stop the measurement."""


class Silent:
    """A Progress that says nothing."""

    def start(self, total: int) -> None:
        pass

    def begin(self, label: str, batch: int) -> None:
        pass

    def cell(self, cell: Cell) -> None:
        pass

    def warn(self, text: str) -> None:
        pass


def _reason(error: BaseException, timeout_s: float) -> str:
    if isinstance(error, asyncio.TimeoutError):
        return f"timed out after {timeout_s:g} s"
    if isinstance(error, aiohttp.ClientConnectorError):
        if error.os_error is not None and error.os_error.errno == errno.ECONNREFUSED:
            return "connection refused"
        cause = error.os_error.strerror if error.os_error is not None else None
        return f"cannot connect ({cause or error})"
    if isinstance(error, aiohttp.InvalidURL):
        return f"invalid URL {error}"
    return re.sub(r"\s+", " ", f"{type(error).__name__}: {error}").strip()


def _detail(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    with contextlib.suppress(orjson.JSONDecodeError):
        body = orjson.loads(raw)
        if isinstance(body, dict):
            for key in ("error", "message", "detail"):
                value = body.get(key)
                if isinstance(value, dict):
                    value = value.get("message")
                if isinstance(value, str) and value:
                    text = value
                    break
    return re.sub(r"\s+", " ", text).strip()[:200]


async def _get(session: aiohttp.ClientSession, url: str, timeout_s: float = PROBE_TIMEOUT_S) -> bytes:
    """GET a URL; ProfilingError (the URL and why) unless it answers 200."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            raw = await response.read()
            status = response.status
    except Exception as error:  # refused, reset, timed out: one line naming the URL
        raise ProfilingError(f"GET {url}: {_reason(error, timeout_s)}") from None
    if status != 200:
        raise ProfilingError(f"GET {url}: HTTP {status} {_detail(raw)}".rstrip())
    return raw


async def _served_model(session: aiohttp.ClientSession, ref: EngineRef) -> str:
    raw = await _get(session, f"{ref.url}/v1/models")
    with contextlib.suppress(orjson.JSONDecodeError, TypeError, KeyError, IndexError):
        name = orjson.loads(raw)["data"][0]["id"]
        if isinstance(name, str) and name:
            return name
    raise ProfilingError(f"engine {ref.name}: /v1/models names no model: pass --model")


async def prepare(
    session: aiohttp.ClientSession, settings: Settings, engine: Engine, ref: EngineRef
) -> Target:
    """Check that the engine is up and ready, find its model name, and scrape its metrics once."""
    try:
        await _get(session, ref.url + health_path(settings.backend))
    except ProfilingError as error:
        raise ProfilingError(f"engine {ref.label} is not reachable or not ready: {error}") from None
    model = settings.model or ""
    if not model and settings.backend != "triton":
        try:
            model = await _served_model(session, ref)
        except ProfilingError as error:
            raise ProfilingError(f"engine {ref.label}: {error} (or pass --model)") from None
    if not settings.use_metrics:
        return Target(ref, model, None, None, "--no-metrics")
    metrics_url = ref.metrics_url or default_metrics_url(engine, ref.url)
    try:
        samples = parse_exposition((await _get(session, metrics_url)).decode("utf-8", errors="replace"))
    except ProfilingError as error:
        if ref.metrics_url is not None:  # the user named it: that it fails is an error
            raise ProfilingError(f"engine {ref.label} metrics: {error}") from None
        return Target(ref, model, None, None, f"no metrics at {metrics_url} ({error})")
    note = ""
    if f"{engine.metrics.tpot_histogram}_count" not in samples:
        note = f"{metrics_url} exports no {engine.metrics.tpot_histogram}"
    return Target(ref, model, metrics_url, samples, note)


async def _scrape(session: aiohttp.ClientSession, target: Target) -> dict[str, float] | None:
    if target.metrics_url is None:
        return None
    try:
        raw = await _get(session, target.metrics_url)
    except ProfilingError as error:
        raise ProfilingError(f"engine {target.ref.label} metrics: {error}") from None
    return parse_exposition(raw.decode("utf-8", errors="replace"))


def request_body(backend: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A greedy request that runs to max_tokens (OpenAI servers are told to ignore the end token)."""
    body = generate_body(backend, model, prompt, max_tokens)
    if backend != "triton":
        body["ignore_eos"] = True
    return body


async def _complete(session: aiohttp.ClientSession, settings: Settings, target: Target, prompt: str) -> int:
    """One request; the tokens it generated (usage.completion_tokens where given, else max_tokens)."""
    endpoint = target.ref.url + generate_path(settings.backend)
    body = request_body(settings.backend, target.model, prompt, settings.max_tokens)
    try:
        async with session.post(
            endpoint, json=body, timeout=aiohttp.ClientTimeout(total=settings.timeout_s)
        ) as response:
            raw = await response.read()
            status = response.status
    except Exception as error:
        raise ProfilingError(
            f"engine {target.ref.label}: POST {endpoint}: {_reason(error, settings.timeout_s)}"
        ) from None
    if status != 200:
        raise ProfilingError(f"engine {target.ref.label}: POST {endpoint}: HTTP {status} {_detail(raw)}")
    with contextlib.suppress(orjson.JSONDecodeError, TypeError, KeyError, AttributeError):
        tokens = orjson.loads(raw)["usage"]["completion_tokens"]
        if isinstance(tokens, int) and tokens > 0:
            return tokens
    return settings.max_tokens


async def measure_cell(
    session: aiohttp.ClientSession,
    settings: Settings,
    engine: Engine,
    target: Target,
    batch: int,
    timing: Timing,
) -> Cell:
    """Hold ``batch`` requests in flight; measure one window after the warm-up; let requests drain."""
    ref = target.ref
    finished: list[tuple[float, float]] = []  # (end time, seconds per token)
    stopping = asyncio.Event()

    async def worker(index: int) -> None:
        sequence = 0
        while not stopping.is_set():
            # distinct prompts, so no engine serves one request from another's prefix cache
            prompt = f"{settings.prompt} (request {index}.{sequence})"
            sequence += 1
            started = time.monotonic()
            tokens = await _complete(session, settings, target, prompt)
            ended = time.monotonic()
            finished.append((ended, (ended - started) / tokens))

    workers = [asyncio.create_task(worker(i), name=f"profile-{ref.label}-{i}") for i in range(batch)]

    async def hold(seconds: float) -> None:
        """Sleep while the workers run; a failed request ends the cell at once."""
        done, _ = await asyncio.wait(workers, timeout=seconds, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()  # raises the worker's ProfilingError
        if done:
            raise ProfilingError(f"engine {ref.label}: a worker stopped early")

    try:
        await hold(settings.warmup_s)
        before = await _scrape(session, target)
        opened = time.monotonic()
        await hold(settings.duration_s)
        after = await _scrape(session, target)
        closed = time.monotonic()
        stopping.set()
        await asyncio.gather(*workers)  # drain: the next cell starts from an idle engine
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    in_window = [per_token for ended, per_token in finished if opened <= ended <= closed]
    client = sum(in_window) / len(in_window) if in_window else None
    window = read_window(engine, ref.k, before, after) if before is not None and after is not None else None
    _check_drafting(ref, batch, window)
    tokens_per_step = window.tokens_per_step if window is not None else None
    per_token = client if timing == "client" else (window.per_token_s if window is not None else None)
    if per_token is None:
        source = "the engine's latency histogram" if timing == "engine" else "the client"
        raise ProfilingError(
            f"engine {ref.label} at batch {batch}: no request finished within the window, so {source} "
            "measured nothing: raise --duration or lower --max-tokens"
        )
    return Cell(ref.label, ref.kind, ref.k, batch, len(in_window), per_token, client, tokens_per_step, timing)


def _check_drafting(ref: EngineRef, batch: int, window: Window | None) -> None:
    """A K engine must draft and a plain or k0 engine must not, where the engine's metrics tell."""
    if window is None:
        return
    drafted = window.drafted_tokens
    gauge = window.draft_length
    drafts = (drafted is not None and drafted > 0) or (gauge is not None and gauge > 0)
    idle = (drafted is not None and drafted <= 0) or (gauge is not None and gauge <= 0)
    if ref.kind == "spec" and idle and not drafts:
        raise ProfilingError(
            f"engine {ref.label} drafted nothing at batch {batch}: its schedule gives K=0 there; "
            f"start it with a constant schedule, or pass it as --engine k0={ref.url}"
        )
    if ref.kind != "spec" and drafts:
        what = "a plain revision is started without speculation" if ref.kind == "plain" else ""
        what = what or "k0 needs a schedule that gives K=0 at every batch swept"
        raise ProfilingError(f"engine {ref.label} drafted tokens at batch {batch}: {what}")


def choose_timing(settings: Settings, targets: Sequence[Target], warn: Callable[[str], None]) -> Timing:
    """The engines' own latency when every engine exports it, else the client's for all of them."""
    if settings.client_timing or not settings.use_metrics:
        return "client"
    lacking = [t for t in targets if t.note]
    for target in lacking:
        warn(f"engine {target.ref.label}: {target.note}")
    if lacking:
        warn("timing every engine at the client (includes HTTP overhead: reads slower than the engine)")
        return "client"
    return "engine"


async def run(settings: Settings, progress: Progress | None = None) -> dict[str, Any]:
    """Measure every engine at every batch and return the profile (docs/profiles.md)."""
    progress = progress or Silent()
    if settings.backend not in BACKENDS:
        raise ProfilingError(
            f"unknown backend {settings.backend!r}: expected one of {', '.join(sorted(BACKENDS))}"
        )
    engine = engine_for(settings.backend)
    limit = max(settings.batches) + 8
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, limit_per_host=limit),
        json_serialize=lambda data: orjson.dumps(data).decode(),
    ) as session:
        targets = list(
            await asyncio.gather(*(prepare(session, settings, engine, r) for r in settings.engines))
        )
        timing = choose_timing(settings, targets, progress.warn)
        if settings.alpha is None:
            for target in targets:
                samples = target.samples
                if target.ref.kind == "spec" and (
                    samples is None or not measures_acceptance(engine, samples)
                ):
                    raise ProfilingError(
                        f"engine {target.ref.label}: acceptance is not measured "
                        f"({target.note or 'no speculation counters'}): pass --alpha"
                    )
        progress.start(len(targets) * len(settings.batches))
        cells: list[Cell] = []
        for target in targets:
            for batch in settings.batches:
                progress.begin(target.ref.label, batch)
                cell = await measure_cell(session, settings, engine, target, batch, timing)
                cells.append(cell)
                progress.cell(cell)
    labels = ", ".join(ref.label for ref in settings.engines)
    source = (
        f"specops profile: {settings.backend} engines {labels}, {settings.max_tokens} tokens per request, "
        f"{settings.duration_s:g} s per batch, {timing} per-token latency"
    )
    return build_profile(settings.name, cells, alpha=settings.alpha, source=source)
