"""`specops plan` through its entry point: the table and JSON a user reads before deploying a pair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from specops.api.models import SpeculativeDeployment
from specops.cli import main as specops
from specops.domain import perf
from specops.domain.revision_step import config_from_spec

ROOT = Path(__file__).resolve().parents[2]
WORKED = ["--gpu", "H100", "--target-params", "70e9", "--draft-params", "7e9", "--alpha", "0.8"]


def run(*args: str) -> Result:
    return CliRunner().invoke(specops, ["plan", *args], catch_exceptions=False)


def plan(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "plan.json"
    result = run(*args, "--json", str(out))
    assert result.exit_code == 0, result.output
    parsed: dict[str, Any] = json.loads(out.read_text())
    return parsed


def test_the_worked_case_reproduces_specdec_values(tmp_path: Path) -> None:
    result = plan(tmp_path, *WORKED, "--context-tokens", "0", "--batches", "1,32", "--batches", "128,256")
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
    with_context = plan(tmp_path, *WORKED, "--context-tokens", "2048")
    assert with_context["break_even_batch"] is None or with_context["break_even_batch"] > 251
    assert weights_only["break_even_batch"] == 251


def test_plan_and_the_operator_assume_the_same_context(tmp_path: Path) -> None:
    example = ROOT / "docs" / "examples" / "dense-70b-7b.yaml"
    from_file = plan(tmp_path, "-f", str(example))
    spec = SpeculativeDeployment.model_validate(yaml.safe_load(example.read_text())).spec
    operator_setup = config_from_spec(spec, spec.draft).setup
    assert from_file["context_tokens"] == operator_setup.context_tokens == perf.DEFAULT_CONTEXT_TOKENS
    assert from_file["break_even_batch"] == perf.best_length_break_even_batch(operator_setup, 0.8, 8)
    assert (from_file["gpu"], from_file["tensor_parallel"], from_file["source"]) == (
        "H100",
        4,
        "llama-70b-chat",
    )


def test_crd_parameter_strings_and_plain_numbers_mean_the_same(tmp_path: Path) -> None:
    by_suffix = plan(tmp_path, "--gpu", "H100", "--target-params", "70B", "--draft-params", "1.5B")
    by_number = plan(tmp_path, "--gpu", "H100", "--target-params", "70000000000", "--draft-params", "1.5e9")
    assert by_suffix["target_params"] == by_number["target_params"] == 70e9
    assert by_suffix["draft_params"] == by_number["draft_params"] == 1.5e9
    assert by_suffix["break_even_batch"] == by_number["break_even_batch"]


def test_options_override_the_resource(tmp_path: Path) -> None:
    example = ROOT / "docs" / "examples" / "dense-70b-7b.yaml"
    result = plan(tmp_path, "-f", str(example), "--gpu", "A100", "--draft-params", "1B")
    assert (result["gpu"], result["draft_params"], result["target_params"]) == ("A100", 1e9, 70e9)


def test_a_moe_resource_is_planned_on_its_active_parameters(tmp_path: Path) -> None:
    example = ROOT / "docs" / "examples" / "moe-expert-distilled.yaml"
    spec = SpeculativeDeployment.model_validate(yaml.safe_load(example.read_text())).spec
    result = plan(tmp_path, "-f", str(example))
    assert result["active_params"] == spec.target.active_parameter_count < spec.target.parameter_count
    assert result["target_params"] == spec.target.parameter_count
    operator_setup = config_from_spec(spec, spec.draft).setup
    assert result["break_even_batch"] == perf.best_length_break_even_batch(operator_setup, 0.8, 6)


def test_active_params_plan_a_moe_target_and_its_weights_must_still_fit(tmp_path: Path) -> None:
    moe = ["--gpu", "H100", "--target-params", "235B", "--active-params", "22B", "--draft-params", "1B"]
    on_8 = plan(tmp_path, *moe, "--tensor-parallel", "8")
    dense_22b = plan(
        tmp_path, "--gpu", "H100", "--target-params", "22B", "--draft-params", "1B", "--tensor-parallel", "8"
    )
    assert on_8["break_even_batch"] == dense_22b["break_even_batch"]  # a step reads the active weights
    assert on_8["warnings"] == []
    # ...but all 235B must sit in memory: 472 GB of bf16 do not fit 4 x 80 GB
    on_4 = run(*moe, "--tensor-parallel", "4")
    assert (
        "warning: the weights (472 GB in bf16) do not fit 4 x H100 (320 GB): tensor parallel 6 or more"
        in on_4.output
    )
    refused = run("--gpu", "H100", "--target-params", "22B", "--active-params", "70B")
    assert refused.exit_code == 2 and "--active-params" in refused.output


def test_without_a_draft_it_compares_candidate_draft_sizes(
    tmp_path: Path,
) -> None:
    args = ("--gpu", "H100", "--target-params", "70e9", "--context-tokens", "0", "--batches", "32")
    result = plan(tmp_path, *args)
    sizes = [candidate["draft_params"] for candidate in result["candidates"]]
    assert sizes[0] == 0.5e9 and 13e9 in sizes
    speedups = [candidate["by_batch"][0]["best_speedup"] for candidate in result["candidates"]]
    assert speedups == sorted(speedups, reverse=True)  # smaller drafts are cheaper at equal alpha
    printed = run(*args).output
    assert "0.5B" in printed and "13B" in printed and "break-even" in printed


def test_the_table_is_printed() -> None:
    result = run(*WORKED, "--context-tokens", "0", "--batches", "32,256")
    assert result.exit_code == 0
    printed = result.output
    assert "latency ratio c = 0.100" in printed
    assert "off" in printed
    assert "break-even batch: 251" in printed
    assert "g: draft length" in printed and "c: latency ratio" in printed


def test_a_draft_as_large_as_the_target_never_pays_and_is_warned_about(tmp_path: Path) -> None:
    args = ("--gpu", "H100", "--target-params", "8B", "--draft-params", "8B")
    printed = run(*args).output
    assert "speculation never pays" in printed and "break-even batch: 1" not in printed
    assert "warning: the draft (8B) is as large as the target (8B) or larger" in printed
    assert "warning: latency ratio c = 1.000 is at least alpha 0.80" in printed
    result = plan(tmp_path, *args)
    assert result["break_even_batch"] == 1 and len(result["warnings"]) == 2


def test_c_at_or_above_alpha_is_warned_about_even_for_a_small_draft() -> None:
    printed = run("--gpu", "H100", "--target-params", "8B", "--draft-params", "3B", "--alpha", "0.3").output
    assert "warning: latency ratio c = 0.375 is at least alpha 0.30" in printed
    assert "as large as the target" not in printed
    assert "speculation never pays" in printed


def test_always_paying_says_so() -> None:
    printed = run(*WORKED, "--context-tokens", "4096").output
    assert "speculation pays at every batch up to 4096" in printed and "none up to" not in printed
    candidates = run("--gpu", "H100", "--target-params", "8B", "--alpha", "0.1", "--batches", "1").output
    assert "never" in candidates and "g: draft length" in candidates  # 3B at c 0.375 > alpha 0.1


def test_weights_that_do_not_fit_are_warned_about() -> None:
    printed = run("--gpu", "H100", "--target-params", "70B", "--draft-params", "7B").output
    assert (
        "warning: the weights (154 GB in bf16) do not fit 1 x H100 (80 GB): tensor parallel 2 or more"
        in printed
    )
    fits = run("--gpu", "H100", "--target-params", "70B", "--draft-params", "7B", "--tensor-parallel", "2")
    assert "warning" not in fits.output


def test_gpu_names_are_case_insensitive(tmp_path: Path) -> None:
    assert plan(tmp_path, "--gpu", "h100", *WORKED[2:])["gpu"] == "H100"
    assert plan(tmp_path, "--gpu", "l40s", *WORKED[2:])["gpu"] == "L40S"


@pytest.mark.parametrize(
    "ignored",
    [
        ["--gpu", "H100"],
        ["--target-params", "70B"],
        ["--context-tokens", "1024"],
        ["-f", "x.yaml"],
        ["--dtype", "fp8"],
    ],
)
def test_a_profile_refuses_the_options_it_would_ignore(ignored: list[str]) -> None:
    result = run("--profile", "llama8b-1b-draft-floor-h100", *ignored)
    assert result.exit_code == 2
    assert (
        f"--profile plans from the profile's measured step times: {ignored[0]} would be ignored"
        in result.output
    )


def test_json_to_stdout_stays_parseable() -> None:
    result = CliRunner().invoke(
        specops, ["plan", *WORKED, "--dtype", "fp8", "--tensor-parallel", "2", "--json", "-"]
    )
    assert result.exit_code == 0
    parsed = json.loads(result.stdout)
    assert (parsed["dtype"], parsed["tensor_parallel"]) == ("fp8", 2)
    assert "latency ratio" in result.stderr


@pytest.mark.parametrize(
    "bad",
    [
        ["--gpu", "V100", "--target-params", "70e9"],
        [*WORKED, "--alpha", "1.5"],
        [*WORKED, "--batches", "0"],
        [*WORKED, "--batches", "many"],
        [*WORKED, "--max-draft-len", "0"],
        ["--gpu", "H100", "--target-params", "seventy"],
        ["--gpu", "H100"],
    ],
)
def test_bad_input_is_refused(bad: list[str]) -> None:
    result = run(*bad)
    assert result.exit_code == 2
    assert "Error" in result.output


def test_a_profile_replaces_the_roofline(tmp_path: Path) -> None:
    # the roofline of 8B/1B puts break-even far out; the measured launch-floor profile at batch 12
    result = plan(tmp_path, "--profile", "llama8b-1b-draft-floor-h100", "--batches", "1,8,16")
    assert result["profile"] == "llama8b-1b-draft-floor-h100" and result["alpha"] == 0.72
    rows = {row["batch"]: row for row in result["by_batch"]}
    assert rows[1]["best_draft_length"] == 1 and rows[1]["best_speedup"] == pytest.approx(1.08, abs=0.01)
    assert rows[16]["best_draft_length"] == 0
    assert result["break_even_batch"] == 12
    printed = run("--profile", "llama8b-1b-draft-floor-h100", "--alpha", "0.9", "--batches", "1").output
    assert "break-even batch: " in printed and "none up to" not in printed
    roofline = plan(tmp_path, "--gpu", "H100", "--target-params", "8e9", "--draft-params", "1e9")
    assert roofline["break_even_batch"] is None or roofline["break_even_batch"] > 100


def test_a_missing_profile_or_missing_setup_is_refused(tmp_path: Path) -> None:
    for bad in (["--profile", str(tmp_path / "nope.json")], ["--target-params", "70e9"]):
        result = run(*bad)
        assert result.exit_code == 2 and "Error" in result.output


def sdep(tmp_path: Path, spec: dict[str, Any]) -> str:
    path = tmp_path / "sdep.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "specops.dev/v1alpha1",
                "kind": "SpeculativeDeployment",
                "metadata": {"name": "x"},
                "spec": spec,
            }
        )
    )
    return str(path)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"target": {"model": "m"}}, "spec.target.parameters: field required; spec.draft: field required"),
        ({"target": {"parameters": "70B"}, "draft": {"model": "d"}}, "a draftModel needs draft.parameters"),
        (
            {"target": {"parameters": "seventy"}, "draft": {"parameters": "7B"}},
            "spec.target.parameters: string should match pattern",
        ),
        (
            {
                "target": {"parameters": "70B"},
                "draft": {"parameters": "7B"},
                "serving": {"gpu": {"type": "V100"}},
            },
            "spec.serving.gpu.type: input should be",
        ),
    ],
)
def test_a_spec_plan_cannot_read_is_one_line_naming_the_fields(
    tmp_path: Path, spec: dict[str, Any], said: str
) -> None:
    result = run("-f", sdep(tmp_path, spec))
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and said in result.output, result.output


def test_a_spec_with_only_what_plan_reads_is_planned(tmp_path: Path) -> None:
    # no versions, engines or checkpoints: plan reads sizes, precision, GPUs and lengths only
    spec = {
        "target": {"parameters": "70B"},
        "draft": {"parameters": "7B"},
        "serving": {"gpu": {"type": "H100", "count": 4}, "tensorParallel": 4},
    }
    result = plan(tmp_path, "-f", sdep(tmp_path, spec))
    assert (result["gpu"], result["tensor_parallel"], result["draft_params"]) == ("H100", 4, 7e9)


def test_unreadable_files_are_one_line(tmp_path: Path) -> None:
    garbled = tmp_path / "garbled.yaml"
    garbled.write_text("spec: [\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text("kind: ConfigMap\n")
    for path, said in (
        (tmp_path / "missing.yaml", f"Error: {tmp_path / 'missing.yaml'}: no such file"),
        (garbled, f"Error: {garbled}: not YAML (line 2)"),
        (empty, f"Error: {empty}: no SpeculativeDeployment in it"),
        (tmp_path, f"Error: {tmp_path}: cannot read"),
    ):
        result = run("-f", str(path))
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert result.output.startswith(said), result.output
