"""Which draft serves where: the stable draft lives in status, the desired one in spec.

A change of spec.draft never rolls the stable pods directly (that would be a blind
swap): the stable variant keeps rendering the draft recorded in status.draft until a
canary of the new draft is promoted. These helpers convert between the two forms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specops.api.models import DraftEngine, DraftSpec, SpeculativeDeployment


def draft_key(draft: DraftSpec) -> str:
    """Identity of a draft for change detection: version and engine location."""
    return f"{draft.version}@{draft.engine.uri}"


def draft_to_status(draft: DraftSpec, source: str) -> dict[str, Any]:
    return {
        "model": draft.model,
        "version": draft.version,
        "kind": draft.kind,
        "parameters": draft.parameters,
        "engineUri": draft.engine.uri,
        "source": source,
    }


def draft_from_status(recorded: Mapping[str, Any] | None, fallback: DraftSpec) -> DraftSpec:
    """The draft a status block describes; fields it lacks come from `fallback` (spec.draft)."""
    if not recorded or not recorded.get("version") or not recorded.get("engineUri"):
        return fallback
    return DraftSpec(
        model=recorded.get("model") or fallback.model,
        version=recorded["version"],
        kind=recorded.get("kind") or fallback.kind,
        parameters=recorded.get("parameters") or fallback.parameters,
        engine=DraftEngine(uri=recorded["engineUri"]),
    )


def stable_draft(resource: SpeculativeDeployment, status: Mapping[str, Any] | None = None) -> DraftSpec:
    """The draft the stable variant serves: status.draft once recorded, else spec.draft."""
    live = status if status is not None else resource.status.model_dump(by_alias=True)
    return draft_from_status((live or {}).get("draft"), resource.spec.draft)
