"""Where the commands' output goes: rich consoles for people, `--json PATH` (or `-` = stdout) for scripts.

Every command with `--json` behaves the same: with `--json -` the JSON is the only thing on
stdout and the human view goes to stderr; with `--json FILE` both are written.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
from rich.console import Console

# Wide enough that a plan's table (8 batch columns) never wraps when stdout is a file or a pipe.
PIPE_WIDTH = 160


def console(*, stderr: bool = False) -> Console:
    """A console on the current stdout or stderr (so click's test runner captures it)."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else PIPE_WIDTH
    return Console(file=stream, width=width, soft_wrap=False)


def write_json(result: Mapping[str, Any] | Sequence[Any], json_path: str | None) -> None:
    """Write `result` to `json_path` ("-" = stdout); nothing when no path was given."""
    text = json.dumps(result, indent=2)
    if json_path == "-":
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    elif json_path:
        path = Path(json_path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
        except OSError as error:
            raise click.ClickException(f"cannot write {json_path}: {error.strerror or error}") from None
