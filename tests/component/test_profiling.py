"""`specops profile` against simulated engines serving a known profile: what it writes is that profile.

Each engine is started from the container specops renders for its revision (a plain one, and
speculating ones with constant schedules), on 127.0.0.1, generating in real time at the batch
in flight. The command runs in click's CliRunner, in a thread, since it runs its own event loop
while the engines serve from the test's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import posixpath
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from specops import profiles
from specops.cli import main as specops
from specops.domain.engines import engine_for
from specops.domain.engines.base import ServingInputs
from specops.domain.engines.schedule import PLAIN, Revision, Schedule
from specops.domain.profile import ServingProfile
from specops.profiling import Cell, build_profile
from specops_local.sim import SimEngine, launch

BASE = profiles.load_builtin("llama8b-1b-draft-floor-h100")
TRUTH = dataclasses.replace(BASE, k0_ms=tuple(ms * 1.08 for ms in BASE.plain_ms), restart_s=0.1)
"""The served world: its K=0 inside a speculating engine costs 8 % over a plain one."""
ALPHA = 0.72  # the profile's own, which the engines serve
NEVER_DRAFTS = [[1, 1024, 0]]
"""A vLLM schedule that gives K=0 at every batch (speculating, drafting nothing)."""

Launcher = Callable[..., SimEngine]


def revision(k: int) -> Revision:
    return PLAIN if k == 0 else Revision("spec", "eagle3", "draft-v1", Schedule.constant(k))


def engine(
    backend: str, name: str, k: int, *, never_drafts: bool = False, restart_s: float = 0.1
) -> SimEngine:
    """The simulated engine of the container specops renders for ``backend`` drafting ``k``."""
    plan = engine_for(backend).container(revision(k), ServingInputs("target", 1))
    args = list(plan.args)
    if never_drafts:  # a vLLM schedule that says K=0 everywhere (specops renders none: it would run plain)
        index = args.index("--speculative-config") + 1
        config = json.loads(args[index])
        config["num_speculative_tokens_per_batch_size"] = NEVER_DRAFTS
        args[index] = json.dumps(config)
    files = {posixpath.join(plan.config_dir, path): text for path, text in plan.files.items()}
    return launch(
        name,
        plan.command,
        args,
        files=files,
        env=dict(plan.env),
        serving_profile=TRUTH,
        restart_s=restart_s,
        realtime_generate=True,
    )


@pytest.fixture
async def engines() -> AsyncIterator[Callable[..., asyncio.Future[SimEngine]]]:
    """Start engines on demand (ready before returned); every one is stopped at the end."""
    async with AsyncExitStack() as stack:

        async def start(*args: object, ready: bool = True, **kwargs: object) -> SimEngine:
            sim = engine(*args, **kwargs)  # type: ignore[arg-type]
            await stack.enter_async_context(sim)
            if ready:
                async with asyncio.timeout(10):
                    await sim.wait_ready()
            return sim

        yield start  # type: ignore[misc]


async def answering(url: str, status: int) -> None:
    """Wait (10 s at most) until ``url`` answers ``status``: the server took its socket over."""
    import aiohttp

    async with asyncio.timeout(10), aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(url) as response:
                    if response.status == status:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)


def engine_options(labelled: Sequence[tuple[str, SimEngine]]) -> list[str]:
    options = []
    for label, sim in labelled:
        options += ["--engine", f"{label}={sim.url}"]
        if sim.separate_metrics_port:  # Triton's metrics port is its own (8002 in a pod)
            options += ["--metrics", f"{label}={sim.metrics_url}"]
    return options


async def profile(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, specops, ["profile", *args])


def ratio_errors(measured: ServingProfile) -> dict[str, float]:
    """Each written time over the served one, minus 1, by row and batch."""
    errors = {}
    for index, batch in enumerate(measured.batches):
        errors[f"plain@{batch:g}"] = measured.plain_ms[index] / TRUTH.plain_ms_at(batch) - 1
        for k, values in measured.round_ms.items():
            errors[f"K={k}@{batch:g}"] = values[index] / TRUTH.round_ms_at(k, batch) - 1
        if measured.k0_ms is not None:
            errors[f"k0@{batch:g}"] = measured.k0_ms[index] / TRUTH.k0_ms_at(batch) - 1
    return errors


def assert_one_line_error(result: Result, *words: str) -> str:
    """A non-zero exit whose error is one line (the last on stderr), with no traceback."""
    assert result.exit_code not in (0, None), result.output
    assert "Traceback" not in result.output + result.stderr
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("Error")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------------------- what it measures


async def test_the_written_profile_is_the_served_one(engines, tmp_path: Path) -> None:
    # Given a plain engine, two with constant schedules and one whose schedule never drafts (vLLM)
    plain = await engines("vllm", "plain", 0)
    k1 = await engines("vllm", "k1", 1)
    k3 = await engines("vllm", "k3", 3)
    k0 = await engines("vllm", "k0", 2, never_drafts=True)
    out = tmp_path / "measured.json"
    # When it profiles them at three batches
    result = await profile(
        *engine_options([("0", plain), ("1", k1), ("3", k3), ("k0", k0)]),
        "--backend", "vllm", "--batches", "1,4,16", "--duration", "0.6s", "--max-tokens", "48",
        "--name", "sim-h100", "--out", str(out),
    )  # fmt: skip
    # Then the profile it writes recovers the served step times
    assert result.exit_code == 0, result.output + result.stderr
    measured = ServingProfile.from_json(out.read_text())
    assert measured.name == "sim-h100" and measured.batches == (1.0, 4.0, 16.0)
    assert measured.lengths == (1, 3) and measured.k0_ms is not None
    errors = ratio_errors(measured)
    assert max(abs(e) for e in errors.values()) < 0.03, errors  # measured: within 0.3 %
    assert measured.alpha is not None and abs(measured.alpha - ALPHA) < 0.01
    # and it saw every engine's own latency and acceptance, cell by cell
    raw = json.loads(out.read_text())
    assert len(raw["measured"]) == 12 and {c["timing"] for c in raw["measured"]} == {"engine"}
    assert all(c["tokens_per_step"] is not None for c in raw["measured"] if c["draft_length"] > 0)
    # and the summary names each row, the best length and the verdict
    lines = result.stdout.splitlines()
    assert lines[0].split()[:5] == ["batch", "plain", "ms", "K=0", "ms"]
    assert lines[1].split()[0] == "1" and lines[1].rstrip().endswith("x")
    assert "alpha 0.72 (measured)" in result.stdout and f"wrote {out}" in result.stdout
    assert [line for line in result.stderr.splitlines() if line.startswith("engine ")][-1].startswith(
        "engine 3 batch 16:"
    )
    # and `specops plan --profile` reads it
    planned = await asyncio.to_thread(CliRunner().invoke, specops, ["plan", "--profile", str(out)])
    assert planned.exit_code == 0, planned.output + planned.stderr
    assert "sim-h100" in planned.stdout


@pytest.mark.parametrize("backend", ["triton", "trtllm-serve", "sglang"])
async def test_each_backend_reads_its_own_metrics(engines, tmp_path: Path, backend: str) -> None:
    # Given a plain and a speculating engine of the backend (Triton: metrics on their own port;
    # trtllm and Triton: a per-request latency histogram; SGLang: an acceptance-rate gauge)
    plain = await engines(backend, "plain", 0)
    k3 = await engines(backend, "k3", 3)
    out = tmp_path / "measured.json"
    result = await profile(
        *engine_options([("0", plain), ("3", k3)]),
        "--backend", backend, "--batches", "1,8", "--duration", "0.6s", "--max-tokens", "48",
        "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output + result.stderr
    measured = ServingProfile.from_json(out.read_text())
    errors = ratio_errors(measured)
    assert max(abs(e) for e in errors.values()) < 0.05, errors  # measured: within 2 %
    assert measured.alpha is not None and abs(measured.alpha - ALPHA) < 0.01
    assert "alpha 0.72 (measured)" in result.stdout


async def test_without_metrics_it_times_requests_and_takes_the_given_alpha(engines, tmp_path: Path) -> None:
    plain = await engines("vllm", "plain", 0)
    k2 = await engines("vllm", "k2", 2)
    out = tmp_path / "measured.json"
    result = await profile(
        *engine_options([("0", plain), ("2", k2)]),
        "--backend", "vllm", "--batches", "1,4", "--duration", "0.6s", "--max-tokens", "48",
        "--no-metrics", "--alpha", "0.72", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output + result.stderr
    measured = ServingProfile.from_json(out.read_text())
    assert measured.alpha == 0.72 and "alpha 0.72 (--alpha)" in result.stdout
    # the client's clock adds HTTP and its own scheduling: slower, never faster than the engine
    errors = ratio_errors(measured)
    assert all(-0.03 < e < 0.5 for e in errors.values()), errors
    assert {c["timing"] for c in json.loads(out.read_text())["measured"]} == {"client"}


async def test_a_speculating_engine_without_acceptance_counters_needs_alpha(engines) -> None:
    plain = await engines("vllm", "plain", 0)
    k2 = await engines("vllm", "k2", 2)
    result = await profile(*engine_options([("0", plain), ("2", k2)]), "--backend", "vllm", "--no-metrics")
    assert_one_line_error(result, "engine 2", "acceptance is not measured", "--alpha")


# ------------------------------------------------------------------------------- mistakes


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--lengths", "0,2,4"], ["--lengths", "--engine K=URL"]),
        (["--url", "localhost:8000"], ["--url", "--engine K=URL"]),
        (["--engine", "2=http://127.0.0.1:9"], ["no plain engine", "--engine 0=URL"]),
        (["--engine", "0=http://127.0.0.1:9"], ["no speculating engine"]),
        (["--engine", "0=http://a:1", "--engine", "two=http://b:1"], ["'two'", "k0"]),
        (["--engine", "0=http://a:1", "--engine", "2"], ["--engine '2'", "K=URL"]),
        (["--engine", "0=http://a:1", "--engine", "2=http://b:1", "--engine", "2=http://c:1"], ["twice"]),
        (["--engine", "0=http://a:1", "--engine", "2=ftp://b"], ["not an http(s) URL"]),
        (
            ["--engine", "0=http://a:1", "--engine", "2=http://b:1", "--batches", "0,4"],
            ["--batches", "between 1"],
        ),
        (
            ["--engine", "0=http://a:1", "--engine", "2=http://b:1", "--batches", "1,x"],
            ["--batches", "integers"],
        ),
        (
            ["--engine", "0=http://a:1", "--engine", "2=http://b:1", "--duration", "soon"],
            ["--duration", "invalid"],
        ),
        (["--engine", "0=http://a:1", "--engine", "2=http://b:1", "--max-tokens", "0"], ["--max-tokens"]),
        (["--engine", "0=http://a:1", "--engine", "2=http://b:1", "--backend", "tgi"], ["--backend", "tgi"]),
        (
            ["--engine", "0=http://a:1", "--engine", "2=http://b:1", "--metrics", "4=http://c:1"],
            ["--metrics 4"],
        ),
        ([], ["--engine"]),
    ],
)
async def test_a_mistake_is_one_line_and_measures_nothing(args: list[str], words: list[str]) -> None:
    assert_one_line_error(await profile(*args), *words)


async def test_an_unreachable_engine_is_named(engines) -> None:
    k2 = await engines("vllm", "k2", 2)
    refused = f"http://127.0.0.1:{closed_port()}"
    result = await profile(*engine_options([("0", k2)]), "--engine", f"2={refused}", "--backend", "vllm")
    assert_one_line_error(result, "engine 2", refused, "connection refused")


async def test_an_engine_still_loading_is_named(engines) -> None:
    plain = await engines("trtllm-serve", "plain", 0)
    loading = await engines("trtllm-serve", "k2", 2, restart_s=30.0, ready=False)  # answers 503 meanwhile
    await answering(f"{loading.url}/health", 503)  # trtllm-serve listens at once while it loads
    result = await profile(*engine_options([("0", plain), ("2", loading)]), "--backend", "trtllm-serve")
    assert_one_line_error(result, "engine 2", "not ready", "HTTP 503")


async def test_a_refused_metrics_url_is_named(engines) -> None:
    plain = await engines("vllm", "plain", 0)
    k2 = await engines("vllm", "k2", 2)
    refused = f"http://127.0.0.1:{closed_port()}/metrics"
    result = await profile(
        *engine_options([("0", plain), ("2", k2)]), "--metrics", f"2={refused}", "--backend", "vllm"
    )
    assert_one_line_error(result, "engine 2 metrics", refused, "connection refused")


async def test_engines_that_do_not_run_what_their_label_says_are_refused(engines) -> None:
    plain = await engines("vllm", "plain", 0)
    k2 = await engines("vllm", "k2", 2)
    never = await engines("vllm", "never", 2, never_drafts=True)
    quick = ["--backend", "vllm", "--batches", "2", "--duration", "0.3s", "--max-tokens", "16"]
    # a K engine whose schedule gives K=0 at the batch: it is a k0 engine there
    result = await profile(*engine_options([("0", plain), ("2", never)]), *quick)
    assert_one_line_error(result, "engine 2 drafted nothing at batch 2", f"--engine k0={never.url}")
    # an engine that drafts, passed as plain
    result = await profile(*engine_options([("0", k2), ("2", k2)]), *quick)
    assert_one_line_error(result, "engine 0 drafted tokens at batch 2", "without speculation")


# ------------------------------------------------------------------------------- the written file


def cells(lengths: Sequence[int]) -> list[Cell]:
    """Cells as the engines of the served world would give them (no engine needed)."""
    out = []
    for batch in (1, 4, 16):
        for k in (0, *lengths):
            e = 1.0 + ALPHA * (1 - ALPHA**k) / (1 - ALPHA)
            per_token = TRUTH.round_ms_at(k, batch) / e / 1e3
            kind = "plain" if k == 0 else "spec"
            out.append(Cell(str(k), kind, k, batch, 10, per_token, None, None if k == 0 else e, "engine"))
    return out


def test_plan_reads_a_profile_without_k1(tmp_path: Path) -> None:
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(build_profile("no-k1", cells([2, 4]))))
    planned = CliRunner().invoke(specops, ["plan", "--profile", str(path)])
    assert planned.exit_code == 0 and planned.exception is None, planned.output


def test_the_summary_reads_a_profile_without_k1() -> None:
    from specops.profiling import summary

    written = build_profile("no-k1", cells([2, 4]))
    assert written["round_ms"].keys() == {"2", "4"} and written["alpha"] == pytest.approx(ALPHA, abs=1e-3)
    text = summary(ServingProfile.from_dict(written), "measured")
    assert text.splitlines()[-1].startswith("alpha 0.72 (measured); speculation pays up to batch")
