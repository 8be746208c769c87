"""A LIST by label selector answers from the emulator's label index exactly what a scan would.

The index serves every LIST with an equality term (an operator's pods LIST per tick); it must
follow label changes, deletions, re-creations and namespaces, and never answer a stale set.
"""

from __future__ import annotations

from specops_local.emulator import FidelityEmulator, register_builtin_resources

PODS = "v1/pods"


def _names(emulator: FidelityEmulator, selector: str, namespace: str | None = "default") -> list[str]:
    return [obj["metadata"]["name"] for obj in emulator.list_objects(PODS, namespace, selector)]


def _pod(name: str, **labels: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels}}


def test_a_label_selector_list_follows_label_changes_deletions_and_namespaces() -> None:
    emulator = FidelityEmulator()
    register_builtin_resources(emulator)
    emulator.create_object("v1/namespaces", {"metadata": {"name": "other"}})
    emulator.create_object(PODS, _pod("a", app="x", tier="web"), namespace="default")
    emulator.create_object(PODS, _pod("b", app="x"), namespace="default")
    emulator.create_object(PODS, _pod("c", app="y"), namespace="default")
    emulator.create_object(PODS, _pod("d", app="x"), namespace="other")
    assert _names(emulator, "app=x") == ["a", "b"]
    assert _names(emulator, "app=x", None) == ["a", "b", "d"]
    assert _names(emulator, "app in (x,y),tier!=web") == ["b", "c"]

    emulator.patch_object(PODS, "default", "b", {"metadata": {"labels": {"app": "y"}}})
    assert _names(emulator, "app=x") == ["a"]
    assert _names(emulator, "app=y") == ["b", "c"]

    emulator.delete_object(PODS, "default", "a")
    assert _names(emulator, "app=x") == []
    emulator.create_object(PODS, _pod("a", app="z"), namespace="default")
    assert _names(emulator, "app=x") == []
    assert _names(emulator, "app=z") == ["a"]
    # Without an equality term the emulator scans, and agrees.
    assert _names(emulator, "app") == ["a", "b", "c"]
