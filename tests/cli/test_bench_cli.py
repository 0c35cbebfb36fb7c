"""`edge-agent bench`: the subjects come from the benchmarks installed beside the runtime (tools/).

The runtime never imports `benchmarks`; it asks the `edge_speech.benchmarks` entry point group.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from edge_agent.cli import build_parser, main
from edge_agent.commands import bench

SUBJECTS = {"tts", "asr", "offload", "mqtt", "fleet", "failover", "wyoming", "startup", "wake"}


def install_dist(site: Path, name: str, benchmarks: dict[str, str]) -> None:
    """A distribution's metadata as pip leaves it, declaring `benchmarks` under the group."""
    info = site / f"{name.replace('-', '_')}-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    lines = [f"[{bench.GROUP}]", *(f"{k} = {v}" for k, v in benchmarks.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def exit_code(argv: list[str]) -> int | str | None:
    """`edge-agent ARGV`'s exit status, whether the verb returns it or argparse exits."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_every_subject_of_the_installed_benchmarks_is_a_bench_verb():
    assert {e.name for e in entry_points(group=bench.GROUP)} >= SUBJECTS, "scripts/test installs tools/"
    done = subprocess.run([sys.executable, "-m", "edge_agent", "bench", "--help"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert all(f"    {subject} " in done.stdout for subject in SUBJECTS), done.stdout


@pytest.mark.parametrize("argv", [["bench", "tts", "--json"], ["bench"], ["bench", "--json"],
                                  ["bench", "wake", "--hours", "1"]])
def test_without_the_benchmarks_bench_says_in_one_line_how_to_install_them(argv, monkeypatch, capsys):
    monkeypatch.setattr(bench, "GROUP", "edge_speech.benchmarks_nowhere")
    assert exit_code(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "benchmarks are not installed" in err and "pip install './tools[bench]'" in err


def test_a_benchmark_that_cannot_load_says_why_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    install_dist(tmp_path, "edge-speech-broken-bench", {"broken": "edge_speech_no_such_module"})
    monkeypatch.syspath_prepend(str(tmp_path))
    args = build_parser("bench").parse_args(["bench", "fleet", "--devices", "3"])
    assert args.devices == 3 and callable(args.handler)
    assert exit_code(["bench", "broken", "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench broken cannot load edge_speech_no_such_module" in err, err
