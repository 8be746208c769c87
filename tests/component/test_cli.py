"""`specops` and `kubectl specops` through their entry points, against the emulated API server.

The click commands run in click's CliRunner (in a thread, since they run their own event loop
while the emulator serves from the test's); the installed console scripts run as subprocesses,
`kubectl-specops` through real kubectl's plugin lookup.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner, Result

from specops import kubectl_plugin
from specops.cli import main as specops
from specops_local.cluster import EmulatedCluster, emulated_cluster
from specops_local.stack import CRD_PATH

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NAMESPACE = "inference"
NAME = "llama-70b-chat"

SCHEDULE = "draftModel K=5 to batch 64, K=2 to batch 128, K=0 above 128"
STATUS: dict[str, Any] = {
    "phase": "Canary",
    "speculation": {
        "state": "on",
        "draftLength": 5,
        "schedule": SCHEDULE,
        "revision": {
            "digest": "bdaf1c784d",
            "mode": "spec",
            "method": "draftModel",
            "schedule": [{"maxBatch": 64, "k": 5}, {"maxBatch": 128, "k": 2}, {"k": 0}],
            "description": SCHEDULE,
        },
        "controlPhase": "Dynamic",
        "reason": "RevisionProposed",
        "message": "rolling out K=5 to batch 64, K=2 to batch 128, K=0 above 128: predicted +6.0%",
        "measuredSpeedup": 2.4,
    },
    "draft": {"version": "v3"},
    "observed": {"alpha": 0.83, "batch": 40.0, "perTokenLatencyP99": "31ms"},
    "canary": {
        "phase": "Progressing",
        "draft": {"version": "v4"},
        "step": 1,
        "weight": 50,
        "startedAt": "2026-12-01T00:00:00Z",
        "trafficRouting": "GatewayAPI",
        "lastAnalysis": {"verdict": "Pass"},
    },
    "retraining": {"rounds": 2, "lastResult": "Succeeded", "lastMessage": "round 2 trained v4-rt2"},
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Serving",
            "message": "",
            "lastTransitionTime": "2026-12-01T00:00:00Z",
        }
    ],
}


def resource() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load((ROOT / "docs" / "examples" / "dense-70b-7b.yaml").read_text())
    body["spec"]["canary"] = {
        "steps": [
            {"weight": 25, "pause": "1m"},
            {"weight": 50, "pause": "1m"},
            {"weight": 100, "pause": "1m"},
        ]
    }
    return body


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An emulated cluster whose kubeconfig context's namespace is `inference`, with one resource."""
    async with emulated_cluster([CRD_PATH], tmp_path, namespace=NAMESPACE) as emulated:
        monkeypatch.setenv("KUBECONFIG", str(emulated.kubeconfig_path))
        emulated.create("sdep", resource(), namespace=NAMESPACE)
        emulated.patch_status("sdep", NAME, STATUS, namespace=NAMESPACE)
        yield emulated


async def invoke(command: click.Command, *args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, command, list(args), catch_exceptions=False)


async def run(*argv: str, env: dict[str, str] | None = None, timeout_s: float = 30) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(env or {})},
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


# ---------------------------------------------------------------- specops


def every_command(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        found.append((*prefix, name))
        if isinstance(command, click.Group):
            found += every_command(command, (*prefix, name))
    return found


@pytest.mark.parametrize("group", [specops, kubectl_plugin.main], ids=["specops", "kubectl-specops"])
def test_every_subcommand_has_help(
    group: click.Group, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    commands = every_command(group)
    assert len(commands) >= 6
    for path in commands:
        result = CliRunner().invoke(group, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "usage:" in result.output.lower(), path
    assert list(tmp_path.iterdir()) == []  # no help writes a file (crd --help used to)


def test_version() -> None:
    result = CliRunner().invoke(specops, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("specops 0.")


def test_crd_prints_or_writes_the_generated_crd(tmp_path: Path) -> None:
    printed = CliRunner().invoke(specops, ["crd"])
    assert yaml.safe_load(printed.output)["kind"] == "CustomResourceDefinition"
    out = tmp_path / "crd.yaml"
    written = CliRunner().invoke(specops, ["crd", str(out)])
    assert written.exit_code == 0 and out.read_text() == CRD_PATH.read_text()


def test_bench_help_lists_the_real_benchmarks() -> None:
    from specops.bench import BENCHMARKS

    result = CliRunner().invoke(specops, ["bench", "--help"])
    assert result.exit_code == 0
    for name in BENCHMARKS:
        assert name in result.output
    assert "specops local reaction" in result.output
    local = CliRunner().invoke(specops, ["local", "--help"])
    assert {"up", "demo", "reaction", "soak"} <= set(local.output.split())


def test_bench_passes_its_arguments_through(tmp_path: Path) -> None:
    out = tmp_path / "policy.json"
    trace = ROOT / "operator" / "specops" / "bench" / "traces" / "steady_low.csv"
    command = ["bench", "policy", "--world", "roofline", "--trace", str(trace), "--limit-seconds", "120"]
    result = CliRunner().invoke(specops, [*command, "--json", str(out)])
    assert result.exit_code == 0, result.output
    measured = json.loads(out.read_text())
    assert measured["policy_speedup"] > 0 and measured["oracle_speedup"] > 0


async def test_canary_gates_default_to_the_kubeconfig_namespace(cluster: EmulatedCluster) -> None:
    paused = await invoke(specops, "canary", "pause", NAME)
    assert paused.exit_code == 0, paused.output
    assert f"{NAMESPACE}/{NAME}: canary pause requested" in paused.output
    annotations = cluster.get("sdep", NAME, namespace=NAMESPACE)["metadata"]["annotations"]  # type: ignore[index]
    assert annotations["specops.dev/canary-paused"] == "true"

    elsewhere = await invoke(specops, "canary", "promote", NAME, "-n", "default")
    assert elsewhere.exit_code == 1
    assert "not found in default" in elsewhere.output


async def test_the_installed_console_script_runs() -> None:
    assert shutil.which("specops", path=str(BIN)) is not None
    code, out, _ = await run("specops", "--version")
    assert code == 0 and out.startswith("specops ")
    code, out, _ = await run(
        "specops", "plan", "--gpu", "H100", "--target-params", "70B", "--draft-params", "7B", "--json", "-"
    )
    assert code == 0 and json.loads(out)["break_even_batch"] == 251


# ---------------------------------------------------------------- kubectl specops


async def test_plugin_get_shows_what_a_rollout_watcher_asks(cluster: EmulatedCluster) -> None:
    cluster.create(
        "events",
        {
            "metadata": {"name": "e1"},
            "involvedObject": {"kind": "SpeculativeDeployment", "name": NAME, "namespace": NAMESPACE},
            "type": "Normal",
            "reason": "CanaryStepAdvanced",
            "message": "canary v4 at 50% after a passing analysis",
        },
        namespace=NAMESPACE,
    )
    code, out, err = await run("kubectl", "specops", "get", NAME)
    assert code == 0, err
    for shown in (
        f"{NAMESPACE}/{NAME}",
        "phase Canary",
        "speculation on",
        f"schedule {SCHEDULE}",
        "alpha 0.83",
        "batch 40 vs break-even 256 (roofline)",  # 70B/7B on 4x H100 at alpha 0.83 (251 at 0.8)
        "p99 31ms vs SLO 45ms",
        "canary v4 Progressing",
        "weight 50%",
        "25% -> [50%] -> 100%",
        "stable 50%  canary 50%",
        "retraining round 2",
        "RevisionProposed: rolling out K=5 to batch 64, K=2 to batch 128, K=0 above 128: predicted +6.0%",
        "CanaryStepAdvanced",
    ):
        assert shown in out, shown


def table(out: str) -> list[dict[str, str]]:
    """A printed table as rows of {column: cell}, cut where each header starts (cells hold spaces)."""
    header, *lines = out.rstrip("\n").splitlines()
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    names = header.split()
    return [
        {
            name: line[start:end].strip()
            for name, start, end in zip(names, starts, [*starts[1:], None], strict=True)
        }
        for line in lines
    ]


async def test_plugin_json_list_and_namespace(cluster: EmulatedCluster) -> None:
    got = await invoke(kubectl_plugin.main, "get", NAME, "--json", "-")
    assert got.exit_code == 0
    summary = json.loads(got.stdout)
    assert (summary["namespace"], summary["breakEvenBatch"], summary["withinSlo"]) == (NAMESPACE, 256, True)
    assert summary["canary"]["steps"] == [25, 50, 100]

    listed = await invoke(kubectl_plugin.main, "list")
    [row] = table(listed.stdout)
    assert list(row)[:3] == ["NAME", "PHASE", "READY"] and "WEIGHT" in row
    assert list(row.values())[:3] == [NAME, "Canary", "True"] and row["WEIGHT"] == "50"
    assert row["SCHEDULE"] == SCHEDULE
    as_json = await invoke(kubectl_plugin.main, "list", "--json", "-")
    assert [s["name"] for s in json.loads(as_json.stdout)] == [NAME]
    empty = await invoke(kubectl_plugin.main, "list", "-n", "default")
    assert "No resources found." in empty.output
    missing = await invoke(kubectl_plugin.main, "get", "nope")
    assert missing.exit_code == 1 and 'speculativedeployments.specops.dev "nope" not found' in missing.output


async def test_plugin_shows_the_learned_break_even_once_calibrated(cluster: EmulatedCluster) -> None:
    # Given a deployment that learned its speculation stops paying at batch 24 (the roofline says 256)
    learned = {
        "speculation": {
            **STATUS["speculation"],
            "calibration": {"modelSource": "calibrated", "breakEvenKnown": True, "breakEvenBatch": 24},
        }
    }
    cluster.patch_status("sdep", NAME, learned, namespace=NAMESPACE)
    # Then the view shows what the control loop acts on, and says so
    got = await invoke(kubectl_plugin.main, "get", NAME, "--json", "-")
    summary = json.loads(got.stdout)
    assert (summary["breakEvenBatch"], summary["breakEvenSource"]) == (24, "calibrated")
    code, out, err = await run("kubectl", "specops", "get", NAME)
    assert code == 0, err
    assert "batch 40 vs break-even 24 (calibrated)" in out


async def test_plugin_gates_and_plan(cluster: EmulatedCluster) -> None:
    code, out, err = await run("kubectl", "specops", "abort", NAME)
    assert code == 0, err
    annotations = cluster.get("sdep", NAME, namespace=NAMESPACE)["metadata"]["annotations"]  # type: ignore[index]
    assert annotations["specops.dev/canary-action"] == "abort"
    code, out, err = await run(
        "kubectl", "specops", "plan", "--gpu", "H100", "--target-params", "70B", "--draft-params", "7B"
    )
    assert code == 0 and "break-even batch: 251" in out


async def test_plugin_watch_prints_the_view_again_when_it_changes(cluster: EmulatedCluster) -> None:
    process = await asyncio.create_subprocess_exec(
        "kubectl",
        "specops",
        "get",
        NAME,
        "--watch",
        "--interval",
        "0.3",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
    )
    assert process.stdout is not None
    seen = ""
    try:

        async def until(text: str) -> None:
            nonlocal seen
            while text not in seen:
                seen += (await asyncio.wait_for(process.stdout.readline(), 15)).decode()  # type: ignore[union-attr]

        await until("weight 50%")
        cluster.patch_status(
            "sdep", NAME, {"canary": {**STATUS["canary"], "step": 2, "weight": 100}}, namespace=NAMESPACE
        )
        await until("weight 100%")
        assert "25% -> 50% -> [100%]" in seen
    finally:
        process.terminate()
        await process.wait()


def test_a_local_stack_that_does_not_load_is_one_line_naming_its_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (without the local stack installed at all: tests/unit/test_packaging.py, on the operator's wheel)
    monkeypatch.setitem(sys.modules, "specops_local.cli", None)  # as if its files were gone
    result = CliRunner().invoke(specops, ["local", "up"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot load `specops local` from specops-local 0.1.0: ")
    assert len(result.output.strip().splitlines()) == 1
    monkeypatch.setitem(sys.modules, "specops_local.scale", None)
    scale = CliRunner().invoke(specops, ["bench", "scale"])
    assert scale.exit_code == 2
    assert scale.output.startswith("specops bench: cannot load benchmark 'scale' from specops-local 0.1.0: ")


# ---------------------------------------------------------------- errors: one line, no traceback


def one_line_error(result: Result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.fixture
def no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
    return tmp_path


@pytest.mark.parametrize(
    ("group", "args"),
    [
        (kubectl_plugin.main, ["get", NAME]),
        (kubectl_plugin.main, ["list"]),
        (kubectl_plugin.main, ["promote", NAME]),
        (specops, ["canary", "promote", NAME]),
    ],
    ids=["plugin get", "plugin list", "plugin promote", "canary promote"],
)
def test_without_a_kubeconfig_the_commands_say_so_in_one_line(
    no_kubeconfig: Path, group: click.Group, args: list[str]
) -> None:
    result = CliRunner().invoke(group, args, catch_exceptions=False)
    assert one_line_error(result) == "error: no kubeconfig: set KUBECONFIG or --kubeconfig"


def write_kubeconfig(path: Path, server: str = "http://127.0.0.1:1") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "lab", "context": {"cluster": "c", "user": "u", "namespace": "ns1"}}],
                "current-context": "lab",
            }
        )
    )
    return path


def test_kubeconfig_problems_are_named(no_kubeconfig: Path) -> None:
    missing = no_kubeconfig / "nope.yaml"
    result = CliRunner().invoke(specops, ["canary", "pause", NAME, "--kubeconfig", str(missing)])
    assert one_line_error(result) == f"error: kubeconfig {missing}: no such file"

    garbled = no_kubeconfig / "garbled.yaml"
    garbled.write_text("clusters: [1\n")
    result = CliRunner().invoke(kubectl_plugin.main, ["get", NAME, "--kubeconfig", str(garbled)])
    assert one_line_error(result).startswith(f"error: kubeconfig {garbled}: not YAML (line 2)")

    config = write_kubeconfig(no_kubeconfig / "config")
    result = CliRunner().invoke(
        kubectl_plugin.main, ["get", NAME, "--kubeconfig", str(config), "--context", "prod"]
    )
    assert one_line_error(result) == f"error: context 'prod' not found in kubeconfig {config}"


def test_an_unreachable_api_server_is_one_line(no_kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(no_kubeconfig / "config")))
    for group, args in ((kubectl_plugin.main, ["get", NAME]), (specops, ["canary", "abort", NAME])):
        result = CliRunner().invoke(group, args, catch_exceptions=False)
        assert one_line_error(result).startswith("error: cannot reach the API server at http://127.0.0.1:1")


def test_files_that_cannot_be_written_are_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    crd = CliRunner().invoke(specops, ["crd", str(blocked / "crd.yaml")], catch_exceptions=False)
    assert one_line_error(crd).startswith(f"Error: cannot write {blocked / 'crd.yaml'}")
    args = ["plan", "--gpu", "H100", "--target-params", "70B", "--json", str(blocked / "plan.json")]
    plan = CliRunner().invoke(specops, args, catch_exceptions=False)
    assert plan.exit_code == 1 and f"Error: cannot write {blocked / 'plan.json'}" in plan.output


# ---------------------------------------------------------------- the live view tells the truth


def condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-12-01T00:00:00Z",
    }


HEALTHY = [
    condition("Ready", "True", "Serving", "2/2 pods ready"),
    condition("Progressing", "False", "RolloutComplete"),
    condition("Degraded", "False", "AsExpected"),
    condition("DraftMismatch", "False", "DraftMatchesTarget"),
    condition("Retraining", "False", "RetrainingIdle"),
    condition("MetricsUnavailable", "False", "MetricsOK"),
]


def coloured(body: dict[str, Any], **options: Any) -> str:
    from rich.console import Console

    from specops.views import resource_view

    console = Console(force_terminal=True, color_system="standard", width=200)
    with console.capture() as captured:
        console.print(resource_view(body, **options))
    return captured.get()


RED, GREEN = "\x1b[31m", "\x1b[32m"


def test_condition_colours_follow_each_conditions_polarity() -> None:
    body = {**resource(), "status": {**STATUS, "canary": None, "conditions": HEALTHY}}
    body["metadata"]["namespace"] = NAMESPACE
    default = coloured(body)
    assert "Healthy" in default and RED not in default
    assert "Progressing=" not in default and "(6 more; --all shows them)" in default  # only the abnormal ones
    every = coloured(body, all_conditions=True)
    for kind in ("Progressing", "DraftMismatch", "Retraining", "Degraded"):
        assert f"{kind}={GREEN}False" in every, kind
    assert RED not in every

    split_failed = condition("CanaryRollout", "True", "TrafficSplitFailed", "no HTTPRoute named chat")
    body["status"] = {**STATUS, "conditions": [*HEALTHY, split_failed]}
    failing = coloured(body)
    assert f"CanaryRollout={RED}True" in failing and f"CanaryRollout={GREEN}" not in failing
    assert "Degraded" in failing.splitlines()[0] and "TrafficSplitFailed" in failing.splitlines()[0]


async def test_get_and_list_speak_json_yaml_and_wide(cluster: EmulatedCluster) -> None:
    as_json = await invoke(kubectl_plugin.main, "get", NAME, "-o", "json")
    record = json.loads(as_json.stdout)
    assert (record["name"], record["health"]) == (NAME, "Progressing")
    as_yaml = await invoke(kubectl_plugin.main, "get", NAME, "-o", "yaml")
    assert yaml.safe_load(as_yaml.stdout)["canary"]["weight"] == 50
    wide = await invoke(kubectl_plugin.main, "get", NAME, "-o", "wide")
    assert wide.stdout.split()[:2] == ["NAME", "PHASE"] and "SPEEDUP" in wide.stdout

    other = resource()
    other["metadata"].update(name="small-chat", namespace="default")
    cluster.create("sdep", other, namespace="default")
    everywhere = await invoke(kubectl_plugin.main, "list", "-A")
    header, *rows = (line.split() for line in everywhere.stdout.strip().splitlines())
    assert header[:2] == ["NAMESPACE", "NAME"]
    assert [row[:2] for row in rows] == [["default", "small-chat"], [NAMESPACE, NAME]]
    listed = await invoke(kubectl_plugin.main, "list", "-A", "-o", "yaml")
    assert [r["namespace"] for r in yaml.safe_load(listed.stdout)] == ["default", NAMESPACE]
    here = await invoke(kubectl_plugin.main, "list")
    assert "NAMESPACE" not in here.stdout


async def test_status_waits_for_healthy_and_idle(cluster: EmulatedCluster) -> None:
    # Given a canary in progress: status waits, and gives up at the timeout
    waited = await invoke(kubectl_plugin.main, "status", NAME, "--timeout", "1s")
    assert waited.exit_code == 1 and "timed out after 1s" in waited.output

    async def finish_the_canary() -> None:
        await asyncio.sleep(1.0)
        cluster.patch_status("sdep", NAME, {"canary": None, "conditions": HEALTHY}, namespace=NAMESPACE)

    finishing = asyncio.ensure_future(finish_the_canary())
    done = await invoke(kubectl_plugin.main, "status", NAME, "--timeout", "20s")
    await finishing
    assert done.exit_code == 0, done.output
    assert "Progressing" in done.output and done.output.strip().splitlines()[-1].startswith("Healthy")


@pytest.mark.parametrize(
    ("conditions", "said"),
    [
        ([condition("CanaryRollout", "False", "CanaryRolledBack", "v4 worse than v3")], "RolledBack: "),
        (
            [condition("MetricsUnavailable", "True", "PrometheusUnreachable")],
            "Degraded: MetricsUnavailable=True",
        ),
    ],
    ids=["rolled back", "degraded"],
)
async def test_status_fails_at_once_on_a_rollback_or_a_degraded_state(
    cluster: EmulatedCluster, conditions: list[dict[str, Any]], said: str
) -> None:
    cluster.patch_status(
        "sdep", NAME, {"canary": None, "conditions": [*HEALTHY, *conditions]}, namespace=NAMESPACE
    )
    result = await invoke(kubectl_plugin.main, "status", NAME, "--timeout", "20s")
    assert result.exit_code == 1 and said in result.output


async def test_the_watch_follows_events_by_watching_not_listing(cluster: EmulatedCluster) -> None:
    process = await asyncio.create_subprocess_exec(
        "kubectl",
        "specops",
        "get",
        NAME,
        "--watch",
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"},
    )
    assert process.stdout is not None
    seen = ""
    try:

        async def until(text: str) -> None:
            nonlocal seen
            while text not in seen:
                seen += (await asyncio.wait_for(process.stdout.readline(), 15)).decode()  # type: ignore[union-attr]

        await until("weight 50%")
        await cluster.wait_for_watch("events")
        await cluster.wait_for_watch("speculativedeployments")
        for name, about in (("other", "someone-else"), ("mine", NAME)):
            cluster.create(
                "events",
                {
                    "metadata": {"name": name},
                    "involvedObject": {
                        "kind": "SpeculativeDeployment",
                        "name": about,
                        "namespace": NAMESPACE,
                    },
                    "type": "Warning",
                    "reason": f"Reason{name.capitalize()}",
                    "message": f"about {about}",
                },
                namespace=NAMESPACE,
            )
        await until("ReasonMine")
        assert "ReasonOther" not in seen  # the server filters by field selector
    finally:
        process.terminate()
        await process.wait()


async def test_resume_without_a_canary_fails_like_the_other_gates(cluster: EmulatedCluster) -> None:
    cluster.patch_status("sdep", NAME, {"canary": None}, namespace=NAMESPACE)
    for gate in ("resume", "pause", "promote"):
        result = await invoke(kubectl_plugin.main, gate, NAME)
        assert result.exit_code == 1 and f"{NAMESPACE}/{NAME} has no canary in progress" in result.output


# ---------------------------------------------------------------- retry and undo

V3 = {
    "model": "llama-3.1-8b-draft",
    "version": "v3",
    "method": "draftModel",
    "kind": "standalone",
    "parameters": "7B",
    "uri": "pvc://models/llama-70b-draft/v3",
}
V4 = {**V3, "version": "v4", "uri": "pvc://models/llama-70b-draft/v4"}


def set_spec_draft(cluster: EmulatedCluster, draft: dict[str, Any]) -> None:
    cluster.emulator.patch_object(cluster.resource("sdep"), NAMESPACE, NAME, {"spec": {"draft": draft}})


def spec_draft(cluster: EmulatedCluster) -> dict[str, Any]:
    stored = cluster.get("sdep", NAME, namespace=NAMESPACE)
    assert stored is not None
    return dict(stored["spec"]["draft"])


async def test_retry_and_undo_after_a_rollback(cluster: EmulatedCluster) -> None:
    # Given spec.draft names v4, whose canary rolled back, while v3 serves
    set_spec_draft(cluster, V4)
    rolled_back = {
        "canary": None,
        "draft": V3,
        "rejectedDraft": "v4@pvc://models/llama-70b-draft/v4",
        "lastCanary": {"draft": "v4", "result": "RolledBack", "reason": "CanaryFailureLimitExceeded"},
    }
    cluster.patch_status("sdep", NAME, rolled_back, namespace=NAMESPACE)
    # retry asks the operator to run v4's canary again
    retried = await invoke(kubectl_plugin.main, "retry", NAME)
    assert retried.exit_code == 0, retried.output
    assert retried.output.strip() == f"speculativedeployment {NAMESPACE}/{NAME}: canary retry requested"
    stored = cluster.get("sdep", NAME, namespace=NAMESPACE)
    assert stored is not None and stored["metadata"]["annotations"]["specops.dev/canary-action"] == "retry"
    # undo sets spec.draft back to the serving draft, every field of it
    undone = await invoke(specops, "canary", "undo", NAME)
    assert undone.exit_code == 0, undone.output
    assert "spec.draft set back to draft v3, the one serving" in undone.output
    assert spec_draft(cluster) == V3
    # now nothing is rejected: retry says so in one line; undo has no earlier draft to go to
    refused = await invoke(kubectl_plugin.main, "retry", NAME)
    assert refused.exit_code == 1
    assert one_line_error(refused) == (
        f"error: {NAMESPACE}/{NAME} has no rolled-back draft to retry: spec.draft names draft v3, "
        "which no canary rejected"
    )
    nothing = await invoke(kubectl_plugin.main, "undo", NAME)
    assert nothing.exit_code == 1 and "no previous draft recorded" in one_line_error(nothing)


async def test_undo_after_a_promotion_goes_back_to_the_draft_that_served_before(
    cluster: EmulatedCluster,
) -> None:
    # Given v4 promoted (spec and status name it), v3 served before; a canary still runs: refused
    set_spec_draft(cluster, V4)
    busy = await invoke(kubectl_plugin.main, "undo", NAME)
    assert busy.exit_code == 1 and "has a canary of draft v4 in progress: abort it first" in one_line_error(
        busy
    )
    cluster.patch_status(
        "sdep", NAME, {"canary": None, "draft": V4, "previousDraft": V3}, namespace=NAMESPACE
    )
    undone = await invoke(kubectl_plugin.main, "undo", NAME)
    assert undone.exit_code == 0, undone.output
    assert "draft v3, which served before v4 (its canary starts)" in undone.output
    assert spec_draft(cluster) == V3


# ---------------------------------------------------------------- a canary you can watch, and what serves


def child_labels(variant: str, revision: str) -> dict[str, str]:
    return {"specops.dev/deployment": NAME, "specops.dev/variant": variant, "specops.dev/revision": revision}


async def test_get_shows_the_step_under_way_and_the_serving_objects(cluster: EmulatedCluster) -> None:
    # Given a canary step at 33 % (50 % asked), both variants measured, judged in about two minutes
    judge_at = (datetime.now(UTC) + timedelta(seconds=125)).strftime("%Y-%m-%dT%H:%M:%SZ")
    window = {
        "stable": {
            "samples": 14,
            "alpha": 0.82,
            "p99": "30.8ms",
            "alphaBins": "0.82*14",
            "p99Bins": "0.0308*14",
        },
        "canary": {"samples": 15, "failed": 1, "alpha": 0.812, "p99": "31.2ms", "alphaBins": "0.812*14"},
    }
    canary = {**STATUS["canary"], "weight": 33, "requestedWeight": 50, "window": window, "judgeAt": judge_at}
    canary["nextWeight"] = 100
    cluster.patch_status("sdep", NAME, {"canary": canary}, namespace=NAMESPACE)
    # and its serving objects: a stable Deployment with a pod crash-looping, a canary Deployment ready
    for variant, revision, ready in (("stable", "bdaf1c784d", 1), ("canary", "9e21c0aa7f", 1)):
        name = f"{NAME}-{variant}"
        cluster.create(
            "deployments",
            {
                "metadata": {"name": name, "labels": child_labels(variant, revision)},
                "spec": {"replicas": 2 if variant == "stable" else 1},
            },
            namespace=NAMESPACE,
        )
        cluster.patch_status(
            "deployments", name, {"readyReplicas": ready, "updatedReplicas": ready}, namespace=NAMESPACE
        )
    pods = (
        ("stable", "bdaf1c784d", "a", {"ready": True, "restartCount": 0, "state": {"running": {}}}),
        (
            "stable",
            "bdaf1c784d",
            "b",
            {"ready": False, "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
        ),
        ("canary", "9e21c0aa7f", "c", {"ready": True, "restartCount": 0, "state": {"running": {}}}),
    )
    for variant, revision, suffix, container in pods:
        name = f"{NAME}-{variant}-{suffix}"
        cluster.create(
            "pods",
            {
                "metadata": {"name": name, "labels": child_labels(variant, revision)},
                "spec": {"containers": [{"name": "engine"}]},
            },
            namespace=NAMESPACE,
        )
        cluster.patch_status(
            "pods",
            name,
            {"phase": "Running", "containerStatuses": [{"name": "engine", **container}]},
            namespace=NAMESPACE,
        )

    got = await invoke(kubectl_plugin.main, "get", NAME)
    assert got.exit_code == 0, got.output
    for shown in (
        "stable 67%  canary 33% (50% requested)",
        "acceptance canary 0.812 (n=14, 1 failed reads) vs stable 0.820 (n=14)",
        "p99 canary 31.2ms vs stable 30.8ms",
        "step 2/3 judged in 2m",
        "on a pass: promotion",
        f"Deployment {NAME}-stable (stable)  ready 1/2",
        f"pod {NAME}-stable-b  CrashLoopBackOff  ready no  restarts 4  revision bdaf1c784d",
        f"Deployment {NAME}-canary (canary)  ready 1/1",
        f"pod {NAME}-canary-c  Running  ready yes  restarts 0  revision 9e21c0aa7f",
    ):
        assert shown in got.output, shown
    record = json.loads((await invoke(kubectl_plugin.main, "get", NAME, "-o", "json")).stdout)["canary"]
    assert (record["canary"]["samples"], record["stable"]["alpha"], record["nextWeight"]) == (14, 0.82, 100)
    assert 100 <= record["judgedInSeconds"] <= 125


async def test_after_a_rollback_the_view_and_the_columns_say_the_spec_draft_does_not_serve(
    cluster: EmulatedCluster,
) -> None:
    set_spec_draft(cluster, V4)
    rejected = condition(
        "DraftRejected",
        "True",
        "SpecDraftRejected",
        "spec.draft names draft v4, which a canary rolled back; draft v3 serves",
    )
    cluster.patch_status(
        "sdep",
        NAME,
        {"canary": None, "draft": V3, "specDraft": "v4 rejected", "conditions": [*HEALTHY, rejected]},
        namespace=NAMESPACE,
    )
    got = await invoke(kubectl_plugin.main, "get", NAME)
    assert got.output.splitlines()[0].startswith("RolledBack")
    assert "spec.draft names v4; draft v3 serves" in got.output
    listed = await invoke(kubectl_plugin.main, "list")
    [row] = table(listed.stdout)
    assert (row["DRAFT"], row["SPECDRAFT"]) == ("v3", "v4 rejected")
