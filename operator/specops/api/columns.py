"""The CRD's printer columns evaluated as kubectl and the API server do, for tables outside kubectl.

`kubectl get sdep` shows the columns the API server computes from `additionalPrinterColumns`;
the emulated API server, `kubectl specops list` and the demo compute the same cells here.
Column paths use the subset of kubectl's JSONPath the CRD needs: dotted fields, `[N]` indexes
and `[?(@.field=="value")]` filters on lists (the first match is shown, as the server does).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

_STEP = re.compile(
    r"""\.(?P<field>[A-Za-z0-9_\-]+)
      | \[(?P<index>-?[0-9]+)\]
      | \[\?\(@\.(?P<key>[A-Za-z0-9_.\-]+)\s*==\s*(?P<quote>["'])(?P<value>[^"']*)(?P=quote)\)\]""",
    re.VERBOSE,
)


def parse_json_path(path: str) -> list[tuple[str, Any]]:
    """Steps of a column path: ("field", name), ("index", n) or ("filter", (dotted key, value))."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    text = text.removeprefix("$")
    if not text.startswith((".", "[")):
        text = "." + text
    steps: list[tuple[str, Any]] = []
    position = 0
    while position < len(text):
        match = _STEP.match(text, position)
        if match is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {text[position:]!r}")
        if match["field"] is not None:
            steps.append(("field", match["field"]))
        elif match["index"] is not None:
            steps.append(("index", int(match["index"])))
        else:
            steps.append(("filter", (match["key"], match["value"])))
        position = match.end()
    return steps


def _dotted(obj: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(part)
    return obj


def evaluate(path: str, obj: Any) -> Any:
    """The value at `path` in `obj`, or None when any step is missing."""
    for kind, arg in parse_json_path(path):
        if kind == "field":
            obj = obj.get(arg) if isinstance(obj, Mapping) else None
        elif kind == "index":
            obj = obj[arg] if isinstance(obj, list) and -len(obj) <= arg < len(obj) else None
        else:
            key, value = arg
            if not isinstance(obj, list):
                return None
            obj = next((item for item in obj if str(_dotted(item, key)) == value), None)
        if obj is None:
            return None
    return obj


def age(timestamp: str | None, now: datetime) -> str:
    """kubectl's short human durations: 42s, 3m12s, 2h5m, 3d."""
    if not timestamp:
        return "<unknown>"
    seconds = int((now - datetime.fromisoformat(timestamp.replace("Z", "+00:00"))).total_seconds())
    seconds = max(seconds, 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 600:
        return f"{seconds // 60}m{seconds % 60}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60}m"
    return f"{seconds // 86400}d"


def cell_value(value: Any, column_type: str) -> Any:
    """A column's cell as the server puts it in a Table row (numbers stay numbers)."""
    if value is None:
        return None
    if column_type == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if column_type == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if column_type == "boolean":
        return bool(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return value if isinstance(value, str | int | float | bool) else str(value)


def cell_text(value: Any, column_type: str, now: datetime) -> str:
    """A cell as kubectl prints it: dates as ages, booleans lower case, missing values empty."""
    if column_type == "date":
        return age(value, now) if value else ""
    value = cell_value(value, column_type)
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def storage_columns(crd: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The storage version's additionalPrinterColumns."""
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    columns: list[dict[str, Any]] = version.get("additionalPrinterColumns") or []
    return columns


def table_rows(
    columns: Sequence[Mapping[str, Any]], bodies: Sequence[Mapping[str, Any]], now: datetime, *, wide: bool
) -> list[list[str]]:
    """Header and rows as `kubectl get` prints them (priority>0 columns only with `wide`)."""
    shown = [c for c in columns if wide or int(c.get("priority", 0)) == 0]
    rows = [["NAME", *(str(c["name"]).upper() for c in shown)]]
    for body in bodies:
        rows.append(
            [
                str(body["metadata"]["name"]),
                *(cell_text(evaluate(str(c["jsonPath"]), body), str(c["type"]), now) for c in shown),
            ]
        )
    return rows
