"""`specops bench`: reproducible benchmarks of the operator's decisions.

Every benchmark is a `main(argv) -> int` that runs with sensible defaults when given no
arguments and accepts `--json PATH` to write its result. The operator's own are listed in
`BUILT_IN` ("name": "module:function"); other distributions add theirs as entry points in the
group `specops.bench` (the local stack adds those that run an emulated cluster). Modules are
imported only when their benchmark runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint
from pathlib import Path

from specops import plugins

BUILT_IN: dict[str, str] = {
    "canary": "specops.bench.canary:main",
    "policy": "specops.bench.policy:main",
    "policy-worlds": "specops.bench.policy:worlds_main",
}

Benchmark = Callable[[list[str]], int]


def installed() -> dict[str, EntryPoint]:
    """Every benchmark: the operator's own and those installed distributions register."""
    found = plugins.registered(plugins.BENCHMARKS)
    found.update({name: EntryPoint(name, value, plugins.BENCHMARKS) for name, value in BUILT_IN.items()})
    return dict(sorted(found.items()))


BENCHMARKS = installed()


class BenchmarkError(Exception):
    """A benchmark that is not installed or does not load; the message is one line."""


def load(name: str) -> Benchmark:
    """The registered benchmark called `name`."""
    point = BENCHMARKS.get(name)
    if point is None:
        missing = "" if plugins.local_stack_installed() else f"; {plugins.LOCAL_STACK_MISSING}"
        raise BenchmarkError(f"no benchmark {name!r} (installed: {', '.join(BENCHMARKS)}){missing}")
    try:
        function: Benchmark = point.load()
    except ImportError as error:
        raise BenchmarkError(
            f"cannot load benchmark {name!r} from {plugins.provider(point)}: {error}"
        ) from None
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
    if argv and not argv[0].startswith("-") and argv[0] != "all":
        try:
            benchmark = load(argv[0])
        except BenchmarkError as error:
            print(f"specops bench: {error}", file=sys.stderr)
            return 2
        return benchmark(argv[1:])
    parser = argparse.ArgumentParser(
        prog="specops bench",
        description="Benchmarks: " + ", ".join(BENCHMARKS) + "; or 'all --out DIR' for every one.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    all_parser = sub.add_parser("all", help="run every benchmark with its defaults")
    all_parser.add_argument("--out", type=Path, required=True, help="directory for <name>.json results")
    args = parser.parse_args(argv)
    try:
        return run_all(args.out)
    except BenchmarkError as error:
        print(f"specops bench: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
