"""A serving profile: what one engine really does, as a table of measured step times.

The roofline in `perf.py` is an ideal; a profile is the ground truth of one deployment
(target, draft, GPU, engine): per-step milliseconds at a grid of batch sizes, without
speculation (`plain_ms`) and per speculative round at each draft length (`round_ms[g]`:
g draft steps, verification of g + 1 tokens per request, and whatever overhead the engine
adds). Simulated pods serve one, the policy benchmark replays traces in one, and a
profile measured offline can stand in for the roofline as a prior.

Between grid points step times are interpolated linearly in log(time) against log(batch)
(a power law between neighbours: step times grow smoothly and multiplicatively with
batch); outside the grid they are clamped to the nearest end. Draft lengths missing from
`round_ms` are interpolated linearly between the neighbouring lengths that are present.

Format (JSON; unknown keys are ignored, so a profile can carry its provenance):

    {"name": "...", "batches": [1, 2, 4, ...], "plain_ms": [...],
     "round_ms": {"1": [...], "2": [...], ...}, "alpha": 0.7,
     "k0_ms": [...], "restart_s": 120}

`k0_ms` (optional, default `plain_ms`) is the decode step of an engine started with
speculation while its schedule gives K=0, and `restart_s` (optional, default 120) the seconds
from an engine's start to ready. Both describe the simulated world only: the operator never
reads them.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specops.domain.perf import ModelSetup, expected_tokens, speculative_step_time, target_step_time

DEFAULT_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DEFAULT_RESTART_S = 120.0
"""Seconds from an engine's start to ready when a profile does not say."""


class ProfileError(ValueError):
    """A profile that does not describe step times (named field and what is wrong with it)."""


@dataclass(frozen=True)
class ServingProfile:
    """Measured step times of one engine at a grid of batch sizes (see module docstring)."""

    name: str
    batches: tuple[float, ...]
    plain_ms: tuple[float, ...]
    round_ms: Mapping[int, tuple[float, ...]]
    alpha: float | None = None
    k0_ms: tuple[float, ...] | None = None
    """ms per decode step of a speculating engine whose schedule gives K=0 (None: plain_ms)."""
    restart_s: float | None = None
    """Seconds from an engine's start to ready (None: DEFAULT_RESTART_S)."""

    def __post_init__(self) -> None:
        _validate(self)

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServingProfile:
        """Build from the parsed JSON object; raises ProfileError naming the offending field."""
        if not isinstance(data, Mapping):
            raise ProfileError("a profile must be a JSON object")
        for key in ("name", "batches", "plain_ms", "round_ms"):
            if key not in data:
                raise ProfileError(f"missing required key '{key}'")
        name = data["name"]
        if not isinstance(name, str) or not name:
            raise ProfileError("'name' must be a non-empty string")
        raw_rounds = data["round_ms"]
        if not isinstance(raw_rounds, Mapping):
            raise ProfileError("'round_ms' must be an object mapping draft length to a list of ms")
        rounds: dict[int, tuple[float, ...]] = {}
        for key, values in raw_rounds.items():
            try:
                length = int(key)
            except (TypeError, ValueError):
                raise ProfileError(f"'round_ms' key {key!r} is not an integer draft length") from None
            if str(length) != str(key).strip() and not isinstance(key, int):
                raise ProfileError(f"'round_ms' key {key!r} is not an integer draft length")
            if length in rounds:
                raise ProfileError(f"'round_ms' has draft length {length} twice")
            rounds[length] = _numbers(f"round_ms[{key}]", values)
        alpha = data.get("alpha")
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, int | float)):
            raise ProfileError("'alpha' must be a number or null")
        k0 = data.get("k0_ms")
        restart = data.get("restart_s")
        if restart is not None and (isinstance(restart, bool) or not isinstance(restart, int | float)):
            raise ProfileError("'restart_s' must be a number of seconds or null")
        return cls(
            name=name,
            batches=_numbers("batches", data["batches"]),
            plain_ms=_numbers("plain_ms", data["plain_ms"]),
            round_ms=dict(sorted(rounds.items())),
            alpha=None if alpha is None else float(alpha),
            k0_ms=None if k0 is None else _numbers("k0_ms", k0),
            restart_s=None if restart is None else float(restart),
        )

    @classmethod
    def from_json(cls, text: str) -> ServingProfile:
        """Parse the JSON text of a profile."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ProfileError(f"not JSON: {error}") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this profile (provenance keys are not kept)."""
        data: dict[str, Any] = {
            "name": self.name,
            "batches": list(self.batches),
            "plain_ms": list(self.plain_ms),
            "round_ms": {str(g): list(values) for g, values in self.round_ms.items()},
            "alpha": self.alpha,
        }
        if self.k0_ms is not None:
            data["k0_ms"] = list(self.k0_ms)
        if self.restart_s is not None:
            data["restart_s"] = self.restart_s
        return data

    # ----------------------------------------------------------------- queries

    @property
    def lengths(self) -> tuple[int, ...]:
        """Draft lengths with a measured round time, ascending."""
        return tuple(self.round_ms)

    @property
    def max_length(self) -> int:
        return self.lengths[-1]

    def plain_ms_at(self, batch: float) -> float:
        """Milliseconds per decode step without speculation at this batch (TPOT off)."""
        return _interpolate(self.batches, self.plain_ms, batch)

    def k0_ms_at(self, batch: float) -> float:
        """Milliseconds per decode step of an engine started with speculation at K=0 (default plain)."""
        if self.k0_ms is None:
            return self.plain_ms_at(batch)
        return _interpolate(self.batches, self.k0_ms, batch)

    @property
    def restart_seconds(self) -> float:
        """Seconds from an engine's start to ready: ``restart_s``, else DEFAULT_RESTART_S."""
        return DEFAULT_RESTART_S if self.restart_s is None else self.restart_s

    def round_ms_at(self, draft_length: int, batch: float) -> float:
        """Milliseconds per speculative round with g draft tokens at this batch; g = 0 is a plain step."""
        if draft_length <= 0:
            return self.plain_ms_at(batch)
        lengths = self.lengths
        if draft_length in self.round_ms:
            return _interpolate(self.batches, self.round_ms[draft_length], batch)
        if draft_length < lengths[0] or draft_length > lengths[-1]:
            raise ValueError(
                f"draft length {draft_length} outside the profiled lengths {lengths[0]}..{lengths[-1]}"
            )
        upper = bisect.bisect_left(lengths, draft_length)
        g0, g1 = lengths[upper - 1], lengths[upper]
        t0 = _interpolate(self.batches, self.round_ms[g0], batch)
        t1 = _interpolate(self.batches, self.round_ms[g1], batch)
        return t0 + (t1 - t0) * (draft_length - g0) / (g1 - g0)

    def per_token_ms(self, alpha: float, draft_length: int, batch: float) -> float:
        """Milliseconds between output tokens of one request (TPOT) at this batch and length."""
        return self.round_ms_at(draft_length, batch) / expected_tokens(alpha, draft_length)

    def speedup(self, alpha: float, draft_length: int, batch: float) -> float:
        """Realised speedup E(alpha, g) x plain(B) / round(g, B); g = 0 means off (1.0)."""
        if draft_length <= 0:
            return 1.0
        return (
            expected_tokens(alpha, draft_length)
            * self.plain_ms_at(batch)
            / self.round_ms_at(draft_length, batch)
        )

    def best_length(self, alpha: float, batch: float, max_length: int | None = None) -> tuple[int, float]:
        """The draft length (0 = off) with the highest realised speedup at this alpha and batch."""
        top = self.max_length if max_length is None else min(max_length, self.max_length)
        best_g, best_s = 0, 1.0
        for g in (length for length in self.lengths if length <= top):
            s = self.speedup(alpha, g, batch)
            if s > best_s:
                best_g, best_s = g, s
        return best_g, best_s

    def break_even_batch(
        self, alpha: float, max_length: int | None = None, max_batch: int = 1024
    ) -> int | None:
        """Smallest integer batch at which no length beats plain decoding; None if none up to max_batch.

        Scans every batch (profiles need not be monotonic), so it is exact on the table.
        """
        for batch in range(1, max_batch + 1):
            if self.best_length(alpha, batch, max_length)[0] == 0:
                return batch
        return None


def profile_from_setup(
    name: str,
    setup: ModelSetup,
    *,
    alpha: float | None = None,
    batches: Sequence[int] = DEFAULT_BATCHES,
    max_length: int = 8,
) -> ServingProfile:
    """The roofline of `perf.py` tabulated as a profile: a world where the prior is right."""
    return ServingProfile(
        name=name,
        batches=tuple(float(b) for b in batches),
        plain_ms=tuple(target_step_time(setup, b) * 1e3 for b in batches),
        round_ms={
            g: tuple(speculative_step_time(setup, b, g) * 1e3 for b in batches)
            for g in range(1, max_length + 1)
        },
        alpha=alpha,
    )


# --------------------------------------------------------------------- helpers


def _numbers(field: str, values: object) -> tuple[float, ...]:
    if not isinstance(values, list | tuple) or not values:
        raise ProfileError(f"'{field}' must be a non-empty list of numbers")
    out = []
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProfileError(f"'{field}'[{index}] is not a number: {value!r}")
        if not math.isfinite(value):
            raise ProfileError(f"'{field}'[{index}] is not finite: {value!r}")
        out.append(float(value))
    return tuple(out)


def _validate(profile: ServingProfile) -> None:
    if not profile.name:
        raise ProfileError("'name' must be a non-empty string")
    batches = profile.batches
    if not batches:
        raise ProfileError("'batches' must not be empty")
    if batches[0] <= 0:
        raise ProfileError(f"'batches' must be positive, got {batches[0]:g}")
    for before, after in itertools.pairwise(batches):
        if after <= before:
            raise ProfileError(f"'batches' must be strictly increasing ({before:g} then {after:g})")
    _check_times("plain_ms", profile.plain_ms, len(batches))
    if not profile.round_ms:
        raise ProfileError("'round_ms' must give at least one draft length")
    for length, values in profile.round_ms.items():
        if length < 1:
            raise ProfileError(f"'round_ms' draft length must be >= 1, got {length}")
        _check_times(f"round_ms[{length}]", values, len(batches))
    if profile.k0_ms is not None:
        _check_times("k0_ms", profile.k0_ms, len(batches))
    if profile.restart_s is not None and not (math.isfinite(profile.restart_s) and profile.restart_s >= 0):
        raise ProfileError(f"'restart_s' must be a finite number of seconds >= 0, got {profile.restart_s}")
    if profile.alpha is not None and not 0.0 <= profile.alpha < 1.0:
        raise ProfileError(f"'alpha' must be in [0, 1), got {profile.alpha}")


def _check_times(field: str, values: Sequence[float], expected: int) -> None:
    if len(values) != expected:
        raise ProfileError(f"'{field}' has {len(values)} values for {expected} batches")
    for index, value in enumerate(values):
        if value <= 0:
            raise ProfileError(f"'{field}'[{index}] must be a positive time in ms, got {value:g}")


def _interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Linear in log-log between grid points; clamped to the end values outside the grid."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    upper = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[upper - 1], xs[upper], ys[upper - 1], ys[upper]
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
