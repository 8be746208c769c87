"""status.phase, derived in one place from the parts of status that decide it."""

from __future__ import annotations

from typing import Literal

from specops.api.status import Phase, SpeculativeDeploymentStatus

Lifecycle = Literal["Pending", "Degraded", "Serving", "Invalid"]

CONTROL_PHASES: frozenset[str] = frozenset({"Baseline", "Fixed", "Dynamic"})
"""The control loop's own phases (status.speculation.controlPhase)."""
ACTIVE_PHASES: frozenset[str] = CONTROL_PHASES | {"Canary"}
"""Phases of a serving resource: the periodic tick runs in these and only these."""


def derive_phase(lifecycle: Lifecycle, status: SpeculativeDeploymentStatus) -> Phase:
    """Invalid, Pending and Degraded come from the reconciler's judgement of the serving objects;
    a serving resource is in Canary while a canary runs, else in its control phase."""
    if lifecycle != "Serving":
        return lifecycle
    if status.canary is not None:
        return "Canary"
    return status.speculation.control_phase or "Baseline"


def is_active(status: SpeculativeDeploymentStatus) -> bool:
    return status.phase in ACTIVE_PHASES
