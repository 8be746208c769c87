"""`specops profile` against a simulated pod serving a known profile: what it measures is that profile."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from specops import profiles
from specops.domain import perf
from specops.domain.profile import ServingProfile
from specops.profiling import main, parse_counters
from specops_local.sim import LoadPoint, SimPod

TRUTH = profiles.load_builtin("llama8b-1b-draft-floor-h100")
SETUP = perf.ModelSetup(perf.GPUS["H100"], target_params=8e9, draft_params=1e9)


@pytest.fixture
async def pod() -> AsyncIterator[SimPod]:
    """Idle apart from what the profiler sends: its batch is the requests in flight."""
    sim = SimPod(
        "profiled-0",
        SETUP,
        serving_profile=TRUTH,
        realtime_generate=True,
        load=LoadPoint(batch=0, alpha=0.72),
    )
    async with sim:
        yield sim


async def profile_of(pod: SimPod, tmp_path: Path, *extra: str) -> ServingProfile:
    out = tmp_path / "measured.json"
    argv = [
        "--url",
        f"127.0.0.1:{pod.http_port}",
        "--concurrency",
        "1,4,16",
        "--lengths",
        "0,1,4",
        "--duration",
        "1s",
        "--max-tokens",
        "64",
        "--out",
        str(out),
        *extra,
    ]
    assert await asyncio.to_thread(main, argv) == 0
    return ServingProfile.from_json(out.read_text())


def assert_within(measured: ServingProfile, tolerance: float, slower: float | None = None) -> None:
    """Every cell within `tolerance` of the served profile (up to `slower` above it, if given)."""
    high = tolerance if slower is None else slower
    for batch in measured.batches:
        plain = measured.plain_ms_at(batch) / TRUTH.plain_ms_at(batch)
        assert -tolerance <= plain - 1 <= high, (batch, plain)
        for length in measured.lengths:
            ratio = measured.round_ms_at(length, batch) / TRUTH.round_ms_at(length, batch)
            assert -tolerance <= ratio - 1 <= high, (batch, length, ratio)


async def test_the_measured_profile_matches_the_served_one_within_10_percent(
    pod: SimPod, tmp_path: Path
) -> None:
    measured = await profile_of(pod, tmp_path, "--metrics-url", f"127.0.0.1:{pod.metrics_port}")
    assert measured.batches == (1.0, 4.0, 16.0) and measured.lengths == (1, 4)
    assert measured.alpha is not None and abs(measured.alpha - 0.72) < 0.02
    assert_within(measured, 0.10)
    # and what it decides from it is the served world's: off from batch 12 at alpha 0.72
    assert measured.best_length(0.72, 1)[0] == TRUTH.best_length(0.72, 1)[0] == 1
    assert measured.best_length(0.72, 16)[0] == 0
    raw = json.loads((tmp_path / "measured.json").read_text())
    assert {cell["concurrency"] for cell in raw["measured"]} == {1, 4, 16}


async def test_without_engine_metrics_it_times_requests_and_takes_the_given_alpha(
    pod: SimPod, tmp_path: Path
) -> None:
    measured = await profile_of(pod, tmp_path, "--no-metrics", "--alpha", "0.72")
    assert measured.alpha == 0.72
    # client-side timing adds HTTP overhead and, on a busy machine, the scheduler's delay, so it
    # reads slower, never faster (docs/profiles.md says to prefer the engine's metrics): it
    # measured 1.17x-1.30x on a loaded two-core machine and 2.19x with four test workers on it,
    # but never under the served world
    assert_within(measured, 0.10, slower=1.50)


def test_counters_sum_every_draft_series() -> None:
    text = (
        "# TYPE specops_spec_decode_steps_total counter\n"
        'specops_spec_decode_steps_total{model="tensorrt_llm_bls",draft="a"} 10\n'
        'specops_spec_decode_steps_total{model="tensorrt_llm_bls",draft="b"} 5.5\n'
        "specops_time_per_output_token_seconds_sum 0.25\n"
    )
    counters = parse_counters(text)
    assert counters["specops_spec_decode_steps_total"] == 15.5
    assert counters["specops_time_per_output_token_seconds_sum"] == 0.25
    assert counters["specops_spec_decode_accepted_tokens_total"] == 0.0
