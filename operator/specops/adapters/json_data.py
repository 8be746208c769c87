"""Deep copies of JSON data (watched bodies, stored objects), through orjson."""

from __future__ import annotations

import copy
from typing import Any

import orjson


def json_copy(value: Any) -> Any:
    """A deep copy of JSON data: orjson's round trip, about five times quicker than
    ``copy.deepcopy`` for a resource's body. What JSON cannot carry (a non-string key, an int
    beyond 64 bits, an object) goes through ``copy.deepcopy``. NaN and the infinities would come
    back as null: callers hold bodies decoded from JSON, which carry none."""
    try:
        return orjson.loads(orjson.dumps(value))
    except TypeError:
        return copy.deepcopy(value)
