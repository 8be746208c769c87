"""The scale benchmark names the processor it ran on: runs on different hosts do not compare."""

from __future__ import annotations

from pathlib import Path

from specops_local.scale import machine_cpu

TWO_PROCESSORS = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
cpu MHz\t\t: 2449.998

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: Another Processor
cpu MHz\t\t: 1000.000
"""


def test_the_first_processors_model_and_clock(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(TWO_PROCESSORS)
    assert machine_cpu(cpuinfo) == "AMD EPYC 7B13, 2450 MHz"


def test_a_processor_without_a_clock_is_named_alone(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nModel\t\t: Raspberry Pi 4 Model B\n")
    assert machine_cpu(cpuinfo) == "Raspberry Pi 4 Model B"


def test_no_cpuinfo_is_unknown(tmp_path: Path) -> None:
    assert machine_cpu(tmp_path / "missing") == "unknown"
    empty = tmp_path / "empty"
    empty.write_text("")
    assert machine_cpu(empty) == "unknown"
