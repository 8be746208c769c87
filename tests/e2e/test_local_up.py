"""`specops local up`: the local stack as a person starts it, used with real kubectl, stopped by SIGTERM."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.emulated_only,
    pytest.mark.timeout(150),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed (make kubectl)"),
]
BIN = Path(sys.executable).parent


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

        # When it gets SIGTERM, it stops everything it started and exits cleanly
        process.send_signal(signal.SIGTERM)
        rest = (await asyncio.wait_for(process.stdout.read(), 30)).decode()
        assert await asyncio.wait_for(process.wait(), 10) == 0, rest
        assert "stopped." in rest
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"{prometheus}/-/ready")
            with pytest.raises(httpx.ConnectError):
                await client.get(printed["API server"])
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
