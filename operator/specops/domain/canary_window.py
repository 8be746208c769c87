"""A canary step's samples, kept in status as bounded summaries instead of raw samples.

Why summaries and not a separate object (as Argo Rollouts keeps AnalysisRuns): the step's
evidence has to survive an operator restart, and status is the one place the operator already
writes every tick; a second object would add a write per tick and per canary, RBAC for it, and a
way for the two to disagree after a lost write. What the analysis needs of a window is small:
per variant, the readings of each metric (acceptance alpha, per-token p99 and p50), how many
reads failed and whether the latest one did. The readings are kept as histograms of at most
MAX_BINS bins, each a value (4 significant digits) and a count, so status stays a few KB however
long a step bakes.

A histogram holds every reading exactly (to 4 significant digits) until it has more than
MAX_BINS distinct values; then the two closest bins merge into their weighted mean, as in
Ben-Haim and Tom-Tov's streaming histogram. The Mann-Whitney test runs on the bins' values
repeated by their counts: a merge only adds ties, which the test's tie correction accounts for.
A step of a few minutes at the default 15 s interval never merges.

Per tick, both variants' samples arrive together (`record`):

- A tick at which neither variant was measured (a metrics outage) is left out of both windows;
  it still marks both latest reads failed, so judgement pauses while the outage lasts.
- A failed read before a variant's first good one is left out (new pods' series are not scraped
  yet); a later one counts against the variant.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from specops.api.status import CanaryVariantWindow, CanaryWindow
from specops.domain.canary import Sample, Window

MAX_BINS = 32
"""Bins per histogram: three per variant, so a step's window is at most 6 x 32 values and counts."""

Bins = tuple[tuple[float, int], ...]


def _rounded(value: float) -> float:
    return float(f"{value:.4g}")


def parse_bins(text: str) -> Bins:
    """`0.8123*3 0.8131 0.815*2` -> ((0.8123, 3), (0.8131, 1), (0.815, 2)); unreadable parts are skipped."""
    bins: list[tuple[float, int]] = []
    for part in text.split():
        value, _, count = part.partition("*")
        try:
            bins.append((float(value), int(count) if count else 1))
        except ValueError:
            continue
    return tuple(sorted(bins))


def format_bins(bins: Bins) -> str:
    return " ".join(f"{value:.4g}" + (f"*{count}" if count != 1 else "") for value, count in bins)


def add(bins: Bins, value: float, max_bins: int = MAX_BINS) -> Bins:
    """The histogram with one more reading; past `max_bins` the two closest bins merge."""
    value = _rounded(value)
    merged = dict(bins)
    merged[value] = merged.get(value, 0) + 1
    ordered = sorted(merged.items())
    while len(ordered) > max_bins:
        gaps = [ordered[i + 1][0] - ordered[i][0] for i in range(len(ordered) - 1)]
        i = gaps.index(min(gaps))
        (low, n_low), (high, n_high) = ordered[i], ordered[i + 1]
        mean = _rounded((low * n_low + high * n_high) / (n_low + n_high))
        ordered[i : i + 2] = [(mean, n_low + n_high)]
    return tuple(ordered)


def values(bins: Bins) -> list[float]:
    """The readings a histogram stands for: each bin's value repeated by its count."""
    return [value for value, count in bins for _ in range(count)]


def median(bins: Bins) -> float | None:
    readings = values(bins)
    return statistics.median(readings) if readings else None


def _with_reading(window: CanaryVariantWindow, sample: Sample) -> CanaryVariantWindow:
    if not sample.ok:
        if window.samples == 0:
            return window  # not scraped yet: before the first good read nothing counts
        return window.model_copy(
            update={"samples": window.samples + 1, "failed": window.failed + 1, "last_ok": False}
        )
    changes: dict[str, object] = {"samples": window.samples + 1, "last_ok": True}
    for field, reading in (("alpha", sample.alpha), ("p99", sample.tpot_p99_s), ("p50", sample.tpot_p50_s)):
        if reading is None or not math.isfinite(reading):
            continue
        bins = add(parse_bins(getattr(window, f"{field}_bins")), reading)
        changes[f"{field}_bins"] = format_bins(bins)
        if field in ("alpha", "p99"):
            changes[field] = median(bins)
    return window.model_copy(update=changes)


def record(window: CanaryWindow, stable: Sample | None, canary: Sample | None) -> CanaryWindow:
    """The step's window after one tick's samples (None: that variant was not sampled)."""
    if stable is not None and canary is not None and not stable.ok and not canary.ok:
        # neither variant measured: says nothing about the canary, but judgement waits for it to end
        return CanaryWindow(
            stable=window.stable.model_copy(update={"last_ok": False}),
            canary=window.canary.model_copy(update={"last_ok": False}),
        )
    return CanaryWindow(
        stable=window.stable if stable is None else _with_reading(window.stable, stable),
        canary=window.canary if canary is None else _with_reading(window.canary, canary),
    )


def replay(stable: Sequence[Sample], canary: Sequence[Sample]) -> CanaryWindow:
    """The window of whole lists of samples, both ending at the latest tick (tests, benchmarks)."""
    window = CanaryWindow()
    ticks = max(len(stable), len(canary))
    for tick in range(ticks):
        s, c = tick - (ticks - len(stable)), tick - (ticks - len(canary))
        window = record(window, stable[s] if s >= 0 else None, canary[c] if c >= 0 else None)
    return window


def analysis_window(window: CanaryVariantWindow) -> Window:
    """What `domain.canary.analyse_windows` reads of one variant."""
    return Window(
        alphas=values(parse_bins(window.alpha_bins)),
        p99s=values(parse_bins(window.p99_bins)),
        p50s=values(parse_bins(window.p50_bins)),
        ok=window.samples - window.failed,
        errors=window.failed,
        last_ok=window.last_ok,
    )


def usable(window: CanaryVariantWindow) -> int:
    """Readings with an acceptance value (the analysis needs MIN_SAMPLES of them per side)."""
    return sum(count for _, count in parse_bins(window.alpha_bins))
