"""Every revision specops renders starts the simulated engine of its backend, whose parsing is as
strict as the real engine's, and the engine reads back the very schedule specops decided.

The renderer and the simulated engines were written from the engines' documented formats
independently; this test holds them to each other for every backend, method and a plain pod."""

from __future__ import annotations

import pytest

from specops.domain.engine_pod import PodInputs, engine_pod
from specops.domain.engines import engine_for
from specops.domain.engines.schedule import METHODS, PLAIN, Method, Revision, Schedule
from specops_local.sim import parse

BACKENDS = ("triton", "trtllm-serve", "vllm", "sglang")
SCHEDULES = (
    Schedule.of([[4, 4], [16, 2], [64, 1], [None, 0]]),
    Schedule.of([[24, 6], [96, 3], [None, 1]]),
    Schedule.constant(3),
)
INPUTS = PodInputs(
    image="engine:1",
    target_uri="pvc://models/target",
    draft_uri="pvc://models/draft",
    gpus=2,
    tensor_parallel=2,
    served_model_name="llama-3.1-70b-instruct",
)
SGLANG_FIXED = ("draftModel", "ngram")
"""SGLang adapts only EAGLE methods: these run the schedule's largest K at every batch."""


def started(backend: str, revision: Revision):  # type: ignore[no-untyped-def]
    engine = engine_for(backend, triton_model_source="# specops model\n")
    data, pod, _ = engine_pod(engine, revision, INPUTS, "cm")
    (container,) = pod["containers"]
    files: dict[str, str] = {}
    for volume in pod["volumes"]:
        if "configMap" not in volume:
            continue
        mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
        for item in volume["configMap"]["items"]:
            files[f"{mount['mountPath']}/{item['path']}"] = data[item["key"]]
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    return parse([*container["command"], *container["args"]], files, env)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_plain_revision_starts_each_engine_without_speculation(backend: str) -> None:
    config = started(backend, PLAIN)
    assert config.backend == backend and config.spec is None
    assert config.tensor_parallel == 2


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.describe())
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_engine_applies_the_schedule_specops_decided(
    backend: str, method: Method, schedule: Schedule
) -> None:
    revision = Revision(
        mode="spec",
        method=method,
        draft="v3" if method in ("draftModel", "eagle3") else None,
        schedule=schedule,
    )
    config = started(backend, revision)
    assert config.backend == backend and config.spec is not None
    assert config.spec.max_k == schedule.max_k
    for batch in (1, 2, 4, 5, 16, 17, 24, 25, 64, 65, 96, 97, 500, 1024):
        expected = schedule.max_k if backend == "sglang" and method in SGLANG_FIXED else schedule.k_at(batch)
        assert config.spec.k_at(batch) == expected, (batch, config.spec.schedule.describe())
