"""The emulated server defaults and validates custom resources from their CRD as an API server does."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from specops.api.crd import build_crd
from specops_local.admission import AdmissionError, CrdAdmission, FieldCause
from specops_local.cluster import WIDGET_CRD, EmulatedCluster, emulated_cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "dense-70b-7b.yaml"
WIDGETS = "/apis/test.specops.dev/v1/namespaces/default/widgets"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmulatedCluster]:
    async with emulated_cluster([], tmp_path, crds=[WIDGET_CRD]) as running:
        yield running


@pytest.fixture
async def api(cluster: EmulatedCluster) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=cluster.url, timeout=5) as client:
        yield client


def widget(name: str = "w", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "test.specops.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": {"model": "m", **spec},
    }


def causes(response: httpx.Response) -> list[tuple[str, str]]:
    return [(cause["field"], cause["reason"]) for cause in response.json()["details"]["causes"]]


async def test_defaults_fill_missing_fields_recursively(api: httpx.AsyncClient) -> None:
    response = await api.post(WIDGETS, json=widget(ports=[{"name": "http"}, {"name": "admin", "port": 9000}]))

    spec = response.json()["spec"]
    assert response.status_code == 201
    assert (spec["mode"], spec["replicas"], spec["maxReplicas"]) == ("safe", 1, 5)
    assert spec["draftLength"] == {
        "min": 1,
        "initial": 4,
        "max": 8,
    }  # an object made by defaulting, then filled
    assert spec["ports"] == [{"name": "http", "port": 80}, {"name": "admin", "port": 9000}]


async def test_an_unsupported_enum_value_is_refused_naming_the_field(api: httpx.AsyncClient) -> None:
    response = await api.post(WIDGETS, json=widget(mode="turbo"))

    assert response.status_code == 422
    assert response.json()["reason"] == "Invalid"
    assert response.json()["message"].startswith(
        'Widget.test.specops.dev "w" is invalid: [spec.mode: Unsupported value: "turbo": supported values: "fast", "safe"'
    )
    assert causes(response)[0] == ("spec.mode", "FieldValueNotSupported")


async def test_cel_rules_are_skipped_while_types_are_wrong(api: httpx.AsyncClient) -> None:
    response = await api.post(WIDGETS, json=widget(mode="turbo", replicas=7))  # replicas > maxReplicas too

    assert causes(response) == [("spec.mode", "FieldValueNotSupported"), ("<nil>", "FieldValueInvalid")]
    assert "some validation rules were not checked" in response.json()["message"]


async def test_an_out_of_bounds_value_is_refused(api: httpx.AsyncClient) -> None:
    response = await api.post(WIDGETS, json=widget(replicas=11, maxReplicas=20))

    assert response.status_code == 422
    assert causes(response) == [("spec.replicas", "FieldValueInvalid")]
    assert "spec.replicas in body should be less than or equal to 10" in response.json()["message"]


async def test_a_missing_required_field_is_refused(api: httpx.AsyncClient) -> None:
    body = widget()
    del body["spec"]["model"]

    response = await api.post(WIDGETS, json=body)

    assert response.status_code == 422
    assert causes(response) == [("spec.model", "FieldValueRequired")]


async def test_a_wrong_type_is_refused_and_int_or_string_takes_both(api: httpx.AsyncClient) -> None:
    as_string = await api.post(WIDGETS, json=widget("a", size="10%"))
    as_integer = await api.post(WIDGETS, json=widget("b", size=3))
    as_list = await api.post(WIDGETS, json=widget("c", size=[3]))
    wrong_type = await api.post(WIDGETS, json=widget("d", replicas="two"))

    assert (as_string.status_code, as_integer.status_code, as_list.status_code) == (201, 201, 422)
    assert causes(wrong_type)[0] == ("spec.replicas", "FieldValueTypeInvalid")


async def test_a_cel_rule_reports_its_message_at_its_field_path(api: httpx.AsyncClient) -> None:
    response = await api.post(WIDGETS, json=widget(replicas=7))

    assert response.status_code == 422
    assert response.json()["message"] == (
        'Widget.test.specops.dev "w" is invalid: spec.replicas: Invalid value: "object": '
        "replicas must not exceed maxReplicas"
    )


async def test_a_cel_message_expression_is_evaluated(api: httpx.AsyncClient) -> None:
    response = await api.post(WIDGETS, json=widget(draftLength={"min": 2, "initial": 9, "max": 8}))

    assert response.status_code == 422
    cause = response.json()["details"]["causes"][0]
    assert cause["field"] == "spec.draftLength"
    assert cause["message"] == 'Invalid value: "object": initial must be between min and max, got 9'


async def test_kubernetes_cel_extensions_are_available(api: httpx.AsyncClient) -> None:
    small = await api.post(WIDGETS, json=widget("small", memory="16Gi"))
    huge = await api.post(WIDGETS, json=widget("huge", memory="100Gi"))

    assert small.status_code == 201
    assert causes(huge) == [("spec.memory", "FieldValueInvalid")]


async def test_every_violation_is_reported_at_once(api: httpx.AsyncClient) -> None:
    response = await api.post(WIDGETS, json=widget(replicas=-1, draftLength={"min": 5, "initial": 4}))

    assert response.status_code == 422
    assert causes(response) == [
        ("spec.replicas", "FieldValueInvalid"),
        ("spec.draftLength", "FieldValueInvalid"),
    ]
    assert ": [spec.replicas: Invalid value: -1: " in response.json()["message"]


async def test_a_transition_rule_runs_only_on_update(api: httpx.AsyncClient) -> None:
    created = await api.post(WIDGETS, json=widget(model="llama-70b"))
    other_change = await api.patch(f"{WIDGETS}/w", json={"spec": {"replicas": 2}}, headers=MERGE)
    model_change = await api.patch(f"{WIDGETS}/w", json={"spec": {"model": "llama-8b"}}, headers=MERGE)

    assert created.status_code == 201
    assert other_change.status_code == 200
    assert model_change.status_code == 422
    assert model_change.json()["message"].endswith('spec.model: Invalid value: "string": model is immutable')
    assert (await api.get(f"{WIDGETS}/w")).json()["spec"]["model"] == "llama-70b"


async def test_a_refused_patch_changes_nothing(api: httpx.AsyncClient) -> None:
    await api.post(WIDGETS, json=widget())

    refused = await api.patch(f"{WIDGETS}/w", json={"spec": {"replicas": 11}}, headers=MERGE)

    assert refused.status_code == 422
    assert (await api.get(f"{WIDGETS}/w")).json()["spec"]["replicas"] == 1


async def test_status_writes_are_not_validated(api: httpx.AsyncClient) -> None:
    await api.post(WIDGETS, json=widget())

    response = await api.patch(f"{WIDGETS}/w/status", json={"status": {"anything": ["goes"]}}, headers=MERGE)

    assert response.status_code == 200


async def test_a_crd_applied_through_the_api_is_served_and_enforced(
    api: httpx.AsyncClient, cluster: EmulatedCluster
) -> None:
    crd = copy.deepcopy(WIDGET_CRD)
    crd["metadata"]["name"] = "gadgets.test.specops.dev"
    crd["spec"]["names"] = {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"}

    applied = await api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    gadgets = "/apis/test.specops.dev/v1/namespaces/default/gadgets"
    refused = await api.post(gadgets, json={**widget(replicas=11, maxReplicas=20), "kind": "Gadget"})

    assert applied.status_code == 201
    assert refused.status_code == 422
    assert refused.json()["message"].startswith('Gadget.test.specops.dev "w" is invalid: spec.replicas')


async def test_a_custom_admission_hook_can_mutate_and_refuse(
    api: httpx.AsyncClient, cluster: EmulatedCluster
) -> None:
    def label_and_limit(operation: str, new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        if new.get("data", {}).get("size") == "huge":
            raise AdmissionError([FieldCause("data.size", "FieldValueForbidden", "Forbidden: too big")])
        return {**new, "metadata": {**new["metadata"], "labels": {"admitted": operation.lower()}}}

    cluster.emulator.admission["v1/configmaps"] = label_and_limit
    configmaps = "/api/v1/namespaces/default/configmaps"

    admitted = await api.post(configmaps, json={"metadata": {"name": "a"}, "data": {"size": "small"}})
    refused = await api.post(configmaps, json={"metadata": {"name": "b"}, "data": {"size": "huge"}})

    assert admitted.json()["metadata"]["labels"] == {"admitted": "create"}
    assert refused.status_code == 422
    assert refused.json()["message"] == 'ConfigMap "b" is invalid: data.size: Forbidden: too big'


def test_optional_old_self_rules_also_run_on_create() -> None:
    crd = copy.deepcopy(WIDGET_CRD)
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"]["replicas"]["x-kubernetes-validations"] = [
        {
            "rule": "!oldSelf.hasValue() || self >= oldSelf.value()",
            "optionalOldSelf": True,
            "message": "replicas may only grow",
        },
        {"rule": "self != 3", "message": "three is unlucky", "reason": "FieldValueForbidden"},
    ]
    admission = CrdAdmission(crd)

    created = admission("CREATE", widget(replicas=2), None)
    with pytest.raises(AdmissionError) as shrunk:
        admission("UPDATE", widget(replicas=1), created)
    with pytest.raises(AdmissionError) as unlucky:
        admission("CREATE", widget(replicas=3), None)

    assert [cause.describe() for cause in shrunk.value.causes] == [
        'spec.replicas: Invalid value: "integer": replicas may only grow'
    ]
    assert [cause.describe() for cause in unlucky.value.causes] == [
        "spec.replicas: Forbidden: three is unlucky"
    ]


@pytest.mark.parametrize(
    ("missing", "field"),
    [
        (("target",), "spec.target"),
        (("draft",), "spec.draft"),
        (("target", "uri"), "spec.target.uri"),
        (("target", "parameters"), "spec.target.parameters"),
    ],
)
def test_a_missing_field_is_one_error_not_one_per_rule_that_reads_it(
    missing: tuple[str, ...], field: str
) -> None:
    body = yaml.safe_load(EXAMPLE.read_text())
    parent = body["spec"]
    for key in missing[:-1]:
        parent = parent[key]
    del parent[missing[-1]]

    with pytest.raises(AdmissionError) as refused:
        CrdAdmission(build_crd())("CREATE", body, None)

    assert [cause.describe() for cause in refused.value.causes] == [f"{field}: Required value"]
