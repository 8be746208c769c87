"""Simulated Triton + TensorRT-LLM pods for tests and the local demo."""

from specops_local.sim.load import (
    ConstantSchedule,
    LoadPoint,
    LoadSchedule,
    StepSchedule,
    constant,
    from_csv,
    parse_csv_trace,
    steps,
)
from specops_local.sim.pod import (
    BLS_MODEL,
    DRAFT_LENGTH_PARAMETER,
    DRAFT_MODEL,
    DRAFT_NAME_PARAMETER,
    ENSEMBLE_MODEL,
    TARGET_MODEL,
    ModelLoadError,
    SimPod,
    greedy_text,
)

__all__ = [
    "BLS_MODEL",
    "DRAFT_LENGTH_PARAMETER",
    "DRAFT_MODEL",
    "DRAFT_NAME_PARAMETER",
    "ENSEMBLE_MODEL",
    "TARGET_MODEL",
    "ConstantSchedule",
    "LoadPoint",
    "LoadSchedule",
    "ModelLoadError",
    "SimPod",
    "StepSchedule",
    "constant",
    "from_csv",
    "greedy_text",
    "parse_csv_trace",
    "steps",
]
