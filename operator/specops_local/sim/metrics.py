"""Prometheus text exposition (format 0.0.4) for the simulated engines."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

PROMETHEUS_TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TPOT_BUCKETS: tuple[float, ...] = (
    0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.0006, 0.0007, 0.0008, 0.0009, 0.001, 0.00125, 0.0015,
    0.00175, 0.002, 0.0025, 0.003, 0.0035, 0.004, 0.0045, 0.005, 0.006, 0.007, 0.008, 0.009, 0.01,
    0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
)  # fmt: skip
E2E_BUCKETS: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)


@dataclass
class Histogram:
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

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0


CORRUPTIONS = ("nan", "inf", "negative")
"""How a faulty exporter may spoil every sample value: NaN, +Inf, or negated (and one below)."""


def corrupted(value: float, corruption: str | None) -> float:
    if corruption == "nan":
        return math.nan
    if corruption == "inf":
        return math.inf
    if corruption == "negative":
        return -abs(float(value)) - 1.0
    return value


class Exposition:
    def __init__(self, corruption: str | None = None) -> None:
        self._lines: list[str] = []
        self.corruption = corruption
        """One of CORRUPTIONS: every sample value written so (a faulty exporter); None: as given."""

    def family(self, name: str, kind: str, help_text: str) -> None:
        self._lines.append(f"# HELP {name} {help_text}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Mapping[str, str], value: float) -> None:
        rendered = ",".join(f'{key}="{_escape(val)}"' for key, val in labels.items())
        self._lines.append(f"{name}{{{rendered}}} {_number(corrupted(value, self.corruption))}")

    def metric(
        self, name: str, kind: str, labels: Mapping[str, str], value: float, help_text: str = ""
    ) -> None:
        self.family(name, kind, help_text or name.replace("_", " "))
        self.sample(name, labels, value)

    def histogram(
        self, name: str, labels: Mapping[str, str], histogram: Histogram, help_text: str = ""
    ) -> None:
        self.family(name, "histogram", help_text or name.replace("_", " "))
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
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))
