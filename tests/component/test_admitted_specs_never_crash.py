"""Property: whatever the CRD admits, the operator's pure code renders and decides without crashing.

The bodies go through CrdAdmission built from the generated CRD first (as the API server
would); only admitted ones are checked (200 of them here, about 250 drawn).
``specops bench fuzz`` runs the same property with thousands of examples.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings

from specops.domain.names import dns1035_name, label_value, service_name, variant_service_name
from specops_local.fuzz import admit, bodies, check_admitted, load_admission, resource_names
from specops_local.object_names import dns1035_label_errors, label_value_errors

ADMISSION = load_admission()


# a run of refused bodies early on is not a broken strategy (most bodies are admitted; Hypothesis
# still fails with Unsatisfiable if none is)
@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(bodies())
def test_admitted_specs_render_and_decide_without_raising(body: dict[str, Any]) -> None:
    admitted = admit(ADMISSION, body)
    assume(admitted is not None)
    assert admitted is not None
    check_admitted(admitted)


@settings(max_examples=300, deadline=None, database=None)
@given(resource_names)
def test_every_resource_name_yields_valid_service_names_and_label_values(name: str) -> None:
    for derived in (
        service_name(name),
        variant_service_name(name, "stable"),
        variant_service_name(name, "canary"),
    ):
        assert dns1035_label_errors(derived) == [], (name, derived)
    assert label_value_errors(label_value(name)) == [], name
    assert dns1035_name(name) == dns1035_name(name)  # stable: the same input, the same name


@pytest.mark.parametrize(
    ("first", "second"),
    [("llama-3.1-70b", "llama-3-1-70b"), ("a" * 70, "a" * 71), ("70b-chat", "sd-70b-chat")],
)
def test_names_that_are_made_valid_never_meet_another_resource(first: str, second: str) -> None:
    assert service_name(first) != service_name(second)
    assert label_value(first) != label_value(second)
