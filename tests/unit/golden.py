"""Golden files: rendered objects compared with YAML kept under tests/data/golden/.

Run the tests with ``UPDATE_GOLDEN=1`` to rewrite the files after an intended
change, then review the diff like any other code change.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

GOLDEN_DIR = Path(__file__).parents[1] / "data" / "golden"
UPDATE_ENV = "UPDATE_GOLDEN"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (config.pbtxt, model.py) as readable literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: Sequence[Any]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=110)


def assert_golden(name: str, objects: Sequence[Any]) -> None:
    """Compare ``objects`` with tests/data/golden/<name>.yaml (or rewrite it under UPDATE_GOLDEN=1)."""
    path = GOLDEN_DIR / f"{name}.yaml"
    text = dump(objects)
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"golden file {path} is missing: run the tests with {UPDATE_ENV}=1 to create it")
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True), text.splitlines(keepends=True), str(path), "rendered", n=2
            )
        )
        pytest.fail(f"rendered objects differ from {path} (rewrite with {UPDATE_ENV}=1 if intended):\n{diff}")
