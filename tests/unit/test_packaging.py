"""The wheel is what gets installed (pip install . in the image): it must carry everything the
operator needs at run time, the Triton model the serving pods load above all, and run on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("specops-*.whl")
    return path


def test_the_wheel_carries_the_triton_model_and_the_traces(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "specops/assets/llmapi_model/model.py" in names
    assert "specops/cli.py" in names and "specops/rbac.py" in names
    assert {
        "specops/bench/traces/bursty.csv",
        "specops/bench/traces/steady_low.csv",
        "specops/bench/traces/azure_conv.csv",
    } <= names
    assert not any(name.startswith(("tests/", "charts/")) for name in names)


def test_the_installed_wheel_runs_without_the_source_tree(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # -S: no site-packages processing, so the editable install of the checkout is not seen; the
    # dependencies come from this environment's site-packages, specops only from the wheel.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]])}
    script = (
        "import sys, specops, specops.cli, specops.assets\n"
        f"assert specops.__file__.startswith({str(target)!r}), specops.__file__\n"
        "assert 'def execute' in specops.assets.llmapi_model_source()\n"
        "sys.exit(specops.cli.main(sys.argv[1:]))\n"
    )
    for args, expect in ((["crd"], "kind: CustomResourceDefinition"), (["run", "--help"], "--metrics-port")):
        ran = subprocess.run(
            [sys.executable, "-S", "-c", script, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert expect in ran.stdout
    crd = subprocess.run(
        [sys.executable, "-S", "-c", script, "crd"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert crd.stdout == (ROOT / "crds" / "specops.dev_speculativedeployments.yaml").read_text()
