"""Files the operator ships into serving pods, read as text (never imported).

The BLS model under ``tensorrt_llm_bls/model.py`` runs inside Triton's python
backend, where ``triton_python_backend_utils`` exists; the operator only copies
its source into each pod's model-repository ConfigMap.
"""

from __future__ import annotations

from importlib import resources

BLS_MODEL_ASSET = "tensorrt_llm_bls/model.py"


def bls_model_source() -> str:
    """Source text of the specops BLS model (``tensorrt_llm_bls/1/model.py`` in the pod)."""
    return resources.files(__package__).joinpath(BLS_MODEL_ASSET).read_text(encoding="utf-8")
