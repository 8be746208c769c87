"""Files the operator ships into serving pods, read as text (never imported).

``llmapi_model/model.py`` is specops's TensorRT-LLM model for Triton's python backend: it runs
inside the serving pod, where ``triton_python_backend_utils`` and ``tensorrt_llm`` exist; the
operator only copies its source into the model repository (``tensorrt_llm/1/model.py``).
"""

from __future__ import annotations

from importlib import resources

LLMAPI_MODEL_ASSET = "llmapi_model/model.py"


def llmapi_model_source() -> str:
    """Source text of specops's LLM API model (``tensorrt_llm/1/model.py`` in the pod)."""
    return resources.files(__package__).joinpath(LLMAPI_MODEL_ASSET).read_text(encoding="utf-8")
