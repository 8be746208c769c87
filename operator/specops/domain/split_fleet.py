"""Split-fleet A/B: some pods at a different setting at the same moment, to compare speedup at one load.

A probe on a single pod, or on the whole fleet in time, compares two moments whose load may
differ. With two or more ready pods the control loop instead runs a probe on a few of them
(`choose_pods`: one of N, never more than half) while the others keep the decision, and reads
every pod's own batch and mean per-token latency (series carry the pod label; the query count
does not grow with pods). Each settled interval gives one comparison of the two groups
(`measure`); when the probe ends, `verdict` turns the comparisons into the measured speedup of
speculation over plain at that load, adjusted to the current acceptance, and the per-pod
samples (each with the setting its pod ran) join the calibration fit.

Pure: times come in as datetimes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from specops.domain.calibration import StepSample
from specops.domain.metrics import PodMeasurement
from specops.domain.perf import expected_tokens
from specops.domain.records import replace

SPLIT_MIN_PODS = 2  # ready pods needed for a split; below, probes run on the fleet in time
SPLIT_MIN_COMPARISONS = 2  # settled intervals a verdict needs
SPLIT_SLOWER_BELOW = 0.97  # measured speedup below this: speculation is slower here (as the guard)
MAX_KEPT = 64  # bounds the samples a split holds until it ends


def probe_pod_count(ready: int) -> int:
    """Pods a split sets apart: one of N up to 7 pods, a quarter beyond (never more than half)."""
    if ready < SPLIT_MIN_PODS:
        return 0
    return max(1, ready // 4)


def choose_pods(names: Sequence[str], rotation: int) -> tuple[str, ...]:
    """The pods of the probe side: a rotating choice, so each pod takes its turn."""
    ordered = sorted(set(names))
    count = probe_pod_count(len(ordered))
    return tuple(ordered[(rotation + i) % len(ordered)] for i in range(count))


@dataclass(frozen=True)
class Comparison:
    """One settled interval: the mean of each group's pods."""

    probe_tpot_s: float
    base_tpot_s: float
    probe_batch: float
    base_batch: float
    alpha: float | None  # measured acceptance of the speculating side


@dataclass(frozen=True)
class Split:
    """A split in progress: `pods` run `probe_length`, the rest `base_length`."""

    pods: tuple[str, ...]
    probe_length: int
    base_length: int
    since: datetime
    share: float  # pods on the probe side / ready pods: the probe's share of token throughput
    comparisons: tuple[Comparison, ...] = ()
    samples: tuple[StepSample, ...] = ()


def start(
    names: Sequence[str], rotation: int, probe_length: int, base_length: int, now: datetime
) -> Split | None:
    """A split of these ready pods, or None when there are too few for one."""
    pods = choose_pods(names, rotation)
    if not pods:
        return None
    return Split(pods, probe_length, base_length, now, len(pods) / len(set(names)))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def measure(split: Split, per_pod: Mapping[str, PodMeasurement], alpha: float | None) -> Split:
    """Add one settled interval: a comparison of the groups and one sample per pod with its setting."""
    probe: list[PodMeasurement] = []
    base: list[PodMeasurement] = []
    samples: list[StepSample] = []
    for name, pod in sorted(per_pod.items()):
        if pod.tpot_mean_s is None or pod.tpot_mean_s <= 0 or pod.batch is None or pod.batch <= 0:
            continue
        length = split.probe_length if name in split.pods else split.base_length
        if length > 0 and alpha is None:
            continue
        (probe if name in split.pods else base).append(pod)
        samples.append(StepSample(pod.batch, length, pod.tpot_mean_s, alpha if length > 0 else None))
    if not probe or not base:
        return split
    comparison = Comparison(
        probe_tpot_s=_mean([p.tpot_mean_s or 0.0 for p in probe]),
        base_tpot_s=_mean([p.tpot_mean_s or 0.0 for p in base]),
        probe_batch=_mean([p.batch or 0.0 for p in probe]),
        base_batch=_mean([p.batch or 0.0 for p in base]),
        alpha=alpha,
    )
    return replace(
        split,
        comparisons=(*split.comparisons, comparison)[-MAX_KEPT:],
        samples=(*split.samples, *samples)[-MAX_KEPT:],
    )


@dataclass(frozen=True)
class SplitVerdict:
    """What a split measured: speculation at `on_length` against plain, at one moment's load."""

    speedup: float  # plain per-token latency / speculating per-token latency, at `alpha`
    on_length: int
    on_pods: tuple[str, ...]
    off_pods: tuple[str, ...]
    on_tpot_s: float
    off_tpot_s: float
    batch: float
    alpha: float
    comparisons: int

    @property
    def slower(self) -> bool:
        return self.speedup < SPLIT_SLOWER_BELOW

    def evidence(self) -> str:
        def pods(names: Sequence[str]) -> str:
            return ", ".join(names) if names else "the other pods"

        return (
            f"split-fleet A/B at batch {self.batch:.0f}: {pods(self.on_pods)} at draft length "
            f"{self.on_length} ran {self.on_tpot_s * 1e3:.2f} ms per token, {pods(self.off_pods)} plain "
            f"{self.off_tpot_s * 1e3:.2f} ms, at the same moment ({self.comparisons} measurements): "
            f"measured speedup {self.speedup:.2f}x at alpha {self.alpha:.2f}"
        )


def verdict(split: Split, alpha: float, other_pods: Sequence[str] = ()) -> SplitVerdict | None:
    """The measured speedup of speculation over plain, or None without enough comparisons.

    Each comparison's ratio is taken to the current acceptance: the speculating side's round
    time (TPOT x E(measured alpha, g)) is what the load fixes, the tokens it yields follow alpha.
    The ratios are averaged geometrically.
    """
    usable = [c for c in split.comparisons if c.probe_tpot_s > 0 and c.base_tpot_s > 0]
    if len(usable) < SPLIT_MIN_COMPARISONS or (split.probe_length > 0) == (split.base_length > 0):
        return None
    probe_on = split.probe_length > 0
    on_length = split.probe_length if probe_on else split.base_length
    logs: list[float] = []
    for c in usable:
        on_tpot, off_tpot = (c.probe_tpot_s, c.base_tpot_s) if probe_on else (c.base_tpot_s, c.probe_tpot_s)
        measured_alpha = c.alpha if c.alpha is not None else alpha
        adjust = expected_tokens(alpha, on_length) / expected_tokens(measured_alpha, on_length)
        logs.append(math.log(off_tpot / on_tpot * adjust))
    on_tpot = _mean([c.probe_tpot_s if probe_on else c.base_tpot_s for c in usable])
    off_tpot = _mean([c.base_tpot_s if probe_on else c.probe_tpot_s for c in usable])
    batch = _mean([(c.probe_batch + c.base_batch) / 2 for c in usable])
    others = tuple(sorted(other_pods))
    return SplitVerdict(
        speedup=math.exp(_mean(logs)),
        on_length=on_length,
        on_pods=split.pods if probe_on else others,
        off_pods=others if probe_on else split.pods,
        on_tpot_s=on_tpot,
        off_tpot_s=off_tpot,
        batch=batch,
        alpha=alpha,
        comparisons=len(usable),
    )
