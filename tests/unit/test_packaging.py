"""The wheel is what gets installed (pip install . in the image): it must carry everything the
operator needs at run time, the Triton model the serving pods load above all, and run on its own.
It carries the operator alone: the local stack is its own distribution (local/), reaching `specops`
through entry points, and the image installs the operator's wheel only."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(project: Path, out: Path) -> Path:
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
            str(project),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("*.whl")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(ROOT, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def local_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(ROOT / "local", tmp_path_factory.mktemp("local-wheel"))


@pytest.fixture(scope="module")
def operator_alone(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment with the operator's wheel and its dependencies, and no local stack: the wheel in a
    target directory, this environment's site-packages seen through links that leave out specops's and
    the local stack's own entries (their metadata and editable paths)."""
    root = tmp_path_factory.mktemp("operator-alone")
    target, deps = root / "site", root / "deps"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    deps.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("specops", "_specops", "_editable_impl_specops")):
            (deps / entry.name).symlink_to(entry)
    # -S (below): no site-packages processing, so no .pth of the checkout's editable installs is read
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(deps)])}


def run_specops(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = "import sys, specops.cli\nsys.exit(specops.cli.main(sys.argv[1:]))\n"
    return subprocess.run(
        [sys.executable, "-S", "-c", script, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


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


def test_the_operator_wheel_holds_the_operator_alone(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.startswith("specops-0.1.0.dist-info/")}
    assert packages == {"specops"}
    assert not any("specops_local" in name for name in names)
    entry_points = zipfile.ZipFile(wheel).read("specops-0.1.0.dist-info/entry_points.txt").decode()
    assert "specops.commands" not in entry_points and "specops.bench" not in entry_points


def test_the_local_stack_wheel_holds_the_local_stack_and_registers_its_commands(local_wheel: Path) -> None:
    archive = zipfile.ZipFile(local_wheel)
    names = archive.namelist()
    assert {"specops_local/cli.py", "specops_local/sim/engines/vllm.py", "specops_local/emulator.py"} <= set(
        names
    )
    assert any(name.startswith("specops_local/upstream-crds/") and name.endswith(".yaml") for name in names)
    assert not any(name.startswith("specops/") or "__pycache__" in name for name in names)
    meta = "specops_local-0.1.0.dist-info/"
    entry_points = archive.read(meta + "entry_points.txt").decode()
    assert "[specops.commands]\nlocal = specops_local.cli:local" in entry_points
    for name, module in (("fuzz", "fuzz"), ("scale", "scale"), ("tick", "tick_cost")):
        assert f"{name} = specops_local.{module}:main" in entry_points
    assert "Requires-Dist: specops==0.1.0" in archive.read(meta + "METADATA").decode()


def test_the_local_stack_requires_the_operator_of_its_own_version() -> None:
    operator = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    local = tomllib.loads((ROOT / "local" / "pyproject.toml").read_text())["project"]
    assert local["version"] == operator["version"]
    assert f"specops=={operator['version']}" in local["dependencies"]


def test_the_operator_names_no_module_of_the_local_stack() -> None:
    # The import-linter contract sees import statements; this sees strings (importlib by name) too.
    naming = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "operator" / "specops").rglob("*.py")
        if "specops_local" in path.read_text()
    ]
    assert naming == []


def test_the_image_copies_and_installs_the_operator_alone() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    copies = [shlex.split(line)[1:] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    sources = {source for args in copies if not args[0].startswith("--from=") for source in args[:-1]}
    assert sources == {"pyproject.toml", "README.md", "operator/specops"}
    installs = re.findall(r"pip install ([^&\n]*)", dockerfile)
    assert [shlex.split(args) for args in installs] == [["--no-compile", "."]]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {"local", "operator/specops_local"} <= set(ignored)


def test_without_the_local_stack_specops_says_how_to_get_it(
    operator_alone: dict[str, str], tmp_path: Path
) -> None:
    hint = "the local stack is not installed: in a clone of the repository run  pip install -e ./local"
    for args in (["local"], ["local", "up"], ["local", "--help"], ["local", "demo", "--fast"]):
        ran = run_specops(operator_alone, tmp_path, *args)
        assert ran.returncode == 1, ran.stdout + ran.stderr
        assert ran.stderr.strip().splitlines() == [f"Error: {hint}  (make install does)"]
    listed = run_specops(operator_alone, tmp_path, "--help")
    assert listed.returncode == 0 and "local" in listed.stdout and "pip install -e ./local" in listed.stdout
    scale = run_specops(operator_alone, tmp_path, "bench", "scale", "--resources", "3")
    assert scale.returncode == 2
    assert scale.stderr.strip().splitlines() == [
        f"specops bench: no benchmark 'scale' (installed: canary, policy, policy-worlds); {hint}  (make install does)"
    ]
    bench_help = run_specops(operator_alone, tmp_path, "bench", "--help")
    assert "Benchmarks: canary, policy, policy-worlds." in bench_help.stdout
    assert "pip install -e ./local" in bench_help.stdout


def test_the_installed_wheel_runs_without_the_source_tree(
    operator_alone: dict[str, str], tmp_path: Path
) -> None:
    site = operator_alone["PYTHONPATH"].split(os.pathsep)[0]
    check = (
        "import specops, specops.assets\n"
        f"assert specops.__file__.startswith({site!r}), specops.__file__\n"
        "assert 'def execute' in specops.assets.llmapi_model_source()\n"
    )
    ran = subprocess.run(
        [sys.executable, "-S", "-c", check],
        cwd=tmp_path,
        env=operator_alone,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    for args, expect in ((["crd"], "kind: CustomResourceDefinition"), (["run", "--help"], "--metrics-port")):
        ran = run_specops(operator_alone, tmp_path, *args)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert expect in ran.stdout
    crd = run_specops(operator_alone, tmp_path, "crd")
    assert crd.stdout == (ROOT / "crds" / "specops.dev_speculativedeployments.yaml").read_text()
