"""String forms the API accepts for durations and model sizes, and their parsers.

Durations are written like Argo Rollouts and Flagger ("90s", "10m", "1h30m");
parameter counts like model cards ("70B", "1.5B", "500M") or in exponent form
("70e9"). Both are strings in the CRD so YAML parsers never mangle them.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
PARAMETERS_PATTERN = (
    r"^([1-9][0-9]{0,15}(\.[0-9]{1,6})?|0\.[0-9]{0,5}[1-9][0-9]{0,5})([eE](1[0-5]|0?[0-9])|[KMBT])?$"
)
"""A count greater than 0 and finite: no leading zeros, at most 16 integer digits, exponents up to e15."""
DURATION_MAX_LENGTH = 32
"""Long enough for "1h30m15s500ms"; a 400-digit duration is refused, not slept on."""

_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


@functools.lru_cache(maxsize=1024)
def parse_duration(text: str) -> float:
    """Seconds in a duration string such as "1h30m" or "250ms" (cached: every tick of every
    resource reads the same few spec durations again)."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"invalid duration {text!r}: use a number with a unit ms|s|m|h, e.g. 90s or 10m")
    if len(text) > DURATION_MAX_LENGTH:
        raise ValueError(f"invalid duration {text[:40]!r}...: at most {DURATION_MAX_LENGTH} characters")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in _DURATION_PART.findall(text))


def format_duration(seconds: float) -> str:
    """Shortest readable form for status fields ("24ms", "1.5s", "10m")."""
    if seconds < 1e-6:
        return "0ms"  # below the resolution of any latency histogram; keeps the text parseable
    if seconds < 1.0:
        return f"{seconds * 1000:.3g}ms"
    if seconds < 60.0:
        return f"{seconds:.3g}s"
    if seconds < 3600.0:
        return f"{seconds / 60:.3g}m"
    return f"{seconds / 3600:.3g}h"


@functools.lru_cache(maxsize=1024)
def parse_parameters(text: str) -> float:
    """Parameter count from "70B", "1.5B", "500M" or "70e9" (cached, as durations are)."""
    if not re.fullmatch(PARAMETERS_PATTERN, text):
        raise ValueError(f"invalid parameter count {text!r}: write e.g. 70B, 1.5B, 500M or 70e9")
    suffix = text[-1]
    if suffix in _SIZE_SUFFIX:
        return float(text[:-1]) * _SIZE_SUFFIX[suffix]
    return float(text)


# ---------------------------------------------------------------- typed status fields


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC to the second, the form Kubernetes writes (``2026-12-01T12:00:00Z``).

    Through ``isoformat`` (a status dump formats a dozen times, every tick of every resource:
    ``strftime`` was a fiftieth of a tick); years before 1000 are not a status's."""
    return moment.astimezone(UTC).replace(microsecond=0, tzinfo=None).isoformat() + "Z"


def parse_time(value: Any) -> datetime | None:
    """The datetime of an RFC 3339 status field; None when absent or unreadable."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _time_or_none(value: Any) -> datetime | None:
    parsed = parse_time(value)
    if parsed is None and value not in (None, ""):
        raise ValueError(f"invalid timestamp {value!r}: use RFC 3339, e.g. 2026-12-01T12:00:00Z")
    return parsed


def _seconds_or_none(value: Any) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return parse_duration(str(value))


Timestamp = Annotated[
    datetime,
    BeforeValidator(_time_or_none),
    PlainSerializer(format_time, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""A point in time: a datetime in Python, RFC 3339 text on the wire."""

DurationText = Annotated[
    float,
    BeforeValidator(_seconds_or_none),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN}),
]
"""A duration: seconds in Python, a short duration string ("4.99ms") on the wire."""
