"""The small Kubernetes client knows every kind specops reads or writes, and builds the right paths."""

from __future__ import annotations

from specops.adapters.kube import PLURALS, label_selector, resource_path
from specops.domain import retraining


def test_every_training_kind_has_a_plural() -> None:
    for kind in (retraining.JOB, retraining.JOBSET, retraining.TRAINJOB, retraining.PYTORCHJOB):
        assert (kind.api_version, kind.kind) in PLURALS


def test_core_and_group_paths() -> None:
    assert resource_path("v1", "pods", "ns") == "/api/v1/namespaces/ns/pods"
    assert (
        resource_path("specops.dev/v1alpha1", "speculativedeployments", "ns", "x")
        == "/apis/specops.dev/v1alpha1/namespaces/ns/speculativedeployments/x"
    )
    assert resource_path("apps/v1", "deployments", None) == "/apis/apps/v1/deployments"


def test_label_selector_is_sorted_and_joined() -> None:
    assert label_selector({"b": "2", "a": "1"}) == "a=1,b=2"


async def test_expiring_service_account_token_is_reread(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from specops.adapters.kube import ConnectionSettings, KubeClient

    token_file = tmp_path / "token"
    token_file.write_text("first")
    client = KubeClient(
        ConnectionSettings(server="https://127.0.0.1:1", token="first", token_file=str(token_file))
    )
    try:
        assert client._refresh_token() is False  # same token: nothing to retry with
        token_file.write_text("rotated\n")
        assert client._refresh_token() is True
        assert client.headers["Authorization"] == "Bearer rotated"
    finally:
        await client.close()


async def test_unreachable_api_server_is_a_kube_api_error() -> None:
    import pytest

    from specops.adapters.kube import ConnectionSettings, KubeApiError, KubeClient
    from specops_local.prometheus import free_port

    client = KubeClient(ConnectionSettings(server=f"http://127.0.0.1:{free_port()}"), timeout_s=2)
    try:
        with pytest.raises(KubeApiError) as raised:
            await client.get("v1", "Pod", "default", "x")
        assert raised.value.reason == "Unreachable"
    finally:
        await client.close()
