"""Load offered to a simulated pod over time.

A pod asks its schedule for the load at the simulated second it is integrating,
so tests can pin a load (`constant`), script a scenario (`steps`) or replay a
recorded trace in the policy-benchmark CSV format (`from_csv`).
"""

from __future__ import annotations

import bisect
import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class LoadPoint:
    """What a pod is serving at one moment.

    batch: running requests (mean; the pod may add noise); alpha: per-token acceptance
    of the draft on this traffic; context_tokens: mean context length (adds KV reads);
    mean_output_tokens: generated tokens per request, to turn tokens into completions.
    """

    batch: float
    alpha: float
    context_tokens: float = 0.0
    mean_output_tokens: float = 200.0

    def __post_init__(self) -> None:
        if self.batch < 0:
            raise ValueError(f"batch must be >= 0, got {self.batch}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}")
        if self.context_tokens < 0:
            raise ValueError(f"context_tokens must be >= 0, got {self.context_tokens}")
        if self.mean_output_tokens <= 0:
            raise ValueError(f"mean_output_tokens must be > 0, got {self.mean_output_tokens}")


class LoadSchedule(Protocol):
    """Load as a function of seconds since the schedule was installed."""

    def __call__(self, t_seconds: float) -> LoadPoint: ...


@dataclass(frozen=True)
class ConstantSchedule:
    point: LoadPoint

    def __call__(self, t_seconds: float) -> LoadPoint:
        return self.point


@dataclass(frozen=True)
class StepSchedule:
    """Piecewise-constant load: each point holds from its time until the next one.

    Before the first time the first point applies; with `loop` the trace repeats
    with a period of its last time (a trace whose last row is the end marker).
    """

    times: tuple[float, ...]
    points: tuple[LoadPoint, ...]
    loop: bool = False

    def __post_init__(self) -> None:
        if not self.points or len(self.times) != len(self.points):
            raise ValueError("a step schedule needs at least one (time, point) pair")
        if any(b < a for a, b in zip(self.times, self.times[1:], strict=False)):
            raise ValueError("step schedule times must not decrease")
        if self.loop and self.times[-1] <= 0:
            raise ValueError("a looping schedule needs a positive last time as its period")

    def __call__(self, t_seconds: float) -> LoadPoint:
        if self.loop:
            t_seconds %= self.times[-1]
        index = bisect.bisect_right(self.times, t_seconds) - 1
        return self.points[max(0, index)]


def constant(point: LoadPoint) -> ConstantSchedule:
    return ConstantSchedule(point)


def steps(points: Sequence[tuple[float, LoadPoint]], *, loop: bool = False) -> StepSchedule:
    ordered = sorted(points, key=lambda pair: pair[0])
    return StepSchedule(tuple(t for t, _ in ordered), tuple(p for _, p in ordered), loop=loop)


def parse_csv_trace(text: str, *, loop: bool = False) -> StepSchedule:
    """Parse `t_seconds,batch,alpha[,context_tokens][,mean_output_tokens]` rows."""
    reader = csv.DictReader(io.StringIO(text))
    required = {"t_seconds", "batch", "alpha"}
    missing = required - set(reader.fieldnames or ())
    if missing:
        raise ValueError(f"load trace lacks columns {sorted(missing)}")
    rows: list[tuple[float, LoadPoint]] = []
    for line_number, row in enumerate(reader, start=2):
        try:
            point = LoadPoint(
                batch=float(row["batch"]),
                alpha=float(row["alpha"]),
                context_tokens=float(row.get("context_tokens") or 0.0),
                mean_output_tokens=float(row.get("mean_output_tokens") or 200.0),
            )
            rows.append((float(row["t_seconds"]), point))
        except (TypeError, ValueError) as error:
            raise ValueError(f"load trace line {line_number}: {error}") from error
    return steps(rows, loop=loop)


def from_csv(path: str | Path, *, loop: bool = False) -> StepSchedule:
    return parse_csv_trace(Path(path).read_text(encoding="utf-8"), loop=loop)
