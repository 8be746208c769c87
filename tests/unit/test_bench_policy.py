"""`specops bench policy`: the contract's timeline, configs and JSON, with production's revision step."""

from __future__ import annotations

import csv
import itertools
import json
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from specops import bench, profiles
from specops.bench import policy
from specops.bench.policy import (
    RESULT_KEYS,
    TracePoint,
    World,
    hindsight_bound,
    load_trace,
    parse_trace,
    replay,
    result,
    setup_of,
    shipped_traces,
    world_from,
)
from specops.domain import control_step
from specops.domain.engines.schedule import PLAIN, Schedule
from specops.domain.perf import GPUS, ModelSetup
from specops.domain.records import replace

SETUP = ModelSetup(GPUS["H100"], 70e9, 7e9)
CONTRACT_WORLD = "llama70b-small-draft-4xh100"
CONTRACT_RESTART_S = 20
FAST = {"rollout": {"baseline": "60s", "soak": "60s"}, "reconfigure": {"minInterval": "2m"}}
"""Short phases so that a few minutes of trace see several revisions."""


def swinging_trace(seconds: int = 1500) -> list[TracePoint]:
    """Low load, then a long stretch far past every break-even, then low again."""
    points = []
    for s in range(seconds):
        batch = 6.0 if s < seconds // 3 or s >= 2 * seconds // 3 else 300.0
        points.append(TracePoint(float(s), batch + (s % 7) * 0.5, 0.8))
    return points


def write_trace(path: Path, points: list[TracePoint]) -> Path:
    with path.open("w") as handle:
        handle.write("t_seconds,batch,alpha\n")
        for p in points:
            handle.write(f"{p.t_seconds:g},{p.batch:.2f},{p.alpha:.4f}\n")
    return path


def read_timeline(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def read_configs(path: Path) -> dict[str, dict[str, Any]]:
    return {line["config"]: line for line in map(json.loads, path.read_text().splitlines())}


def schedule_of(config: dict[str, Any]) -> Schedule | None:
    return None if config["mode"] == "plain" else Schedule.of(config["draft_len_schedule"])


@pytest.fixture(scope="module")
def contract_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[list[dict[str, str]], dict[str, Any], Path]:
    folder = tmp_path_factory.mktemp("policy")
    trace = write_trace(folder / "trace.csv", swinging_trace())
    world = folder / "world.json"  # restarts quick enough for a few minutes of trace to pay several back
    body = json.loads(resources.files("specops.profiles").joinpath(f"{CONTRACT_WORLD}.json").read_text())
    world.write_text(json.dumps({**body, "restart_s": CONTRACT_RESTART_S}))
    out = {name: folder / name for name in ("timeline.csv", "configs.jsonl", "result.json")}
    code = bench.main(
        [
            "policy",
            "--world",
            str(world),
            "--trace",
            str(trace),
            "--backend",
            "trtllm-serve",
            "--replicas",
            "3",
            "--interval",
            "15s",
            "--speculation",
            json.dumps(FAST),
            "--timeline-out",
            str(out["timeline.csv"]),
            "--configs-out",
            str(out["configs.jsonl"]),
            "--json",
            str(out["result.json"]),
        ]
    )
    assert code == 0
    rows = read_timeline(out["timeline.csv"])
    configs = read_configs(out["configs.jsonl"])
    return rows, configs, trace


def test_timeline_columns_are_the_contracts(
    contract_run: tuple[list[dict[str, str]], dict[str, Any], Path],
) -> None:
    rows, _, _ = contract_run
    expected = ["t_seconds"] + [f"{c}{i}" for i in range(3) for c in ("mode", "k", "batch", "config")]
    assert list(rows[0]) == expected
    assert [float(r["t_seconds"]) for r in rows] == [float(s) for s in range(len(rows))]


def test_batches_add_up_to_the_fleets_load(
    contract_run: tuple[list[dict[str, str]], dict[str, Any], Path],
) -> None:
    rows, _, trace = contract_run
    points = load_trace(trace)
    for row, point in zip(rows, points, strict=True):
        total = sum(float(row[f"batch{i}"]) for i in range(3))
        assert total == pytest.approx(3 * point.batch, rel=0.01)
        for i in range(3):
            if row[f"mode{i}"] == "down":
                assert float(row[f"batch{i}"]) == 0.0


def test_k_is_the_revisions_schedule_at_the_pods_batch(
    contract_run: tuple[list[dict[str, str]], dict[str, Any], Path],
) -> None:
    rows, configs, _ = contract_run
    speculating = 0
    for row in rows:
        for i in range(3):
            config = configs[row[f"config{i}"]]
            mode = row[f"mode{i}"]
            if mode == "down":
                assert row[f"k{i}"] == ""
                continue
            assert mode == config["mode"]
            schedule = schedule_of(config)
            if schedule is None:
                assert row[f"k{i}"] == ""
            else:
                speculating += 1
                assert int(row[f"k{i}"]) == schedule.k_at(float(row[f"batch{i}"]))
    assert speculating > 0


def test_a_revision_change_is_down_for_restart_s_one_pod_at_a_time(
    contract_run: tuple[list[dict[str, str]], dict[str, Any], Path],
) -> None:
    rows, configs, _ = contract_run
    restart = CONTRACT_RESTART_S
    changes = 0
    for i in range(3):
        for t in range(1, len(rows)):
            if rows[t][f"config{i}"] != rows[t - 1][f"config{i}"]:
                changes += 1
                window = rows[t : t + restart]
                assert all(r[f"mode{i}"] == "down" for r in window)
                assert all(r[f"config{i}"] == rows[t][f"config{i}"] for r in window)
                if t + restart < len(rows) and rows[t + restart][f"config{i}"] == rows[t][f"config{i}"]:
                    assert rows[t + restart][f"mode{i}"] != "down"  # (or it restarts again at once)
    assert changes >= 3  # at least one revision rolled over the three pods
    for row in rows:
        assert sum(row[f"mode{i}"] == "down" for i in range(3)) <= 1
    for config in configs.values():
        assert set(config) == {"config", "mode", "draft_len_schedule"}
        edges = [edge for edge, _ in config["draft_len_schedule"]]
        assert edges[-1] is None and all(a < b for a, b in itertools.pairwise(edges[:-1]))


def test_result_json_has_exactly_the_contracts_keys(
    contract_run: tuple[list[dict[str, str]], dict[str, Any], Path], tmp_path: Path
) -> None:
    _, _, trace = contract_run
    out = json.loads((trace.parent / "result.json").read_text())
    assert list(out) == list(RESULT_KEYS)
    assert 0 < out["ratio_to_oracle"] <= 1.0
    assert out["plain_speedup"] == 1.0
    # one pod of two held back plain through the baselines only, never for good
    assert 0.0 < out["holdback_cost_fraction"] < 0.25
    assert out["restarts_per_pod_hour"] > 0


def test_a_world_where_speculation_never_pays_ends_plain() -> None:
    world = world_from("qwen3-30b-a3b-moe-eagle3-h100", SETUP)
    setup, gpu = setup_of(world, SETUP, "H100")  # the flags a spec of this deployment gives
    phases = {"rollout": {"baseline": "5m", "soak": "5m"}, "reconfigure": {"minInterval": "5m"}}
    trace = [TracePoint(float(s), 20.0 + (s % 11), 0.8) for s in range(1800)]
    run = replay(world, trace, setup=setup, gpu=gpu, replicas=2, speculation=phases)
    assert any(r.mode == "spec" for r in run.revisions.values())  # it did try
    last = run.seconds[-1]
    assert [s.mode for s in last] == ["plain", "plain"]
    assert result(run)["world_break_even_batch"] == 1


def test_a_measured_slowdown_moves_traffic_to_the_holdback_before_any_restart() -> None:
    """4 pods, one held back plain, in a world where speculating is slower than plain: within two
    intervals of the speculating pods serving, the holdback pod carries more than its even share,
    while every pod still runs the revision it started the baseline on."""
    world = world_from("qwen3-30b-a3b-moe-eagle3-h100", SETUP)
    setup, gpu = setup_of(world, SETUP, "H100")
    trace = [TracePoint(float(s), 24.0, 0.8) for s in range(900)]
    run = replay(world, trace, setup=setup, gpu=gpu, replicas=4)
    served = next(s for s, row in enumerate(run.seconds) if all(x.mode == "spec" for x in row[:3]))
    moved = next(
        s for s, row in enumerate(run.seconds) if row[3].mode == "plain" and row[3].batch > 4 * 24.0 / 4 * 1.1
    )
    # the operator reads a window one interval late: two intervals after that window fills
    assert moved - served <= 4 * 15
    assert all(run.configs[s] == run.configs[served] for s in range(served, moved + 1))  # no restart yet
    row = run.seconds[moved]
    assert sum(x.batch for x in row) == pytest.approx(4 * 24.0, rel=0.01)
    assert result(run)["weight_changes_per_hour"] > 0


def test_a_holdback_where_speculation_pays_keeps_its_even_share() -> None:
    world = world_from("roofline", SETUP)
    trace = [TracePoint(float(s), 8.0, 0.8) for s in range(600)]
    run = replay(world, trace, setup=SETUP, replicas=4)
    held = [row[3].batch for row in run.seconds if row[3].mode == "plain" and row[0].mode == "spec"]
    assert held and all(b == pytest.approx(8.0, rel=0.01) for b in held)


def test_the_decision_is_productions_control_step(monkeypatch: pytest.MonkeyPatch) -> None:
    world = world_from("roofline", SETUP)
    trace = [TracePoint(float(s), 16.0, 0.8) for s in range(600)]
    before = result(replay(world, trace, setup=SETUP, replicas=2, speculation=FAST))
    assert before["policy_speedup"] > 1.2

    def hold(
        state: control_step.ControlState | None, snapshot: control_step.Snapshot, now: datetime
    ) -> tuple[control_step.ControlState, control_step.Actions]:
        record = state or control_step.restore(snapshot, now)
        plain = replace(record, decision=replace(record.decision, revision=PLAIN, holdback=False))
        return plain, control_step.NOTHING

    monkeypatch.setattr(control_step, "step", hold)
    after = result(replay(world, trace, setup=SETUP, replicas=2, speculation=FAST))
    assert after["policy_speedup"] == pytest.approx(1.0, abs=0.02)
    assert after["restarts_per_pod_hour"] == 0.0


def test_no_pod_serving_counts_zero_and_references_never_restart() -> None:
    world = World(profiles.load_builtin("llama70b-small-draft-4xh100"))
    trace = [TracePoint(float(s), 8.0, 0.8) for s in range(400)]
    run = replay(world, trace, setup=SETUP, replicas=1, speculation=FAST)
    downs = [s for s, row in enumerate(run.seconds) if row[0].mode == "down"]
    assert downs and all(run.speedups[s] == 0.0 for s in downs)
    out = result(run)
    assert out["static_k3_speedup"] > 1.0 and out["doc_schedule_speedup"] > 1.0


def test_a_coarse_trace_is_held_per_second() -> None:
    points = parse_trace(["t_seconds,batch,alpha", "0,10,0.8", "5,20,0.7", "10,30,0.75"])
    assert [p.batch for p in points] == [10.0] * 5 + [20.0] * 5 + [30.0]
    assert [p.t_seconds for p in points] == [float(s) for s in range(11)]


def test_the_shipped_traces_include_both_azure_ones_per_second() -> None:
    traces = shipped_traces()
    assert {"azure_conv", "azure_code"} <= set(traces)
    for name in ("azure_conv", "azure_code"):
        lines = traces[name].read_text().splitlines()[:3]
        assert lines[0] == "t_seconds,batch,alpha" and lines[1].startswith("0,") and lines[2].startswith("1,")


def test_the_table_runs_every_world_on_every_trace(tmp_path: Path) -> None:
    out = tmp_path / "table.json"
    assert policy.main(["--all", "--limit-seconds", "120", "--json", str(out)]) == 0
    table = json.loads(out.read_text())
    worlds = {row["world"] for row in table["rows"]}
    assert len(worlds) >= 6 and "roofline" in worlds
    assert {row["trace"] for row in table["rows"]} == set(shipped_traces())
    assert table["summary"]["mean_plain_speedup"] == 1.0


def test_worlds_cover_the_issues_cases() -> None:
    k0 = profiles.load_builtin("llama70b-small-draft-4xh100")
    assert k0.k0_ms_at(256) / k0.plain_ms_at(256) >= 1.15
    assert profiles.load_builtin("qwen3-30b-a3b-moe-eagle3-h100").break_even_batch(0.85) == 1
    assert profiles.load_builtin("llama3.1-8b-longctx-magicdec").break_even_batch(0.75) is None


def test_the_hindsight_bound_charges_the_restarts_out_of_the_first_fleet() -> None:
    # Given a world where speculation never pays, and the fleet the operator starts with
    world = world_from("qwen3-30b-a3b-moe-eagle3-h100", SETUP)
    setup, gpu = setup_of(world, SETUP, "H100")
    trace = [TracePoint(float(s), 24.0, 0.8) for s in range(1800)]
    run = replay(world, trace, setup=setup, gpu=gpu, replicas=4)
    first = [run.revisions[d].mode for d in run.configs[0]]
    assert first == ["spec", "spec", "spec", "plain"]
    bound = hindsight_bound(run)
    # Then the best fixed fleet is plain, reached by restarting the three speculating pods one at a
    # time: every second one is down is slower than the all-plain fleet
    hours = len(trace) / 3600.0
    assert bound["restarts_per_pod_hour"] == pytest.approx(3 / (4 * hours), abs=1e-3)
    assert bound["slowdown_time_fraction"] >= 3 * world.restart_s / len(trace)
    assert bound["ratio_to_oracle"] < 1.0
    # And a fleet already on the best revision pays nothing
    plain_first = replace(run, configs=[[PLAIN.digest] * 4, *run.configs[1:]])
    plain_first.revisions[PLAIN.digest] = PLAIN
    assert hindsight_bound(plain_first) == {
        "ratio_to_oracle": 1.0,
        "slowdown_time_fraction": 0.0,
        "restarts_per_pod_hour": 0.0,
    }


def test_the_hindsight_bound_of_one_pod_starting_plain_weighs_speculating() -> None:
    # Given one pod, which runs plain through its baseline, in a world where speculation pays
    world = world_from("roofline", SETUP)
    trace = [TracePoint(float(s), 8.0, 0.8) for s in range(1200)]
    run = replay(world, trace, setup=SETUP, replicas=1)
    assert run.revisions[run.configs[0][0]].mode == "plain"
    bound = hindsight_bound(run)
    # Then the bound restarts it into speculation once (an outage of restart_s) and gains from it
    assert bound["restarts_per_pod_hour"] == pytest.approx(1 / (len(trace) / 3600.0), abs=1e-3)
    assert bound["ratio_to_oracle"] > result(run)["plain_speedup"] / result(run)["oracle_speedup"]
