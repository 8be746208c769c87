"""Simulated serving engines, one per backend, started from a container's command, args and files.

``launch(name, command, args, files=..., env=..., **options)`` reads the configuration exactly
as the real engine would (`config.parse`; a refused one raises `EngineConfigError`) and returns
the backend's engine, not yet started. ``options`` are the simulated world (`SimEngine`'s
keyword arguments: serving_profile, load, draft_alpha, lossless, restart_s, noise, ...).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specops_local.sim.engines.base import MAX_RUNNING_REQUESTS, MAX_TICK_SECONDS, SimEngine
from specops_local.sim.engines.config import (
    BACKENDS,
    Backend,
    EngineConfig,
    EngineConfigError,
    SpecConfig,
    backend_of,
    parse,
)
from specops_local.sim.engines.sglang import SglangEngine
from specops_local.sim.engines.triton import TritonEngine
from specops_local.sim.engines.trtllm_serve import TrtllmServeEngine
from specops_local.sim.engines.vllm import VllmEngine

ENGINES: dict[Backend, type[SimEngine]] = {
    "triton": TritonEngine,
    "trtllm-serve": TrtllmServeEngine,
    "vllm": VllmEngine,
    "sglang": SglangEngine,
}


def engine_class(backend: Backend) -> type[SimEngine]:
    return ENGINES[backend]


def launch(
    name: str,
    command: Sequence[str],
    args: Sequence[str] = (),
    *,
    files: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    **options: Any,
) -> SimEngine:
    """The engine a container with this command, args, files and env starts (raises EngineConfigError)."""
    config = parse([*command, *args], files, env)
    return ENGINES[config.backend](name, config, **options)


__all__ = [
    "BACKENDS",
    "ENGINES",
    "MAX_RUNNING_REQUESTS",
    "MAX_TICK_SECONDS",
    "Backend",
    "EngineConfig",
    "EngineConfigError",
    "SglangEngine",
    "SimEngine",
    "SpecConfig",
    "TritonEngine",
    "TrtllmServeEngine",
    "VllmEngine",
    "backend_of",
    "engine_class",
    "launch",
    "parse",
]
