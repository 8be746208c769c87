"""The engine port: what one serving engine needs from specops, and what specops reads from it.

One adapter per backend (trtllm.py for trtllm-serve and Triton's LLM API model, vllm.py,
sglang.py) owns everything engine-specific: the container's command, arguments and config
files, its ports, health and metrics endpoints, the metric names that become one measurement,
and the draft-length schedule in the engine's own format. Nothing outside this package knows
an engine's flags or file formats. Pure: rendering and names, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from specops.domain.engines.schedule import Method, Revision

TARGET_PATH = "/models/target"
DRAFT_PATH = "/models/draft"
CONFIG_DIR = "/etc/specops/engine"
MAX_BATCH = 1024
"""Where an unbounded band ends when an engine's format needs a number (and vLLM's last range)."""


class EngineRenderError(ValueError):
    """A revision this engine cannot start with; ``field`` names the spec field to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class ServingInputs:
    """What every engine is started from besides the revision."""

    served_model_name: str
    tensor_parallel: int


@dataclass(frozen=True)
class Port:
    name: str
    number: int


@dataclass(frozen=True)
class ContainerPlan:
    """The engine container of one revision."""

    command: tuple[str, ...]
    args: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)
    """Config files: path relative to ``config_dir`` -> content (a ConfigMap mounted there)."""
    config_dir: str = CONFIG_DIR
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class MetricNames:
    """The engine's own metric names that specops reads (selectors may carry label matchers)."""

    running: str
    tpot_histogram: str
    requests: str
    drafted_tokens: str | None = None
    accepted_tokens: str | None = None
    draft_steps: str | None = None
    acceptance_rate_gauge: str | None = None
    output_tokens: str | None = None
    draft_length_gauge: str | None = None
    """A gauge of the K in force, where the engine exports one."""


class Engine(Protocol):
    """One serving backend."""

    name: str
    default_image: str
    methods: frozenset[Method]
    """Methods this engine runs."""
    scheduled_methods: frozenset[Method]
    """Methods whose draft length follows a batch schedule (others run the schedule's largest K)."""
    max_draft_len: int
    ports: tuple[Port, ...]
    http_port: str
    """Name of the port serving the API (and health)."""
    metrics_port: str
    metrics_path: str
    ready_path: str
    live_path: str
    generate_path: str
    metrics: MetricNames

    def container(self, revision: Revision, serving: ServingInputs) -> ContainerPlan: ...
