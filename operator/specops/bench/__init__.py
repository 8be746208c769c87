"""`specops bench`: reproducible benchmarks of the operator's decisions.

Every benchmark is a `main(argv) -> int` that runs with sensible defaults when given no
arguments and accepts `--json PATH` to write its result. Register one by adding a line to
`BENCHMARKS` ("name": "module:function"); modules are imported only when their benchmark runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

BENCHMARKS: dict[str, str] = {
    "canary": "specops.bench.canary:main",
    "policy": "specops.bench.policy:main",
    "policy-worlds": "specops.bench.policy:worlds_main",
    "fuzz": "specops_local.fuzz:main",  # needs the local and dev extras (CRD admission, hypothesis)
    "scale": "specops_local.scale:main",  # needs the local extra (emulated API server, simulated pods)
    "tick": "specops_local.tick_cost:main",  # needs the local extra (emulated API server)
}

Benchmark = Callable[[list[str]], int]


def load(name: str) -> Benchmark:
    """The registered benchmark called `name`."""
    module_name, _, function_name = BENCHMARKS[name].partition(":")
    function: Benchmark = getattr(importlib.import_module(module_name), function_name)
    return function


def run_all(out_dir: Path) -> int:
    """Run every benchmark with its defaults, writing OUT/<name>.json; non-zero if any failed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    worst = 0
    for name in sorted(BENCHMARKS):
        print(f"== {name}")
        code = load(name)(["--json", str(out_dir / f"{name}.json")])
        worst = max(worst, code)
    return worst


def main(argv: list[str]) -> int:
    if argv and argv[0] in BENCHMARKS:
        return load(argv[0])(argv[1:])
    parser = argparse.ArgumentParser(
        prog="specops bench",
        description="Benchmarks: " + ", ".join(sorted(BENCHMARKS)) + "; or 'all --out DIR' for every one.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    all_parser = sub.add_parser("all", help="run every benchmark with its defaults")
    all_parser.add_argument("--out", type=Path, required=True, help="directory for <name>.json results")
    args = parser.parse_args(argv)
    return run_all(args.out)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
