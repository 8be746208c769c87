"""Model control (the ModelControl port) for runs without Triton: every pod takes every setting and
model at once and is ready, and speculation changes no answer, so a draft's lossless check passes.

The in-process benchmarks and the component tests that drive the production tick without pods
build on it, overriding what they observe (what a fleet apply changed, what a draft answers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specops.domain.discovery import PodEndpoint
from specops.ports import ApplyResult, FleetResult, GenerateResult


class AcceptingModelControl:
    """Every pod already runs what it is asked for."""

    async def apply_to_all(
        self, endpoints: Sequence[PodEndpoint], *, num_draft_tokens: int | None = None, **_: Any
    ) -> FleetResult:
        return FleetResult(desired=len(endpoints), applied=len(endpoints), changed=0)

    async def read_bls_settings(self, endpoint: PodEndpoint) -> ApplyResult:
        return ApplyResult(endpoint.name, True)

    async def apply_bls_settings(self, endpoint: PodEndpoint, **_: Any) -> ApplyResult:
        return ApplyResult(endpoint.name, True)

    async def load_model(
        self, endpoint: PodEndpoint, name: str, config: Mapping[str, object] | None = None
    ) -> ApplyResult:
        return ApplyResult(endpoint.name, True)

    async def unload_model(self, endpoint: PodEndpoint, name: str) -> ApplyResult:
        return ApplyResult(endpoint.name, True)

    async def is_ready(self, endpoint: PodEndpoint, model: str | None = None) -> bool:
        return True

    async def generate(
        self, endpoint: PodEndpoint, prompt: str, max_tokens: int, num_draft_tokens: int | None = None
    ) -> GenerateResult:
        return GenerateResult(endpoint.name, True, text=prompt)  # the lossless check: identical output
