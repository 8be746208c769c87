"""Kopf's last-handled configuration, built without copying what it throws away.

Kopf compares each watch event's body with the last-handled configuration it stores in an
annotation, to tell a spec change (the update handler runs) from anything else. Its
``DiffBaseStorage.build`` deep-copies the whole body and then drops ``status`` and all of
``metadata`` but the labels and annotations; its progress storage's ``clear`` deep-copies the
result again. Most of the events on our resources are our own status writes, and the status is
most of the body: at 2,000 resources that copy ran for every one of them (about 200 us for a
6 KiB body, half of it the status; on a real API server ``metadata.managedFields`` adds to it).
During the initial reconcile at 400 resources the two copies were 11 % of the operator's CPU
(py-spy), with the status already left out.

So `StatuslessDiffBaseStorage` lets Kopf's own ``build`` pick the metadata (labels, and the
annotations that are not another operator's storage) from a body that holds nothing else, and
copies the rest (the spec) itself, through orjson; `FastCopyProgressStorage.clear` copies
through orjson where Kopf calls ``copy.deepcopy``. The essence is the one Kopf would build (a
test compares them), and the comparison stays Kopf's. When a handler asks for extra fields
(``kopf.on.field`` on a status field, say), or fields are ignored, Kopf builds it as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

import kopf

from specops.adapters.json_data import json_copy

METADATA_KEPT = ("labels", "annotations", "ownerReferences")
"""What of ``metadata`` Kopf's build reads: the labels and annotations it keeps, and the owners its
storage keys look at (``CollisionEvadingConvention.mark_key``)."""

NOT_ESSENCE = ("apiVersion", "kind", "metadata", "status")
"""What Kopf's build drops from the top level (the metadata it keeps is picked separately)."""


class StatuslessDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """Kopf's annotation storage, its essence built without copying the status or system metadata."""

    def build(
        self,
        *,
        body: kopf.Body,
        extra_fields: Iterable[kopf.FieldSpec] | None = None,
    ) -> kopf.BodyEssence:
        if extra_fields or self.ignored_fields:  # fields that may lie anywhere: Kopf's own way
            return super().build(body=body, extra_fields=extra_fields)
        essence: dict[str, Any] = {
            key: json_copy(value) for key, value in body.items() if key not in NOT_ESSENCE
        }
        essence.update(super().build(body=kopf.Body(cast(kopf.RawBody, metadata_only(body)))))
        return cast(kopf.BodyEssence, essence)


class FastCopyProgressStorage(kopf.AnnotationsProgressStorage):
    """Kopf's annotation progress storage; ``clear`` copies the essence through orjson."""

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        # Kopf's AnnotationsProgressStorage.clear, with its base class's copy.deepcopy replaced
        copied = cast(kopf.BodyEssence, json_copy(essence))
        annotations = copied.get("metadata", {}).get("annotations", {})
        keys = {key for key in annotations if self.prefix and key.startswith(f"{self.prefix}/")}
        self.remove_annotations(copied, keys)
        self.remove_empty_stanzas(copied)
        return copied


def metadata_only(body: Mapping[str, Any]) -> dict[str, Any]:
    """The body's kind and the metadata Kopf's build reads, and nothing else (shallow: Kopf's build
    copies what it keeps)."""
    kept: dict[str, Any] = {key: body[key] for key in ("apiVersion", "kind") if key in body}
    metadata = body.get("metadata") or {}
    kept["metadata"] = {key: metadata[key] for key in METADATA_KEPT if key in metadata}
    return kept
