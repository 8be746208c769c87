"""`specops bench canary`: the canary judgement catches a worse draft fast and rarely rolls back a good one."""

from __future__ import annotations

import json
import random
import statistics
from typing import Any

import pytest

from specops import bench
from specops.bench.canary import RESULT_KEYS, Traffic, measure_interval, upper_bound_95

TRAFFIC = Traffic(
    request_rate=10.0,
    tokens_per_request=256.0,
    interval_s=15.0,
    draft_length=4,
    request_alpha_sd=0.10,
    drift_sd=0.01,
)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "canary.json"
    argv = ["canary", "--json", str(out), "--runs", "200", "--aa-runs", "200", "--bad-runs", "50"]
    assert bench.main(argv) == 0
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def test_the_result_states_its_inputs_and_assumptions(result: dict[str, Any]) -> None:
    assert set(RESULT_KEYS) <= set(result)
    assert (result["request_rate"], result["canary_weight"], result["interval_s"]) == (10.0, 0.10, 15.0)
    assert result["aa_runs"] == 200
    assert any("10 req/s" in line for line in result["assumptions"])
    assert [step["weight"] for step in result["steps"]] == [0.05, 0.10, 0.25, 0.50, 1.0]


def test_a_five_percent_worse_draft_fails_within_one_bake_with_95_percent_power(
    result: dict[str, Any],
) -> None:
    # given a draft 5 % worse in alpha at 10 % of 10 req/s, analysed over its first n intervals
    # then >= 95 % of runs say FAIL well within one default 10-minute bake
    assert result["detect_intervals_95"] is not None
    assert result["power_at_detect"] >= 0.95
    assert result["detect_seconds_95"] == result["detect_intervals_95"] * 15.0
    assert result["detect_seconds_95"] <= 300.0


def test_equal_drafts_are_rarely_rolled_back_over_the_full_schedule(result: dict[str, Any]) -> None:
    # given 200 A/A canaries through 5/10/25/50/100 % with the default limits
    # then at most 1 % roll back, and a promotion takes about the four 10-minute bakes
    assert result["false_rollback_rate"] <= 0.01
    assert 40.0 <= result["aa_mean_minutes_to_promote"] <= 60.0


def test_the_worse_draft_is_rolled_back_over_the_full_schedule(result: dict[str, Any]) -> None:
    assert result["bad_rollback_rate"] >= 0.98
    assert result["bad_rollback_at_first_step_rate"] >= 0.9


def test_less_canary_traffic_means_noisier_alpha() -> None:
    # the estimate comes from a finite number of verification steps and prompts
    rng = random.Random(3)

    def spread(weight: float) -> tuple[float, float]:
        values = [measure_interval(rng, 0.75, weight, TRAFFIC).alpha for _ in range(400)]
        alphas = [a for a in values if a is not None]
        return statistics.mean(alphas), statistics.stdev(alphas)

    small_mean, small_sd = spread(0.05)
    large_mean, large_sd = spread(0.50)
    assert small_mean == pytest.approx(0.75, abs=0.01)
    assert large_mean == pytest.approx(0.75, abs=0.005)
    assert small_sd > 2.5 * large_sd


def test_upper_bound_of_a_rate() -> None:
    assert upper_bound_95(0, 300) == pytest.approx(0.00994, abs=1e-4)  # the "rule of three"
    assert upper_bound_95(2, 200) == pytest.approx(0.03114, abs=1e-4)  # Clopper-Pearson
    assert upper_bound_95(5, 5) == 1.0
