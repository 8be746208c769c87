"""The URL clients call, as status shows it: the shared Service on the engine's API port."""

from __future__ import annotations

import pytest

from specops.domain.render import RenderOptions
from specops.services.reconciler import endpoint_url
from tests.unit.test_render import body, resource


@pytest.mark.parametrize(
    ("backend", "port"), [("triton", 8000), ("trtllm-serve", 8000), ("vllm", 8000), ("sglang", 30000)]
)
def test_the_endpoint_is_the_shared_service_on_the_engines_port(backend: str, port: int) -> None:
    data = body()
    data["spec"]["serving"]["backend"] = backend
    url = endpoint_url(resource(data), RenderOptions())
    assert url == f"http://llama-70b-chat.inference.svc:{port}"
