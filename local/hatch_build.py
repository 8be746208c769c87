"""Build hook of the specops-local wheel: ships the package at ../operator/specops_local as specops_local.

Only the standard wheel copies it; the editable wheel puts ../operator on sys.path (dev-mode-dirs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGE = Path("..") / "operator" / "specops_local"


class LocalStackPackage(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "standard":
            source = (Path(self.root) / PACKAGE).resolve()
            if not (source / "__init__.py").is_file():
                raise FileNotFoundError(f"{source}: build specops-local from a clone of the repository")
            build_data["force_include"][str(source)] = "specops_local"
