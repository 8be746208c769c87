"""Performance model of speculative decoding on one serving replica.

Pure arithmetic from SPECDEC.md: expected tokens per verification pass E(alpha, g),
a roofline decode-step time for target and draft, and the batched speedup
S(B, g) = E * T_t(B, 1) / (g * T_d(B) + T_t(B, g + 1) + overhead).
The control loop, `specops plan`, the simulator and the benchmarks all use this
one model so that what the operator predicts and what the sim serves agree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

BYTES_PER_PARAM: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}

# Bytes of K and V cache per token of context, per parameter of the model. A Llama-3 70B
# (80 layers, 8 KV heads x 128, bf16) holds 327,680 B per token: ~4.7e-6 B per parameter.
DEFAULT_KV_BYTES_PER_TOKEN_PER_PARAM = 4.7e-6

# Context tokens per request whose KV cache each decode step reads, when nothing better is known.
# The operator and `specops plan` both start from this one value. It is 0 (weights only, SPECDEC.md's
# worked values) because the metrics the operator reads do not report context length, and because
# it is the cautious side: KV reads make a target step more memory-bound, which makes verifying
# extra tokens cheaper, so any real context only moves break-even up (70B/7B on 4x H100 at alpha
# 0.8: batch 251 at 0, 634 at 1024, none below 4096 at 2048). Assuming 0 switches speculation off
# early rather than keeping it on past the point where it slows decoding down; `plan
# --context-tokens N` shows what a known context length buys.
DEFAULT_CONTEXT_TOKENS = 0.0


@dataclass(frozen=True)
class GpuSpec:
    """Peak figures of one accelerator: HBM bandwidth (B/s) and dense bf16 FLOP/s."""

    name: str
    hbm_bytes_per_s: float
    bf16_flops: float

    @property
    def ridge_tokens(self) -> float:
        """Tokens per step at which a bf16 decode step turns compute-bound (N*)."""
        return self.bf16_flops / self.hbm_bytes_per_s


GPUS: dict[str, GpuSpec] = {
    "H100": GpuSpec("H100", 3.35e12, 989e12),
    "H200": GpuSpec("H200", 4.8e12, 989e12),
    "A100": GpuSpec("A100", 2.039e12, 312e12),
    "L40S": GpuSpec("L40S", 0.864e12, 362e12),
    "B200": GpuSpec("B200", 8.0e12, 2250e12),
}


@dataclass(frozen=True)
class ModelSetup:
    """One target/draft pair on one replica: what the step-time model needs."""

    gpu: GpuSpec
    target_params: float
    draft_params: float
    bytes_per_param: float = 2.0
    tensor_parallel: int = 1
    context_tokens: float = DEFAULT_CONTEXT_TOKENS
    kv_bytes_per_token_per_param: float = DEFAULT_KV_BYTES_PER_TOKEN_PER_PARAM
    overhead_s: float = 0.0
    efficiency: float = 1.0  # fraction of peak bandwidth and FLOP/s the kernels reach

    def with_context(self, context_tokens: float) -> ModelSetup:
        return replace(self, context_tokens=context_tokens)


def _step_time(setup: ModelSetup, params: float, batch: float, tokens_per_request: float) -> float:
    gpus = max(1, setup.tensor_parallel)
    bandwidth = setup.gpu.hbm_bytes_per_s * gpus * setup.efficiency
    flops = setup.gpu.bf16_flops * gpus * setup.efficiency
    weight_bytes = params * setup.bytes_per_param
    kv_bytes = batch * setup.context_tokens * params * setup.kv_bytes_per_token_per_param
    memory_s = (weight_bytes + kv_bytes) / bandwidth
    compute_s = 2.0 * params * batch * tokens_per_request / flops
    return max(memory_s, compute_s)


def target_step_time(setup: ModelSetup, batch: float, tokens_per_request: float = 1.0) -> float:
    """Seconds for one target forward pass scoring `tokens_per_request` tokens for each of `batch`."""
    return _step_time(setup, setup.target_params, batch, tokens_per_request)


def draft_step_time(setup: ModelSetup, batch: float) -> float:
    """Seconds for one autoregressive draft step (one token for each request in the batch)."""
    return _step_time(setup, setup.draft_params, batch, 1.0)


def latency_ratio(setup: ModelSetup, batch: float = 1.0) -> float:
    """c = draft step time / target step time; speculation can pay only while alpha > c."""
    return draft_step_time(setup, batch) / target_step_time(setup, batch)


def expected_tokens(alpha: float, draft_length: int) -> float:
    """E = (1 - alpha^(g+1)) / (1 - alpha): tokens emitted per target pass, bonus included."""
    if draft_length <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(draft_length + 1)
    alpha = max(0.0, alpha)
    return (1.0 - alpha ** (draft_length + 1)) / (1.0 - alpha)


def speculative_step_time(setup: ModelSetup, batch: float, draft_length: int) -> float:
    """Seconds for one speculative round: g draft steps plus one verification pass."""
    if draft_length <= 0:
        return target_step_time(setup, batch, 1.0)
    return (
        draft_length * draft_step_time(setup, batch)
        + target_step_time(setup, batch, draft_length + 1.0)
        + setup.overhead_s
    )


def speedup(setup: ModelSetup, alpha: float, batch: float, draft_length: int) -> float:
    """Batched speedup S(B, g) over plain decoding at the same batch; g = 0 means off (1.0)."""
    if draft_length <= 0:
        return 1.0
    batch = max(1.0, batch)
    plain = target_step_time(setup, batch, 1.0)
    return expected_tokens(alpha, draft_length) * plain / speculative_step_time(setup, batch, draft_length)


def per_token_latency(setup: ModelSetup, alpha: float, batch: float, draft_length: int) -> float:
    """Seconds between output tokens of one request (TPOT) at this batch and draft length."""
    batch = max(1.0, batch)
    return speculative_step_time(setup, batch, draft_length) / expected_tokens(alpha, draft_length)


def best_draft_length(setup: ModelSetup, alpha: float, batch: float, max_length: int) -> tuple[int, float]:
    """The integer g in [0, max_length] with the highest modelled speedup (0 = off)."""
    best_g, best_s = 0, 1.0
    for g in range(1, max_length + 1):
        s = speedup(setup, alpha, batch, g)
        if s > best_s:
            best_g, best_s = g, s
    return best_g, best_s


def break_even_batch(setup: ModelSetup, alpha: float, draft_length: int, max_batch: int = 4096) -> int | None:
    """Smallest batch at which speculation at this length no longer pays (S <= 1); None if never."""
    if speedup(setup, alpha, 1, draft_length) <= 1.0:
        return 1
    lo, hi = 1, max_batch
    if speedup(setup, alpha, hi, draft_length) > 1.0:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if speedup(setup, alpha, mid, draft_length) > 1.0:
            lo = mid
        else:
            hi = mid
    return hi


def best_length_break_even_batch(
    setup: ModelSetup, alpha: float, max_length: int, max_batch: int = 4096
) -> int | None:
    """Smallest batch at which no draft length in [1, max_length] beats plain decoding; None if never.

    Unlike `break_even_batch` (one fixed length) this is where a policy free to pick the
    length should switch speculation off. Speedup falls with batch at every length, so
    bisection applies.
    """

    def pays(batch: int) -> bool:
        return best_draft_length(setup, alpha, batch, max_length)[0] > 0

    if not pays(1):
        return 1
    if pays(max_batch):
        return None
    lo, hi = 1, max_batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pays(mid):
            lo = mid
        else:
            hi = mid
    return hi
