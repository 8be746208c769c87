"""Serving profiles shipped with specops, and loading a profile from a file.

`list_builtin()` names the packaged profiles (see README.md in this folder for where each
one's numbers come from); `load_builtin(name)` returns one; `resolve(name_or_path)` accepts
either a builtin name or the path of a profile JSON file, which is what command-line
options take.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from specops.domain.profile import ProfileError, ServingProfile

__all__ = ["ProfileError", "ServingProfile", "list_builtin", "load", "load_builtin", "resolve"]


def _folder() -> resources.abc.Traversable:
    return resources.files("specops.profiles")


def list_builtin() -> list[str]:
    """Names of the packaged profiles, sorted."""
    return sorted(
        entry.name.removesuffix(".json") for entry in _folder().iterdir() if entry.name.endswith(".json")
    )


def load_builtin(name: str) -> ServingProfile:
    """The packaged profile called `name`; KeyError listing the names when there is none."""
    if name not in list_builtin():
        raise KeyError(f"no builtin profile {name!r}; builtin: {', '.join(list_builtin())}")
    return ServingProfile.from_json(_folder().joinpath(f"{name}.json").read_text())


def load(path: Path | str) -> ServingProfile:
    """A profile from a JSON file; ProfileError says which field is wrong and in which file."""
    path = Path(path)
    try:
        return ServingProfile.from_json(path.read_text())
    except ProfileError as error:
        raise ProfileError(f"{path}: {error}") from None


def resolve(name_or_path: str) -> ServingProfile:
    """A builtin name, or else the path of a profile file."""
    if name_or_path in list_builtin():
        return load_builtin(name_or_path)
    path = Path(name_or_path)
    if not path.exists():
        raise FileNotFoundError(
            f"{name_or_path!r} is neither a profile file nor a builtin profile ({', '.join(list_builtin())})"
        )
    return load(path)
