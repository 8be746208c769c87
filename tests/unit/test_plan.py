"""`specops plan`: the table and JSON a user reads before deploying a target/draft pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specops.plan import main

WORKED = ["--gpu", "H100", "--target-params", "70e9", "--draft-params", "7e9", "--alpha", "0.8"]


def plan(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "plan.json"
    assert main([*args, "--json", str(out)]) == 0
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_the_worked_case_reproduces_specdec_values(tmp_path: Path) -> None:
    result = plan(tmp_path, *WORKED, "--context-tokens", "0", "--batches", "1", "32", "128", "256")
    assert result["gpu"] == "H100"
    assert result["latency_ratio_c"] == pytest.approx(0.1)
    rows = {row["batch"]: row for row in result["by_batch"]}
    assert sorted(rows) == [1, 32, 128, 256]
    assert rows[32]["speedup_by_length"]["4"] == pytest.approx(2.40, rel=0.05)
    assert rows[128]["speedup_by_length"]["4"] == pytest.approx(1.31, rel=0.05)
    assert rows[256]["speedup_by_length"]["4"] == pytest.approx(0.71, rel=0.05)
    assert sorted(rows[32]["speedup_by_length"], key=int) == [str(g) for g in range(1, 9)]
    assert rows[32]["best_draft_length"] == 6
    assert rows[128]["best_draft_length"] in (1, 2)
    assert (rows[256]["best_draft_length"], rows[256]["best_speedup"]) == (0, 1.0)
    assert result["break_even_batch"] == 251


def test_break_even_is_where_even_the_best_length_stops_paying(tmp_path: Path) -> None:
    result = plan(tmp_path, *WORKED, "--context-tokens", "0", "--batches", "250,251")
    below, at = result["by_batch"]
    assert below["best_draft_length"] > 0 and below["best_speedup"] > 1.0
    assert at["best_draft_length"] == 0
    assert all(s <= 1.0 for s in at["speedup_by_length"].values())


def test_h200_gains_less_at_batch_128(tmp_path: Path) -> None:
    h200 = plan(tmp_path, "--gpu", "H200", *WORKED[2:], "--context-tokens", "0", "--batches", "128")
    assert h200["by_batch"][0]["speedup_by_length"]["4"] == pytest.approx(0.96, rel=0.05)


def test_long_contexts_move_break_even_up(tmp_path: Path) -> None:
    weights_only = plan(tmp_path, *WORKED, "--context-tokens", "0")
    with_context = plan(tmp_path, *WORKED)  # default context
    assert with_context["context_tokens"] == 2048
    assert with_context["break_even_batch"] is None or with_context["break_even_batch"] > 251
    assert weights_only["break_even_batch"] == 251


def test_without_a_draft_it_compares_candidate_draft_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = plan(
        tmp_path, "--gpu", "H100", "--target-params", "70e9", "--context-tokens", "0", "--batches", "32"
    )
    sizes = [candidate["draft_params"] for candidate in result["candidates"]]
    assert sizes[0] == 0.5e9 and 13e9 in sizes
    speedups = [candidate["by_batch"][0]["best_speedup"] for candidate in result["candidates"]]
    assert speedups == sorted(speedups, reverse=True)  # smaller drafts are cheaper at equal alpha
    printed = capsys.readouterr().out
    assert "0.5B" in printed and "13B" in printed and "break-even" in printed


def test_the_table_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*WORKED, "--context-tokens", "0", "--batches", "32,256"]) == 0
    printed = capsys.readouterr().out
    assert "latency ratio c = 0.100" in printed
    assert "off" in printed
    assert "break-even batch: 251" in printed


def test_json_to_stdout_stays_parseable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*WORKED, "--dtype", "fp8", "--tensor-parallel", "2", "--json", "-"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert (result["dtype"], result["tensor_parallel"]) == ("fp8", 2)
    assert "latency ratio" in captured.err


@pytest.mark.parametrize(
    "bad",
    [
        ["--gpu", "V100", "--target-params", "70e9"],
        [*WORKED, "--alpha", "1.5"],
        [*WORKED, "--batches", "0"],
        [*WORKED, "--batches", "many"],
        [*WORKED, "--max-draft-len", "0"],
    ],
)
def test_bad_input_is_refused(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(bad)
    assert exit_info.value.code == 2


def test_a_profile_replaces_the_roofline(tmp_path: Path) -> None:
    # the roofline of 8B/1B puts break-even far out; the measured launch-floor profile at batch 12
    result = plan(tmp_path, "--profile", "llama8b-1b-draft-floor-h100", "--batches", "1,8,16")
    assert result["profile"] == "llama8b-1b-draft-floor-h100" and result["alpha"] == 0.72
    rows = {row["batch"]: row for row in result["by_batch"]}
    assert rows[1]["best_draft_length"] == 1 and rows[1]["best_speedup"] == pytest.approx(1.08, abs=0.01)
    assert rows[16]["best_draft_length"] == 0
    assert result["break_even_batch"] == 12
    roofline = plan(tmp_path, "--gpu", "H100", "--target-params", "8e9", "--draft-params", "1e9")
    assert roofline["break_even_batch"] is None or roofline["break_even_batch"] > 100


def test_a_missing_profile_or_missing_setup_is_refused(tmp_path: Path) -> None:
    for bad in (["--profile", str(tmp_path / "nope.json")], ["--target-params", "70e9"]):
        with pytest.raises(SystemExit) as exit_info:
            main(bad)
        assert exit_info.value.code == 2
