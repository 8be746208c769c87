"""What each serving engine needs, kept in one place per engine (pure: rendering and names only)."""

from specops.domain.engines.base import Engine
from specops.domain.engines.sglang import Sglang
from specops.domain.engines.trtllm import Triton, TrtllmServe
from specops.domain.engines.vllm import Vllm


def engine_for(backend: str, triton_model_source: str = "") -> Engine:
    """The adapter of ``backend`` (one of api.models.BACKENDS)."""
    if backend == "triton":
        return Triton(triton_model_source)
    if backend == "trtllm-serve":
        return TrtllmServe()
    if backend == "vllm":
        return Vllm()
    if backend == "sglang":
        return Sglang()
    raise ValueError(f"unknown serving backend {backend!r}")
