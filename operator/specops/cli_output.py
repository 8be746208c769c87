"""Where the commands' machine-readable results go: `--json PATH`, or `--json -` for stdout."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_json(result: Mapping[str, Any], json_path: str | None) -> None:
    """Write `result` to `json_path` ("-" = stdout); nothing when no path was given."""
    text = json.dumps(result, indent=2)
    if json_path == "-":
        print(text)
    elif json_path:
        Path(json_path).write_text(text + "\n")
