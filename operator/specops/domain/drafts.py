"""Which draft serves where: the stable draft lives in status, the desired one in spec.

A change of spec.draft never rolls the stable pods directly (that would be a blind
swap): the stable variant keeps rendering the draft recorded in status.draft until a
canary of the new draft is promoted. These helpers convert between the two forms.
"""

from __future__ import annotations

from specops.api.models import DraftSpec
from specops.api.status import DraftSource, DraftStatus, LosslessCheck, SpeculativeDeploymentStatus
from specops.domain.names import draft_label


def draft_key(draft: DraftSpec) -> str:
    """Identity of a draft for change detection: version and checkpoint (or method, without one)."""
    return f"{draft.version}@{draft.uri or draft.method}"


def draft_identity(draft: DraftSpec) -> str:
    """The ``specops.dev/draft`` pod label (``specops_draft`` in Prometheus) of pods serving ``draft``."""
    return draft_label(draft.version, draft_key(draft))


def draft_to_status(
    draft: DraftSpec, source: DraftSource, lossless_check: LosslessCheck | None = None
) -> DraftStatus:
    return DraftStatus(
        model=draft.model,
        version=draft.version,
        method=draft.method,
        kind=draft.kind,
        parameters=draft.parameters,
        uri=draft.uri,
        source=source,
        lossless_check=lossless_check,
    )


def speculation_allowed(status: SpeculativeDeploymentStatus) -> bool:
    """False while the stable draft has not passed its lossless check (or failed it).

    The first draft of a resource is checked on its stable pods before speculation first goes
    on; later drafts pass the check as canaries. Drafts recorded before the check existed
    (unset) are trusted.
    """
    return status.draft.lossless_check not in ("Pending", "Failed")


def draft_from_status(recorded: DraftStatus | None, fallback: DraftSpec) -> DraftSpec:
    """The draft a status block describes; fields it lacks come from `fallback` (spec.draft)."""
    if recorded is None or not recorded.version:
        return fallback
    method = recorded.method or fallback.method
    if method in ("draftModel", "eagle3") and not recorded.uri:
        return fallback
    return DraftSpec.model_validate(
        {
            "model": recorded.model or fallback.model,
            "version": recorded.version,
            "method": method,
            "kind": recorded.kind or fallback.kind,
            "parameters": recorded.parameters or fallback.parameters,
            "uri": recorded.uri if method in ("draftModel", "eagle3") else None,
        }
    )


def stable_draft(spec_draft: DraftSpec, status: SpeculativeDeploymentStatus) -> DraftSpec:
    """The draft the stable variant serves: status.draft once recorded, else spec.draft."""
    return draft_from_status(status.draft, spec_draft)
