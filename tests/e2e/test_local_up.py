"""`specops local up`: the local stack as a person starts it, used with real kubectl, stopped by SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.emulated_only,
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (make kubectl)"),
]
BIN = Path(sys.executable).parent
RETRAIN = json.dumps(
    {
        "spec": {
            "retraining": {
                "enabled": True,
                "image": "registry.example.com/specops-trainer:1",
                "data": {"uri": "s3://prompts/llama-70b-chat/"},
            }
        }
    }
)
RETARGET = json.dumps({"spec": {"target": {"version": "2026-11-15"}}})


async def read_until(stream: asyncio.StreamReader, marker: str, timeout_s: float) -> list[str]:
    lines: list[str] = []
    while not any(marker in line for line in lines):
        line = (await asyncio.wait_for(stream.readline(), timeout_s)).decode()
        if not line:
            raise AssertionError(f"exited before {marker!r}: {lines}")
        lines.append(line.rstrip("\n"))
    return lines


async def kubectl(kubeconfig: Path, home: Path, *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        "kubectl",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "HOME": str(home),
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        },
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def specops_local(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        str(BIN / "specops"), "local", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode()


async def wait_until(what: str, check: Any, timeout_s: float) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        seen = await check()
        if seen[0]:
            return seen[1]
        assert asyncio.get_running_loop().time() < deadline, f"{what}: still {seen[1]!r}"
        await asyncio.sleep(1)


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ (\S+): ")


def loggers(path: Path) -> set[str]:
    return {m.group(1) for line in path.read_text().splitlines() if (m := LOG_LINE.match(line))}


async def test_local_up_serves_kubectl_until_sigterm_then_stops_everything(tmp_path: Path) -> None:
    workdir = tmp_path / "stack"
    process = await asyncio.create_subprocess_exec(
        str(BIN / "specops"),
        "local",
        "up",
        "--workdir",
        str(workdir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    try:
        # Given the stack is up, it says where its kubeconfig and Prometheus are
        lines = await read_until(process.stdout, "Up.", 60)
        printed = {k.strip(): v.strip() for k, _, v in (line.partition(": ") for line in lines) if v}
        kubeconfig = Path(printed["kubeconfig"])
        prometheus = printed["Prometheus"]
        assert kubeconfig == workdir.resolve() / "kubeconfig" and kubeconfig.exists()  # noqa: ASYNC240
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{prometheus}/-/ready")).status_code == 200

        # When a person applies the example it printed, with real kubectl
        example = workdir.resolve() / "examples" / "dense-70b-7b.yaml"
        assert f"kubectl apply -f {example}" in "\n".join(lines)
        applied = await kubectl(kubeconfig, tmp_path, "apply", "-f", str(example))
        assert "speculativedeployment.specops.dev/llama-70b-chat created" in applied

        # Then the operator renders it, simulated pods serve it, and kubectl specops shows it
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            pods = await kubectl(kubeconfig, tmp_path, "get", "pods", "--no-headers")
            table = await kubectl(kubeconfig, tmp_path, "get", "sdep", "--no-headers")
            if len(pods.strip().splitlines()) == 2 and table.split()[1] in ("Baseline", "Fixed", "Dynamic"):
                break
            assert asyncio.get_running_loop().time() < deadline, (pods, table)
            await asyncio.sleep(1)
        view = await kubectl(kubeconfig, tmp_path, "specops", "get", "llama-70b-chat")
        assert "default/llama-70b-chat" in view and "break-even" in view

        # When a person moves the load past break-even from a second terminal
        code, said = await specops_local(
            "load", "llama-70b-chat", "--batch", "300", "--workdir", str(workdir)
        )
        assert code == 0 and "local.specops.dev/batch=300" in said, said

        # Then the stack's pods serve it and the operator measures it (the engines cap at 256)
        async def observed_batch() -> tuple[bool, str]:
            batch = await kubectl(
                kubeconfig,
                tmp_path,
                "get",
                "sdep",
                "llama-70b-chat",
                "-o",
                "jsonpath={.status.observed.batch}",
            )
            return bool(batch) and float(batch) > 200, batch

        await wait_until("observed batch past break-even", observed_batch, 30)
        code, said = await specops_local("load", "nope", "--batch", "3", "--workdir", str(workdir))
        assert (
            code == 1 and said.strip() == 'Error: speculativedeployment "nope" not found in namespace default'
        )

        # When retraining is on and the target moves, the training Job runs to completion with a draft
        await kubectl(
            kubeconfig, tmp_path, "patch", "sdep", "llama-70b-chat", "--type", "merge", "-p", RETRAIN
        )
        await kubectl(
            kubeconfig, tmp_path, "patch", "sdep", "llama-70b-chat", "--type", "merge", "-p", RETARGET
        )

        async def trained() -> tuple[bool, str]:
            events = await kubectl(kubeconfig, tmp_path, "get", "events")
            return "RetrainingSucceeded" in events, events

        events = await wait_until("the round's Job trained a draft", trained, 60)
        # and kubectl get events shows the usual columns
        assert events.splitlines()[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
        succeeded = next(line for line in events.splitlines() if "RetrainingSucceeded" in line)
        assert (
            "speculativedeployment/llama-70b-chat" in succeeded
            and "trained draft v3-rt1-2026-11-15" in succeeded
        )
        jobs = json.loads(await kubectl(kubeconfig, tmp_path, "get", "jobs", "-o", "json"))["items"]
        assert [c["type"] for job in jobs for c in job["status"]["conditions"]] == ["Complete"]

        # When it gets SIGTERM, it stops everything it started and exits cleanly
        process.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(process.stdout.read(), 30)).decode()
        assert await asyncio.wait_for(process.wait(), 10) == 0, rest
        assert "stopped." in rest
        # and draws the timeline of what it served
        picture = workdir.resolve() / "timeline-llama-70b-chat.png"
        assert f"timeline: {picture}" in rest and picture.stat().st_size > 10_000
        recorded = json.loads(picture.with_suffix(".json").read_text())
        assert max(s["offered_batch"] or 0 for s in recorded["samples"]) == 300
        assert "RetrainingSucceeded" in {m["reason"] for m in recorded["markers"]}
        # operator.log holds the operator's lines; the API server's access log has its own file
        assert loggers(workdir / "operator.log") and all(
            name.split(".")[0] in ("kopf", "specops") for name in loggers(workdir / "operator.log")
        ), loggers(workdir / "operator.log")
        assert "aiohttp.access" in loggers(workdir / "api-server.log")
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"{prometheus}/-/ready")
            with pytest.raises(httpx.ConnectError):
                await client.get(printed["API server"])
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
