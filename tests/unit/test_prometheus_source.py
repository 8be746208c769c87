"""spec.metrics.prometheus: what admission (the generated CRD) and the models accept and refuse."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from specops.api.models import PrometheusSource
from specops_local.admission import AdmissionError
from tests.unit.test_crd_rules import _example, admit

SECRET = {"name": "prometheus-auth", "key": "token"}
MANAGED = {
    "url": "https://mimir.example/prometheus",
    "bearerTokenSecret": SECRET,
    "tlsConfig": {
        "ca": {"configMap": {"name": "prometheus-ca", "key": "ca.crt"}},
        "serverName": "mimir.example",
    },
    "headers": [{"name": "X-Scope-OrgID", "value": "team-a"}],
}
BAD = {
    "token and basic auth": (
        {**MANAGED, "basicAuth": {"username": SECRET, "password": SECRET}},
        "bearerTokenSecret or basicAuth, not both",
    ),
    "credentials in a header": (
        {"headers": [{"name": "authorization", "value": "Bearer x"}]},
        "set by specops",
    ),
    "a header name with a space": ({"headers": [{"name": "X Org", "value": "a"}]}, "headers[0].name"),
    "a CA from both": (
        {"tlsConfig": {"ca": {"configMap": SECRET, "secret": SECRET}}},
        "exactly one of configMap, secret",
    ),
    "a Secret name that is no DNS label": ({"bearerTokenSecret": {"name": "Prom_Auth", "key": "t"}}, "name"),
}


def _with(prometheus: dict[str, Any]) -> dict[str, Any]:
    body = _example()
    body["spec"]["metrics"] = {"prometheus": prometheus}
    return body


def test_a_managed_prometheus_is_admitted_and_read_by_the_models() -> None:
    admitted = admit(_with(MANAGED))
    source = PrometheusSource.model_validate(admitted["spec"]["metrics"]["prometheus"])
    assert source.bearer_token_secret is not None and source.bearer_token_secret.key == "token"
    assert source.uses_namespace_objects
    # without a URL the operator's default applies (no default is written into the resource)
    assert "url" not in admit(_with({}))["spec"]["metrics"]["prometheus"]
    assert PrometheusSource().url is None and not PrometheusSource().uses_namespace_objects


@pytest.mark.parametrize(("prometheus", "named"), BAD.values(), ids=BAD.keys())
def test_admission_and_the_models_refuse_bad_auth_settings(prometheus: dict[str, Any], named: str) -> None:
    with pytest.raises(AdmissionError) as refused:
        admit(_with(prometheus))
    assert named in str(refused.value) and "spec.metrics.prometheus" in str(refused.value), str(refused.value)
    with pytest.raises(ValidationError):
        PrometheusSource.model_validate(prometheus)


def test_the_models_refuse_a_header_given_twice() -> None:
    # A real API server refuses it too (x-kubernetes-list-type: map, keyed by name)
    twice = {"headers": [{"name": "X-Scope-OrgID", "value": "a"}, {"name": "x-scope-orgid", "value": "b"}]}
    with pytest.raises(ValidationError, match="each header name once"):
        PrometheusSource.model_validate(twice)
