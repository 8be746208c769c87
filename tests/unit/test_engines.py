"""Each engine adapter renders a revision in its engine's own documented format.

The rules checked here are the engines' own (docs/serving.md cites them): TensorRT-LLM's
``draft_len_schedule`` keys are upper edges with the smallest key's K equal to max_draft_len
and K = 0 above the last key; vLLM's ranges are inclusive, start at 1 and keep the last K;
SGLang's adaptive slots are lower edges. Golden files hold every backend x method rendering.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import yaml

from specops.domain.engines import engine_for
from specops.domain.engines.base import ServingInputs
from specops.domain.engines.schedule import METHODS, PLAIN, Method, Revision, Schedule
from specops.domain.engines.sglang import adaptive_config
from specops.domain.engines.trtllm import draft_len_schedule
from specops.domain.engines.vllm import per_batch_size
from tests.unit.golden import assert_golden

BACKENDS = ("triton", "trtllm-serve", "vllm", "sglang")
SCHEDULE = Schedule.of([[4, 4], [16, 2], [64, 1], [None, 0]])
SERVING = ServingInputs(served_model_name="llama-3.1-70b-instruct", tensor_parallel=4)


def spec(method: Method, schedule: Schedule = SCHEDULE) -> Revision:
    draft = "llama-3.2-1b-v3" if method in ("draftModel", "eagle3") else None
    return Revision(mode="spec", method=method, draft=draft, schedule=schedule)


def _trtllm_engine_k(schedule: dict[int, int], batch: int) -> int:
    """TensorRT-LLM's rule: the first key >= batch, K = 0 above the last key."""
    for key in sorted(schedule):
        if key >= batch:
            return schedule[key]
    return 0


def _vllm_engine_k(ranges: list[list[int]], batch: int) -> int:
    """vLLM's rule: the inclusive range holding the batch; above the last, its K carries on."""
    for start, end, k in ranges:
        if start <= batch <= end:
            return k
    return ranges[-1][2]


def _sglang_engine_k(config: dict[str, object], batch: int) -> int:
    """SGLang's rule: the largest slot key <= batch."""
    slots = sorted(int(key) for key in config if key.isdigit())
    key = max(slot for slot in slots if slot <= batch)
    steps = config[str(key)]
    assert isinstance(steps, dict)
    return int(steps["candidate_steps"][0])


@pytest.mark.parametrize("batch", [1, 2, 4, 5, 16, 17, 64, 65, 500, 5000])
def test_each_engine_format_gives_the_canonical_k_at_every_batch(batch: int) -> None:
    expected = SCHEDULE.k_at(batch)
    assert _trtllm_engine_k(draft_len_schedule(SCHEDULE), batch) == expected
    assert _vllm_engine_k(per_batch_size(SCHEDULE), batch) == expected
    assert _sglang_engine_k(adaptive_config(SCHEDULE), batch) == expected


def test_trtllm_schedule_keeps_its_validator_rules() -> None:
    rendered = draft_len_schedule(SCHEDULE)
    assert rendered == {4: 4, 16: 2, 64: 1}  # the K = 0 tail is implied above the last key
    assert rendered[min(rendered)] == SCHEDULE.max_k
    unbounded = draft_len_schedule(Schedule.of([[8, 3], [None, 1]]))
    assert unbounded == {8: 3, 1024: 1}


def test_vllm_ranges_are_inclusive_from_one_and_write_the_zero_tail() -> None:
    assert per_batch_size(SCHEDULE) == [[1, 4, 4], [5, 16, 2], [17, 64, 1], [65, 1024, 0]]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", METHODS)
def test_rendering_matches_golden(backend: str, method: Method) -> None:
    engine = engine_for(backend, triton_model_source="# specops llmapi model\n")
    plans = {
        "spec": asdict(engine.container(spec(method), SERVING)),
        "plain": asdict(engine.container(PLAIN, SERVING)),
    }
    assert_golden(f"engines/{backend}-{method}", [plans])


def test_trtllm_serve_config_file_carries_the_speculative_config() -> None:
    plan = engine_for("trtllm-serve").container(spec("eagle3"), SERVING)
    config = yaml.safe_load(plan.files["config.yaml"])
    assert plan.args[plan.args.index("--config") + 1] == f"{plan.config_dir}/config.yaml"
    assert config["return_perf_metrics"] is True  # else /prometheus/metrics is not mounted
    assert config["speculative_config"] == {
        "decoding_type": "Eagle3",
        "max_draft_len": 4,
        "speculative_model": "/models/draft",
        "draft_len_schedule": {4: 4, 16: 2, 64: 1},
    }
    plain = yaml.safe_load(engine_for("trtllm-serve").container(PLAIN, SERVING).files["config.yaml"])
    assert "speculative_config" not in plain


def test_vllm_takes_one_speculative_config_json() -> None:
    plan = engine_for("vllm").container(spec("draftModel"), SERVING)
    config = json.loads(plan.args[plan.args.index("--speculative-config") + 1])
    assert config["method"] == "draft_model" and config["model"] == "/models/draft"
    assert config["num_speculative_tokens"] == 4
    mtp = json.loads(engine_for("vllm").container(spec("mtp"), SERVING).args[-1])
    assert "model" not in mtp
    assert "--speculative-config" not in engine_for("vllm").container(PLAIN, SERVING).args


def test_sglang_adapts_only_eagle_methods() -> None:
    eagle = engine_for("sglang").container(spec("eagle3"), SERVING)
    assert "--speculative-adaptive" in eagle.args and "adaptive.json" in eagle.files
    standalone = engine_for("sglang").container(spec("draftModel"), SERVING)
    assert "--speculative-adaptive" not in standalone.args and not standalone.files
    args = standalone.args
    assert args[args.index("--speculative-algorithm") + 1] == "STANDALONE"
    # steps, topk and draft tokens are set together (topk 1: draft tokens = steps + 1)
    assert args[args.index("--speculative-num-steps") + 1] == "4"
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "5"


def test_triton_repository_holds_model_yaml_with_the_llm_arguments() -> None:
    plan = engine_for("triton", triton_model_source="# model\n").container(spec("eagle3"), SERVING)
    model_yaml = yaml.safe_load(plan.files["tensorrt_llm/1/model.yaml"])
    assert model_yaml["tensor_parallel_size"] == 4
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": False}
    assert model_yaml["speculative_config"]["draft_len_schedule"] == {4: 4, 16: 2, 64: 1}
    assert plan.files["tensorrt_llm/1/model.py"] == "# model\n"
    assert f"--model-repository={plan.config_dir}" in plan.args
