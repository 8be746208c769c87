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
            "predictedGain",
            "proposed",  # follows the smoothed acceptance; the revision in force is what matters
            "batchSeconds",  # the load seen, decayed every tick
            "calibration",  # the fit's statistics move with every sample
        }
    ),
    "observed": None,
    "baseline": None,
}


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `old` into `new` (removed keys become null; lists are replaced)."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if value == before:  # one comparison in C for a block that did not move (most do not)
            continue
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value)
            if inner:
                patch[key] = inner
        else:
            patch[key] = value
    return patch


def only_volatile(patch: Mapping[str, Any], before: Mapping[str, Any] | None = None) -> bool:
    """Whether a status patch changes nothing but measurement fields.

    With the status it applies to (`before`), a new conditions list that differs only in messages
    counts as measurements too: a message may quote a reading ("per-token acceptance 0.81 >= ..."),
    which moves with every sample while the condition's status and reason hold. Writing it at
    once was a status write per resource per tick under any noise."""
    for key, value in patch.items():
        if key == "conditions" and before is not None and _messages_only(before.get(key), value):
            continue
        if key not in VOLATILE_FIELDS:
            return False
        volatile = VOLATILE_FIELDS[key]
        if volatile is None:
            continue
        if not isinstance(value, Mapping) or any(field not in volatile for field in value):
            return False
    return True


def _messages_only(old: Any, new: Any) -> bool:
    """Whether two conditions lists are the same conditions, in order, but for their messages."""
    if not isinstance(old, list) or not isinstance(new, list) or len(old) != len(new):
        return False
    for a, b in zip(old, new, strict=True):
        if not isinstance(a, Mapping) or not isinstance(b, Mapping):
            return False
        if a.keys() - {"message"} != b.keys() - {"message"}:
            return False
        if any(a[k] != b[k] for k in a if k != "message"):
            return False
    return True
