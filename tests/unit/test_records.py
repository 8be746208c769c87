"""The control loop's `replace`: what `dataclasses.replace` builds, for every kind of record."""

from __future__ import annotations

import dataclasses
import functools
from datetime import UTC, datetime

import pytest

from specops.domain.calibration import CalibratedModel, CalibrationState
from specops.domain.engines.schedule import PLAIN
from specops.domain.perf import GPUS, ModelSetup
from specops.domain.records import replace
from specops.domain.revision_step import StepState


@dataclasses.dataclass(frozen=True)
class _Plain:
    a: int
    b: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Checked:
    a: int

    def __post_init__(self) -> None:
        if self.a < 0:
            raise ValueError("a must be >= 0")


@dataclasses.dataclass(frozen=True)
class _Cached:
    a: int

    @functools.cached_property
    def double(self) -> int:
        return 2 * self.a


def test_a_plain_record_is_the_same_as_dataclasses_replace_and_the_original_is_untouched() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    state = StepState("Dynamic", at, PLAIN, alpha=0.7, last_change=at)
    fast = replace(state, alpha=0.8, last_change=None)
    assert fast == dataclasses.replace(state, alpha=0.8, last_change=None)
    assert type(fast) is StepState and fast is not state
    assert (state.alpha, fast.alpha) == (0.7, 0.8)
    assert hash(fast) == hash(dataclasses.replace(state, alpha=0.8, last_change=None))
    calibration = CalibrationState()
    assert replace(calibration, samples=2) == dataclasses.replace(calibration, samples=2)


@dataclasses.dataclass(frozen=True, init=False)
class _OwnInit:
    a: int

    def __init__(self, a: int) -> None:
        object.__setattr__(self, "a", abs(a))


@dataclasses.dataclass(frozen=True)
class _BodyInit:
    a: int

    def __init__(self, a: int) -> None:  # kept by @dataclass in place of the one it would write
        object.__setattr__(self, "a", abs(a))


class _Overriding(_Plain):
    def __init__(self, a: int, b: tuple[int, ...] = ()) -> None:
        super().__init__(a, tuple(sorted(b)))


def test_a_record_whose_init_does_more_than_store_goes_through_its_init() -> None:
    assert replace(_OwnInit(1), a=-3).a == 3
    assert replace(_Overriding(1), b=(3, 2)).b == (2, 3)
    assert replace(_BodyInit(1), a=-3).a == 3
    with pytest.raises(ValueError, match="a must be >= 0"):
        replace(_Checked(1), a=-1)
    cached = _Cached(2)
    assert cached.double == 4
    assert replace(cached, a=5).double == 10  # nothing cached is carried over
    model = CalibratedModel(ModelSetup(GPUS["H100"], 70e9, 7e9))
    model.step_s(0, 8.0)  # its roofline worked out and cached
    small = ModelSetup(GPUS["H100"], 8e9, 1e9)
    moved = replace(model, setup=small)
    assert moved.step_s(0, 8.0) == CalibratedModel(small).step_s(0, 8.0) != model.step_s(0, 8.0)


def test_a_name_that_is_not_a_field_is_refused() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        replace(_Plain(1), c=2)
    assert replace(_Plain(1), b=(2,)) == _Plain(1, (2,))
