"""Commands and benchmarks other distributions add to `specops`, found through entry points.

The local stack (the `specops-local` distribution, built from local/ in the repository) adds
`specops local ...` to the group `specops.commands` and the benchmarks that run an emulated cluster to
`specops.bench`. The operator names no module of theirs: what is installed says what to load.
"""

from __future__ import annotations

import importlib.metadata

COMMANDS = "specops.commands"
BENCHMARKS = "specops.bench"

LOCAL_STACK_MISSING = (
    "the local stack is not installed: in a clone of the repository run  pip install -e ./local  "
    "(make install does)"
)


def registered(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The entry points of `group` in the installed distributions, by name."""
    return {point.name: point for point in importlib.metadata.entry_points(group=group)}


def local_stack_installed() -> bool:
    """Whether a distribution adds `specops local` (the local stack does)."""
    return "local" in registered(COMMANDS)


def provider(point: importlib.metadata.EntryPoint) -> str:
    """The distribution that registered `point`, as `name version`, for messages."""
    dist = point.dist
    return f"{dist.name} {dist.version}" if dist is not None else point.value
