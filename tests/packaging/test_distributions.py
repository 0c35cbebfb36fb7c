"""Two distributions from one checkout: the device runtime alone, and the tools beside it.

The device wheel (the repository root, `pip install .`) ships `edge_agent` and nothing else; the
exporter and the benchmarks are `edge-speech-tools` (tools/), which `edge-agent bench` finds by
entry point. Both wheels are built here as pip builds them, without build isolation (offline).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.conftest import REPO


def build_wheel(project: Path, tmp: Path) -> zipfile.ZipFile:
    """The wheel pip builds of `project`, from a copy (an in-tree build leaves build/ behind)."""
    pytest.importorskip("setuptools", minversion="77", reason="the dev extra brings setuptools >= 77")
    source = tmp / "src"
    shutil.copytree(project, source, ignore=shutil.ignore_patterns(
        "build", "dist", "*.egg-info", "__pycache__", ".*"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
                           "--no-build-isolation", "--quiet", "-w", str(tmp / "wheels")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp / "wheels").glob("*.whl")
    return zipfile.ZipFile(wheel)


def top_level(wheel: zipfile.ZipFile) -> set[str]:
    return {name.split("/")[0] for name in wheel.namelist() if not name.split("/")[0].endswith(".dist-info")}


def dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist()
               if n.split("/")[0].endswith(".dist-info") and n.endswith("/" + name)]
    return wheel.read(path).decode()


def bench_subjects() -> set[str]:
    """Modules of tools/benchmarks that are a `bench` subject: `add_arguments` and `run` at top level."""
    found = set()
    for path in (REPO / "tools" / "benchmarks").glob("*.py"):
        defined = {n.name for n in ast.parse(path.read_text(encoding="utf-8")).body
                   if isinstance(n, ast.FunctionDef)}
        if {"add_arguments", "run"} <= defined:
            found.add(path.stem)
    return found


def test_the_device_wheel_ships_the_runtime_and_neither_the_exporter_nor_the_benchmarks(tmp_path):
    wheel = build_wheel(REPO, tmp_path)
    assert top_level(wheel) == {"edge_agent"}
    assert not [n for n in wheel.namelist() if n.startswith("edge_agent/bench/")]
    entry_points = dist_info(wheel, "entry_points.txt")
    assert "edge-agent = edge_agent.cli:main" in entry_points
    assert "edge-export" not in entry_points and "edge_speech." not in entry_points
    metadata = Parser().parsestr(dist_info(wheel, "METADATA"))
    assert metadata.get_all("Provides-Extra") == ["server", "sendspin", "dev"]


def test_the_tools_wheel_ships_the_exporter_and_every_benchmark_under_its_entry_point(tmp_path):
    wheel = build_wheel(REPO / "tools", tmp_path)
    assert top_level(wheel) == {"exporters", "benchmarks"}
    lines = dist_info(wheel, "entry_points.txt").splitlines()
    groups: dict[str, dict[str, str]] = {}
    for line in lines:
        if line.startswith("["):
            group = groups.setdefault(line.strip("[]"), {})
        elif "=" in line:
            name, value = (part.strip() for part in line.split("=", 1))
            group[name] = value
    assert groups["console_scripts"] == {"edge-export": "exporters.cli:main"}
    assert groups["edge_speech.benchmarks"] == {s: f"benchmarks.{s}" for s in bench_subjects()}
    assert len(groups["edge_speech.benchmarks"]) >= 9
    assert groups["edge_speech.asr_references"] == {"torch-fp32": "exporters.asr_reference:torch_fp32"}
    metadata = Parser().parsestr(dist_info(wheel, "METADATA"))
    assert "edge-speech==0.1.0" in metadata.get_all("Requires-Dist")
