"""Debian's real kubectl against the emulated API server: apply, get, explain, dry runs, field validation.

Each test drives /usr/bin/kubectl as a subprocess with the kubeconfig the harness writes, the way a
person uses the local stack, and checks what kubectl prints and what the server stored.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from specops_local.cluster import EmulatedCluster, emulated_cluster
from specops_local.stack import CRD_PATH

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "dense-70b-7b.yaml"
KUBECTL = shutil.which("kubectl")

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (make kubectl)")


@dataclass
class Ran:
    code: int
    out: str
    err: str


class Kubectl:
    def __init__(self, cluster: EmulatedCluster, tmp_path: Path) -> None:
        self.cluster = cluster
        self.env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig_path),
            "HOME": str(tmp_path),
            "KUBECACHEDIR": str(tmp_path / "cache"),
        }

    async def __call__(self, *args: str, stdin: str | None = None) -> Ran:
        assert KUBECTL is not None
        process = await asyncio.create_subprocess_exec(
            KUBECTL,
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        out, err = await asyncio.wait_for(process.communicate(stdin.encode() if stdin else None), 30)
        assert process.returncode is not None
        return Ran(process.returncode, out.decode(), err.decode())


def example(**serving: Any) -> str:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["namespace"] = "default"
    body["spec"]["serving"].update(serving)
    return yaml.safe_dump(body)


@pytest.fixture
async def kubectl(tmp_path: Path) -> Any:
    async with emulated_cluster([CRD_PATH], tmp_path) as cluster:
        yield Kubectl(cluster, tmp_path)


async def test_apply_validates_on_the_server_and_refuses_unknown_fields(kubectl: Kubectl) -> None:
    refused = await kubectl("apply", "-f", "-", stdin=example(replica=3))
    assert refused.code == 1
    assert "Error from server (BadRequest)" in refused.err
    assert 'strict decoding error: unknown field "spec.serving.replica"' in refused.err
    assert kubectl.cluster.get("sdep", "llama-70b-chat") is None

    created = await kubectl("apply", "-f", "-", stdin=example())
    assert created.code == 0, created.err
    assert created.out.strip() == "speculativedeployment.specops.dev/llama-70b-chat created"
    stored = kubectl.cluster.get("sdep", "llama-70b-chat")
    assert stored is not None and stored["spec"]["speculation"]["reconfigure"]["minGain"] > 0  # defaulted

    reapplied = await kubectl("apply", "-f", "-", stdin=example(replicas=3))
    assert reapplied.code == 0, reapplied.err
    assert reapplied.out.strip() == "speculativedeployment.specops.dev/llama-70b-chat configured"
    stored = kubectl.cluster.get("sdep", "llama-70b-chat")
    assert stored is not None and stored["spec"]["serving"]["replicas"] == 3


async def test_with_warn_validation_the_unknown_field_is_pruned_with_the_servers_warning(
    kubectl: Kubectl,
) -> None:
    applied = await kubectl("apply", "--validate=warn", "-f", "-", stdin=example(replica=3))
    assert applied.code == 0, applied.err
    assert 'Warning: unknown field "spec.serving.replica"' in applied.err
    stored = kubectl.cluster.get("sdep", "llama-70b-chat")
    assert stored is not None
    assert "replica" not in stored["spec"]["serving"] and stored["spec"]["serving"]["replicas"] == 2


async def test_schema_violations_are_422_naming_the_field(kubectl: Kubectl) -> None:
    refused = await kubectl("apply", "-f", "-", stdin=example(replicas=-1))
    assert refused.code == 1
    assert "is invalid" in refused.err and "spec.serving.replicas" in refused.err


async def test_server_dry_runs_are_not_persisted(kubectl: Kubectl) -> None:
    dry = await kubectl("apply", "--dry-run=server", "-f", "-", stdin=example())
    assert dry.code == 0, dry.err
    assert "created (server dry run)" in dry.out
    assert kubectl.cluster.get("sdep", "llama-70b-chat") is None

    await kubectl("apply", "-f", "-", stdin=example())
    patched = await kubectl(
        "patch",
        "sdep",
        "llama-70b-chat",
        "--type=merge",
        "--dry-run=server",
        "-p",
        '{"spec":{"serving":{"replicas":5}}}',
    )
    assert patched.code == 0, patched.err
    deleted = await kubectl("delete", "sdep", "llama-70b-chat", "--dry-run=server")
    assert deleted.code == 0, deleted.err
    stored = kubectl.cluster.get("sdep", "llama-70b-chat")
    assert stored is not None and stored["spec"]["serving"]["replicas"] == 2


SCHEDULE = "draftModel K=6 to batch 32, K=2 to batch 96, K=0 above 96"


def table(out: str) -> list[dict[str, str]]:
    """kubectl's table as rows of {column: cell}, cut where each header starts (cells hold spaces)."""
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


async def test_get_shows_the_printer_columns(kubectl: Kubectl) -> None:
    await kubectl("apply", "-f", "-", stdin=example())
    kubectl.cluster.patch_status(
        "sdep",
        "llama-70b-chat",
        {
            "phase": "Canary",
            "speculation": {"state": "on", "schedule": SCHEDULE, "measuredSpeedup": 2.5},
            "draft": {"version": "v3"},
            "specDraft": "v4 canary",
            "observed": {"alpha": 0.81, "perTokenLatencyP99": "4.99ms"},
            "canary": {"phase": "Progressing", "weight": 25},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Serving",
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }
            ],
        },
    )
    shown = await kubectl("get", "sdep")
    assert shown.code == 0, shown.err
    [row] = table(shown.out)
    assert list(row) == [
        "NAME",
        "PHASE",
        "READY",
        "SPECULATION",
        "SCHEDULE",
        "DRAFT",
        "SPECDRAFT",
        "ACCEPT",
        "P99",
        "WEIGHT",
        "AGE",
    ]
    assert list(row.values())[:10] == [
        "llama-70b-chat",
        "Canary",
        "True",
        "on",
        SCHEDULE,  # the whole schedule the engines apply, readable in one cell
        "v3",
        "v4 canary",  # the spec's draft, under canary while v3 serves
        "0.81",
        "4.99ms",
        "25",
    ]
    assert row["AGE"].endswith("s")
    wide = await kubectl("get", "sdep", "llama-70b-chat", "-o", "wide")
    assert "SPEEDUP" in wide.out and "2.5" in wide.out

    kubectl.cluster.patch_status("sdep", "llama-70b-chat", {"canary": None, "phase": "Dynamic"})
    after = await kubectl("get", "sdep", "--no-headers")
    cells = after.out.split()
    assert cells[1] == "Dynamic" and "25" not in cells  # WEIGHT empty once the canary is over


async def test_explain_prints_the_field_documentation(kubectl: Kubectl) -> None:
    explained = await kubectl("explain", "sdep.spec.speculation")
    assert explained.code == 0, explained.err
    assert "KIND:       SpeculativeDeployment" in explained.out
    assert "How the control loop runs speculation." in explained.out
    for field in ("reconfigure", "draftLength", "mode", "rollout"):
        assert field in explained.out
    missing = await kubectl("explain", "sdep.spec.nothing")
    assert missing.code == 1 and 'field "nothing" does not exist' in missing.err


async def test_get_watch_prints_rows_as_they_change(kubectl: Kubectl) -> None:
    await kubectl("apply", "-f", "-", stdin=example())
    assert KUBECTL is not None
    process = await asyncio.create_subprocess_exec(
        KUBECTL, "get", "sdep", "-w", "--no-headers", stdout=asyncio.subprocess.PIPE, env=kubectl.env
    )
    try:
        assert process.stdout is not None
        first = await asyncio.wait_for(process.stdout.readline(), 10)
        assert first.split()[0] == b"llama-70b-chat"
        kubectl.cluster.patch_status("sdep", "llama-70b-chat", {"phase": "Baseline"})
        second = await asyncio.wait_for(process.stdout.readline(), 10)
        assert second.split()[:2] == [b"llama-70b-chat", b"Baseline"]
    finally:
        process.terminate()
        await process.wait()


async def test_get_shows_the_usual_columns_of_pods_and_deployments(kubectl: Kubectl) -> None:
    cluster = kubectl.cluster
    cluster.create("pods", {"metadata": {"name": "serving-0"}, "spec": {"containers": [{"name": "triton"}]}})
    cluster.patch_status(
        "pods",
        "serving-0",
        {"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    )
    cluster.create("deployments", {"metadata": {"name": "serving"}, "spec": {"replicas": 2}})
    cluster.patch_status(
        "deployments", "serving", {"readyReplicas": 1, "updatedReplicas": 2, "availableReplicas": 1}
    )

    pods = await kubectl("get", "pods", "-o", "wide")
    assert pods.code == 0, pods.err
    header, row = (line.split() for line in pods.out.strip().splitlines())
    assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"]
    assert row[:4] == ["serving-0", "1/1", "Running", "0"] and row[5] == "127.0.0.1"
    deployments = await kubectl("get", "deployments", "--no-headers")
    assert deployments.out.split()[:4] == ["serving", "1/2", "2", "1"]


async def test_get_events_shows_last_seen_type_reason_object_and_message(kubectl: Kubectl) -> None:
    kubectl.cluster.create(
        "events",
        {
            "metadata": {"name": "llama-70b-chat.1"},
            "involvedObject": {
                "kind": "SpeculativeDeployment",
                "name": "llama-70b-chat",
                "namespace": "default",
            },
            "type": "Normal",
            "reason": "RevisionProposed",
            "message": "K=4 to batch 24 pays 1.6x ",
            "source": {"component": "specops"},
            "firstTimestamp": "2026-01-01T00:00:00Z",
            "lastTimestamp": "2026-01-01T00:00:00Z",
            "count": 3,
        },
    )

    events = await kubectl("get", "events")
    assert events.code == 0, events.err
    assert events.out.splitlines()[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    [row] = table(events.out)
    assert (row["TYPE"], row["REASON"], row["OBJECT"], row["MESSAGE"]) == (
        "Normal",
        "RevisionProposed",
        "speculativedeployment/llama-70b-chat",
        "K=4 to batch 24 pays 1.6x",
    )
    wide = await kubectl("get", "events", "-o", "wide")
    assert wide.out.splitlines()[0].split() == [
        *("LAST", "SEEN", "TYPE", "REASON", "OBJECT", "SUBOBJECT", "SOURCE", "MESSAGE"),
        *("FIRST", "SEEN", "COUNT", "NAME"),
    ]
    assert wide.out.splitlines()[1].split()[-2:] == ["3", "llama-70b-chat.1"]
    assert "specops" in table(wide.out)[0]["SOURCE"]


async def test_a_create_in_a_missing_namespace_is_refused_as_not_found(kubectl: Kubectl) -> None:
    body = yaml.safe_load(example())
    body["metadata"]["namespace"] = "inference"
    refused = await kubectl("apply", "-f", "-", stdin=yaml.safe_dump(body))
    assert refused.code == 1
    assert "Error from server (NotFound)" in refused.err and 'namespaces "inference" not found' in refused.err

    assert (await kubectl("create", "namespace", "inference")).code == 0
    created = await kubectl("apply", "-f", "-", stdin=yaml.safe_dump(body))
    assert created.code == 0, created.err
    assert kubectl.cluster.get("sdep", "llama-70b-chat", namespace="inference") is not None
