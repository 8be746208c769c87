"""A draft-length schedule in specops' one canonical form, and a pod's configuration revision.

Every engine in use fixes its speculative config at start-up and picks the draft length K
from the batch it carries at every iteration. specops writes that schedule in one form,
``((max_batch, K), ..., (None, K))``: ascending upper band edges, ``None`` meaning no upper
bound; each engine adapter renders it in the engine's own format (engines/*.py).

A configuration revision is everything a pod runs with: plain (started without
speculation) or spec (a method, a draft checkpoint, a schedule). Its digest is the
``specops.dev/revision`` pod label and the ``specops_revision`` label of every series.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["plain", "spec"]
Method = Literal["draftModel", "eagle3", "mtp", "ngram"]
METHODS: tuple[Method, ...] = ("draftModel", "eagle3", "mtp", "ngram")
CHECKPOINT_METHODS: frozenset[str] = frozenset({"draftModel", "eagle3"})
"""Methods that load a draft checkpoint (mtp uses the target's own heads, ngram no model)."""

Band = tuple[int | None, int]
"""(upper batch edge inclusive or None for unbounded, K)."""


class ScheduleError(ValueError):
    """A schedule no engine could start with."""


@dataclass(frozen=True)
class Schedule:
    """Batch bands to draft length K (0 included), ascending, the last band unbounded.

    K never grows with the batch: verification costs more as batches grow, so a longer
    draft at a larger batch is never what the model asks for, and TensorRT-LLM requires the
    smallest band's K to be the largest.
    """

    bands: tuple[Band, ...]

    def __post_init__(self) -> None:
        if not self.bands:
            raise ScheduleError("a schedule needs at least one band")
        previous_edge = 0
        previous_k: int | None = None
        for index, (edge, k) in enumerate(self.bands):
            last = index == len(self.bands) - 1
            if (edge is None) != last:
                raise ScheduleError("only the last band is unbounded (max batch null)")
            if edge is not None and edge <= previous_edge:
                raise ScheduleError(f"band edges must ascend: {edge} after {previous_edge}")
            if k < 0:
                raise ScheduleError(f"K must be >= 0, got {k}")
            if previous_k is not None and k > previous_k:
                raise ScheduleError(f"K must not grow with the batch: {k} after {previous_k}")
            previous_edge = edge or previous_edge
            previous_k = k
        if self.bands[0][1] == 0:
            raise ScheduleError("a schedule whose first band is K=0 never speculates: run plain")

    @classmethod
    def constant(cls, k: int) -> Schedule:
        return cls(((None, k),))

    @classmethod
    def of(cls, bands: Iterable[Sequence[int | None]]) -> Schedule:
        """From ``[[edge, K], ...]`` (the canonical JSON form); merges neighbours of equal K."""
        merged: list[Band] = []
        for edge, k in bands:
            if k is None:
                raise ScheduleError("K must be a number")
            if merged and merged[-1][1] == k:
                merged[-1] = (edge, int(k))
            else:
                merged.append((None if edge is None else int(edge), int(k)))
        return cls(tuple(merged))

    @property
    def max_k(self) -> int:
        return self.bands[0][1]

    def k_at(self, batch: float) -> int:
        """The K an engine started with this schedule uses at ``batch`` running requests."""
        for edge, k in self.bands:
            if edge is None or batch <= edge:
                return k
        return 0  # unreachable: the last band is unbounded

    def canonical(self) -> list[list[int | None]]:
        return [[edge, k] for edge, k in self.bands]

    def describe(self) -> str:
        """For people: ``K=4 to batch 8, K=2 to batch 32, K=0 above 32``."""
        parts: list[str] = []
        previous: int | None = None
        for edge, k in self.bands:
            if edge is not None:
                parts.append(f"K={k} to batch {edge}")
            elif previous is None:
                parts.append(f"K={k} at every batch")
            else:
                parts.append(f"K={k} above {previous}")
            previous = edge
        return ", ".join(parts)


@dataclass(frozen=True)
class Revision:
    """What a pod runs. ``plain`` carries no method, draft or schedule."""

    mode: Mode
    method: Method | None = None
    draft: str | None = None
    """The draft's identity (model and version) for methods with a checkpoint; None otherwise."""
    schedule: Schedule | None = None
    engine_args: tuple[tuple[str, str], ...] = field(default=())
    """Extra engine settings that belong to the revision (sorted key/value pairs)."""

    def __post_init__(self) -> None:
        if self.mode == "plain" and (self.method or self.draft or self.schedule):
            raise ScheduleError("a plain revision has no method, draft or schedule")
        if self.mode == "spec" and (self.method is None or self.schedule is None):
            raise ScheduleError("a speculating revision needs a method and a schedule")

    def canonical(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "method": self.method,
            "draft": self.draft,
            "draft_len_schedule": self.schedule.canonical() if self.schedule else None,
            "engine_args": [list(pair) for pair in self.engine_args],
        }

    @functools.cached_property
    def digest(self) -> str:
        """10 hex digits of the canonical JSON: the pod label and the series label (worked out once
        per revision: a control step compares it with every pod's label)."""
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]

    def describe(self) -> str:
        if self.mode == "plain" or self.schedule is None:
            return "plain"
        return f"{self.method} {self.schedule.describe()}"


PLAIN = Revision(mode="plain")
