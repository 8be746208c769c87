"""What one status write sends: a JSON merge patch (RFC 7386) from the status read to the status wanted.

Writes are judged here too: measurements move at every tick, so a change of only the
volatile measurement fields is written at most once per refresh period, while any other
change is written at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Fields that move with every measurement, by top-level block; None means every field of it.
VOLATILE_FIELDS: dict[str, frozenset[str] | None] = {
    "speculation": frozenset(
        {
            "lastDecisionTime",
            "message",
            "predictedSpeedup",
            "measuredSpeedup",
            "smoothedAlpha",
            "enableEvidence",
            "evidenceAt",
            "calibration",  # the fit's statistics move with every sample
        }
    ),
    "observed": None,
    "baseline": None,
}
# ... except these, within speculation.calibration: what the pods run during a probe must show at once.
PROBE_FIELDS = frozenset({"probing", "probeLength", "probePods", "probeKind"})


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `old` into `new` (removed keys become null; lists are replaced)."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value)
            if inner:
                patch[key] = inner
        elif value != before:
            patch[key] = value
    return patch


def only_volatile(patch: Mapping[str, Any]) -> bool:
    """Whether a status patch changes nothing but measurement fields."""
    for key, value in patch.items():
        if key not in VOLATILE_FIELDS:
            return False
        volatile = VOLATILE_FIELDS[key]
        if volatile is None:
            continue
        if not isinstance(value, Mapping) or any(field not in volatile for field in value):
            return False
        calibration = value.get("calibration") if key == "speculation" else None
        if isinstance(calibration, Mapping) and PROBE_FIELDS & set(calibration):
            return False
    return True
