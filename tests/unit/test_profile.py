"""Serving profiles: the format, its validation, interpolation, and the shipped profiles."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from specops import profiles
from specops.domain.perf import GPUS, ModelSetup, expected_tokens, speedup
from specops.domain.profile import ProfileError, ServingProfile, profile_from_setup


def raw(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "t",
        "batches": [1, 4, 16],
        "plain_ms": [10.0, 12.0, 20.0],
        "round_ms": {"1": [13.0, 16.0, 30.0], "3": [17.0, 22.0, 50.0]},
        "alpha": 0.7,
    }
    data.update(overrides)
    return data


def test_unknown_keys_carry_provenance_and_are_ignored() -> None:
    profile = ServingProfile.from_json(json.dumps(raw(source=["a paper"], notes="measured on x")))
    assert profile.name == "t"
    assert profile.lengths == (1, 3)
    assert profile.alpha == 0.7
    assert ServingProfile.from_dict(profile.to_dict()) == profile


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"plain_ms": [10.0, 12.0]}, "'plain_ms' has 2 values for 3 batches"),
        ({"batches": [1, 4, 4]}, "strictly increasing"),
        ({"batches": [0, 4, 16]}, "must be positive"),
        ({"plain_ms": [10.0, -1.0, 20.0]}, r"'plain_ms'\[1\] must be a positive time"),
        ({"round_ms": {"0": [1.0, 2.0, 3.0]}}, "draft length must be >= 1"),
        ({"round_ms": {"two": [1.0, 2.0, 3.0]}}, "not an integer draft length"),
        ({"round_ms": {"1": [1.0, 2.0]}}, r"'round_ms\[1\]' has 2 values"),
        ({"round_ms": {}}, "at least one draft length"),
        ({"alpha": 1.5}, "'alpha' must be in"),
        ({"batches": "1,2,3"}, "non-empty list of numbers"),
        ({"plain_ms": [10.0, "fast", 20.0]}, "is not a number"),
    ],
)
def test_invalid_profiles_are_refused_with_the_field_named(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        ServingProfile.from_dict(raw(**overrides))


def test_missing_key_and_non_json_are_refused() -> None:
    data = raw()
    del data["plain_ms"]
    with pytest.raises(ProfileError, match="missing required key 'plain_ms'"):
        ServingProfile.from_dict(data)
    with pytest.raises(ProfileError, match="not JSON"):
        ServingProfile.from_json("{")


def test_interpolation_is_log_log_between_grid_points_and_clamped_outside() -> None:
    profile = ServingProfile.from_dict(raw())
    assert profile.plain_ms_at(4) == 12.0
    # halfway between 4 and 16 in log(batch) is 8: the geometric mean of the two times
    assert profile.plain_ms_at(8) == pytest.approx(math.sqrt(12.0 * 20.0))
    assert profile.plain_ms_at(0.5) == 10.0
    assert profile.plain_ms_at(1000) == 20.0
    assert profile.round_ms_at(3, 2) == pytest.approx(math.exp((math.log(17.0) + math.log(22.0)) / 2))


def test_missing_lengths_interpolate_linearly_between_present_ones_and_refuse_outside() -> None:
    profile = ServingProfile.from_dict(raw())
    assert profile.round_ms_at(2, 4) == pytest.approx((16.0 + 22.0) / 2)
    assert profile.round_ms_at(0, 4) == profile.plain_ms_at(4)
    with pytest.raises(ValueError, match="outside the profiled lengths"):
        profile.round_ms_at(4, 4)


def test_speedup_is_expected_tokens_times_plain_over_round() -> None:
    profile = ServingProfile.from_dict(raw())
    assert profile.speedup(0.7, 3, 4) == pytest.approx(expected_tokens(0.7, 3) * 12.0 / 22.0)
    assert profile.speedup(0.7, 0, 4) == 1.0
    assert profile.per_token_ms(0.7, 3, 16) == pytest.approx(50.0 / expected_tokens(0.7, 3))


def test_a_tabulated_roofline_reproduces_the_roofline_on_its_grid() -> None:
    setup = ModelSetup(GPUS["H100"], 70e9, 7e9)
    profile = profile_from_setup("roofline", setup)
    for batch in (1, 8, 64, 256):
        for g in (1, 4, 8):
            assert profile.speedup(0.8, g, batch) == pytest.approx(speedup(setup, 0.8, batch, g))


def test_shipped_profiles_load_and_include_an_early_break_even_and_a_never_pays_world() -> None:
    names = profiles.list_builtin()
    assert len(names) >= 4
    break_evens = {}
    for name in names:
        profile = profiles.load_builtin(name)
        assert profile.name == name
        assert profile.lengths == tuple(range(1, 9))
        assert profile.alpha is not None
        break_evens[name] = profile.break_even_batch(profile.alpha)
    assert break_evens["llama8b-1b-draft-floor-h100"] in range(8, 17)
    assert break_evens["qwen3-30b-a3b-moe-eagle3-h100"] == 1
    assert break_evens["llama3.1-8b-longctx-magicdec"] is None


def test_shipped_profiles_cite_their_sources() -> None:
    folder = Path(profiles.__file__).parent
    readme = (folder / "README.md").read_text()
    for name in profiles.list_builtin():
        data = json.loads((folder / f"{name}.json").read_text())
        assert data["source"] and data["notes"]
        assert f"`{name}`" in readme


def test_resolve_takes_a_builtin_name_or_a_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(raw(name="mine")))
    assert profiles.resolve(str(path)).name == "mine"
    assert profiles.resolve("qwen3-32b-eagle3-2xh200").name == "qwen3-32b-eagle3-2xh200"
    with pytest.raises(FileNotFoundError, match="neither a profile file nor a builtin"):
        profiles.resolve(str(tmp_path / "absent.json"))
    path.write_text(json.dumps(raw(plain_ms=[1.0])))
    with pytest.raises(ProfileError, match=r"mine\.json"):
        profiles.load(path)
