"""A serving profile from a ConfigMap as the calibration's prior, instead of the roofline."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from specops import profiles
from specops.api import conditions as cond
from specops.domain import profile_prior
from specops.domain.calibration import (
    CalibratedModel,
    CalibrationConfig,
    CalibrationState,
    StepSample,
    update,
)
from specops.ports import KubeApiError
from specops.rbac import grants
from specops.services.control import ControlLoop
from specops.services.reconciler import stable_plan
from tests.unit.test_control_loop import ALPHA, T0, World, fresh, resource, slow_world
from tests.unit.test_control_loop import setup as roofline_setup

PROFILE = slow_world()  # loses from batch ~10; the roofline prior says ~250


def setup() -> Any:
    return roofline_setup()


@pytest.mark.parametrize(
    "profile", [PROFILE, profiles.load_builtin("qwen3-30b-a3b-moe-eagle3-h100")], ids=lambda p: p.name
)
def test_with_nothing_measured_the_model_is_the_profile_not_the_roofline(profile: Any) -> None:
    prior = profile_prior.prior_statistics(profile, setup(), CalibrationConfig(), 8)
    model = profile_prior.model(setup(), CalibrationState(), CalibrationConfig(), prior)
    roofline = CalibratedModel(setup())
    for batch in (1, 4, 16, 64):
        for g in (1, 3, 6):
            assert model.predict_speedup(0.7, g, batch) == pytest.approx(
                profile.speedup(0.7, g, batch), rel=0.08
            )
    assert abs(roofline.predict_speedup(0.7, 3, 32) - profile.speedup(0.7, 3, 32)) > 0.3
    # the profile's pseudo-samples are no measurements: probes and the guard still see none
    assert model.confidence(16).on == model.confidence(16).off == 0.0


def test_measurements_override_the_profile_as_they_accumulate() -> None:
    config = CalibrationConfig()
    prior = profile_prior.prior_statistics(PROFILE, setup(), config, 8)
    # the deployment runs the plain roofline (the profile was measured elsewhere): plain steps at 32
    truth = CalibratedModel(setup())
    data = CalibrationState()
    for i in range(200):
        data = update(data, StepSample(32, 3, truth.step_s(3, 32) / 2.95, 0.8), setup(), float(i), config)
        data = update(data, StepSample(32, 0, truth.step_s(0, 32)), setup(), float(i), config)
    learned = profile_prior.model(setup(), data, config, prior)
    assert learned.predict_speedup(0.8, 3, 32) == pytest.approx(truth.predict_speedup(0.8, 3, 32), rel=0.05)


class Kube:
    """The one KubePort call the profile needs: get a ConfigMap."""

    def __init__(self, data: dict[str, str] | None, error: KubeApiError | None = None) -> None:
        self.data = data
        self.error = error
        self.reads = 0

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        assert (api_version, kind, namespace, name) == ("v1", "ConfigMap", "default", "measured")
        self.reads += 1
        if self.error is not None:
            raise self.error
        return None if self.data is None else {"data": self.data}


def with_profile(*, enabled: bool = True) -> Any:
    sdep = resource()
    body = sdep.model_dump(by_alias=True, exclude_none=True)
    body["spec"]["speculation"]["calibration"] = {
        "enabled": enabled,
        "profile": {"configMapRef": {"name": "measured", "key": "profile.json"}},
    }
    return type(sdep).model_validate(body)


async def ticks(loop: ControlLoop, sdep: Any, world: World, seconds: int) -> tuple[Any, list[Any]]:
    status = fresh()
    updates: list[Any] = []
    world.revision, world.holdback = stable_plan(sdep)  # as the reconciler first renders the pods
    for second in range(seconds):
        result = await loop.tick(
            sdep, status, world.pods(), T0 + timedelta(seconds=second), draft_stale=False
        )
        status = result.status
        updates.extend(result.updates)
        if result.roll_to is not None:
            world.revision = result.roll_to
            world.holdback = result.status.speculation.holdback is not None
    return status, updates


async def test_a_profile_in_a_config_map_is_the_prior_shown_in_status_and_decides_alone_without_learning() -> (
    None
):
    kube = Kube({"profile.json": json.dumps(PROFILE.to_dict())})
    world = World(PROFILE, batch=32)
    loop = ControlLoop(world, rate_window_s=2.0, kube=kube)
    status, updates = await ticks(loop, with_profile(enabled=False), world, 60)
    shown = status.speculation.calibration
    assert (
        shown.model_source == "profile" and shown.prior_source == "profile" and shown.profile_name == "slow"
    )
    # the profile's break-even, not the roofline's ~250
    expected = PROFILE.break_even_batch(status.speculation.smoothed_alpha or ALPHA)
    assert shown.prior_break_even_batch is not None and expected is not None
    assert abs(shown.prior_break_even_batch - expected) <= 0.3 * expected
    # and decisions follow it: no drafting at batch 32, where the roofline says speculation pays
    assert status.speculation.control_phase == "Dynamic"
    assert world.revision.schedule is None or world.revision.schedule.k_at(32) == 0
    loaded = [u for u in updates if u.type == cond.CALIBRATION_PROFILE]
    assert loaded and all(u.status == "True" and u.reason == "ProfileLoaded" for u in loaded)
    assert kube.reads == 1  # read again at most every minute


async def test_with_learning_the_source_reads_profile_until_a_sample_lands() -> None:
    kube = Kube({"profile.json": json.dumps(PROFILE.to_dict())})
    world = World(PROFILE, batch=32)
    loop = ControlLoop(world, rate_window_s=2.0, kube=kube)
    status, _ = await ticks(loop, with_profile(), world, 1)
    assert status.speculation.calibration.model_source == "profile"
    status, _ = await ticks(loop, with_profile(), world, 60)
    shown = status.speculation.calibration
    assert shown.model_source == "calibrated" and shown.prior_source == "profile" and shown.samples > 0


@pytest.mark.parametrize(
    ("kube", "reason", "says"),
    [
        (Kube(None), "ProfileNotFound", "does not exist"),
        (Kube({"other": "{}"}), "ProfileNotFound", "no such key"),
        (Kube({"profile.json": "{not json"}), "ProfileInvalid", "not a serving profile"),
        (
            Kube({"profile.json": '{"name": "x", "batches": [1, 2]}'}),
            "ProfileInvalid",
            "not a serving profile",
        ),
        (
            Kube(None, KubeApiError(403, "Forbidden", "configmaps is forbidden")),
            "ProfileNotFound",
            "Forbidden",
        ),
    ],
)
async def test_a_missing_or_bad_profile_says_why_and_falls_back_to_the_roofline(
    kube: Kube, reason: str, says: str
) -> None:
    world = World(PROFILE, batch=32)
    loop = ControlLoop(world, rate_window_s=2.0, kube=kube)
    status, updates = await ticks(loop, with_profile(enabled=False), world, 60)
    failed = [u for u in updates if u.type == cond.CALIBRATION_PROFILE]
    assert failed and failed[-1].status == "False" and failed[-1].reason == reason, failed
    assert says in failed[-1].message and "roofline" in failed[-1].message
    shown = status.speculation.calibration
    assert shown.prior_source == "roofline" and shown.model_source == "prior"
    assert shown.prior_break_even_batch is None or shown.prior_break_even_batch > 100
    schedule = world.revision.schedule  # the roofline says it pays at 32
    assert status.speculation.state == "on" and schedule is not None and schedule.k_at(32) > 0


def test_the_operator_may_read_config_maps() -> None:
    assert "get" in grants()[("", "configmaps")]
