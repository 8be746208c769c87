"""The models parse the examples, apply defaults, and refuse what the CEL rules refuse."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from specops.api.base import SharedModels
from specops.api.models import SpeculativeDeployment
from specops.api.units import format_duration, parse_duration, parse_parameters
from specops.domain.lifecycle import describe_validation_error

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def example(name: str = "dense-70b-7b.yaml") -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name).read_text())


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_parse(path: Path) -> None:
    resource = SpeculativeDeployment.model_validate(yaml.safe_load(path.read_text()))
    target = resource.spec.target.active_parameter_count
    assert target > resource.spec.draft.parameter_count_for(target)


def test_minimal_resource_gets_sane_defaults() -> None:
    body = {
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {
            "target": {"model": "t", "version": "1", "parameters": "70B", "uri": "pvc://models/t"},
            "draft": {"model": "d", "version": "v1", "parameters": "1B", "uri": "pvc://models/d"},
        },
    }
    spec = SpeculativeDeployment.model_validate(body).spec
    assert spec.serving.backend == "triton" and spec.serving.replicas == 1
    assert spec.draft.method == "draftModel"
    assert (spec.serving.max_surge, spec.serving.max_unavailable) == (1, 0)
    assert (
        spec.speculation.reconfigure.min_gain == 0.03 and spec.speculation.reconfigure.min_interval == "30m"
    )
    assert spec.speculation.mode == "auto"
    assert (spec.speculation.draft_length.initial, spec.speculation.draft_length.max) == (4, 8)
    assert [s.weight for s in spec.canary.steps] == [5, 10, 25, 50, 100]
    assert spec.retraining.triggers.acceptance_below_slo is None


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (
            lambda s: s["speculation"].update(draftLength={"initial": 9, "min": 1, "max": 8}),
            "speculation.draftLength",
        ),
        (
            lambda s: s["speculation"].update(draftLength={"initial": 4, "min": 1, "max": 17}),
            "draftLength.max",
        ),
        (lambda s: s["serving"].update(tensorParallel=3), "serving.tensorParallel"),
        (lambda s: s.update(canary={"steps": [{"weight": 50}, {"weight": 10}]}), "canary.steps"),
        (lambda s: s["target"].update(uri="s3://bucket/target"), "serving.checkpointFetcherImage"),
        (lambda s: s["target"].update(uri="hf://meta-llama/Llama-3.1-70B"), "target.uri"),
        (lambda s: s["draft"].update(method="mtp"), "draft.uri"),
        (lambda s: s["draft"].pop("uri"), "draft.uri"),
        (lambda s: s["draft"].update(parameters="70B"), "draft.parameters"),
        (lambda s: s["draft"].update(uri=s["target"]["uri"]), "draft.uri"),
        (lambda s: s["serving"].update(maxSurge=0, maxUnavailable=0), "serving.maxUnavailable"),
        (lambda s: s["serving"].update(backend="triton-trtllm"), "serving.backend"),
        (lambda s: s["target"].update(parameters="seventy"), "target.parameters"),
        (lambda s: s["speculation"].update(mode="sometimes"), "speculation.mode"),
    ],
)
def test_invalid_specs_name_the_field(mutate: Any, field: str) -> None:
    body = example()
    spec = copy.deepcopy(body["spec"])
    mutate(spec)
    body["spec"] = spec
    with pytest.raises(ValidationError) as info:
        SpeculativeDeployment.model_validate(body)
    assert field in describe_validation_error(info.value)


def test_units() -> None:
    assert parse_duration("1h30m") == 5400 and parse_duration("250ms") == 0.25
    assert parse_parameters("1.5B") == 1.5e9 and parse_parameters("70e9") == 70e9
    assert format_duration(0.024) == "24ms"
    with pytest.raises(ValueError, match="unit"):
        parse_duration("10")


def test_shared_models_hold_equal_parts_once_and_never_mix_unequal_ones() -> None:
    """The tick keeps one typed spec per resource; across a fleet most parts are equal (defaults,
    one team's settings) and are held once. Unequal parts must never be conflated."""
    shared = SharedModels()
    bodies = [example() for _ in range(3)]
    bodies[1]["spec"]["target"]["model"] = "org/another-target"
    bodies[2]["spec"]["canary"] = {"steps": [{"weight": 5, "pause": "2m"}, {"weight": 50, "pause": "5m"}]}
    specs = [SpeculativeDeployment.model_validate(body).spec for body in bodies]
    kept = [shared.share(spec) for spec in specs]

    assert kept == specs  # equal in every field to what was validated
    assert shared.share(SpeculativeDeployment.model_validate(example()).spec) is kept[0]
    assert kept[1].target.model == "org/another-target" and kept[0].target.model != "org/another-target"
    assert kept[1].draft is kept[0].draft and kept[1].speculation is kept[0].speculation
    assert [step.weight for step in kept[2].canary.steps] == [5, 50]
    assert kept[2].canary is not kept[0].canary and kept[2].slo is kept[0].slo
