"""`edge-agent bench hear --real DIR`: recordings of real people saying the wake phrase in the simulated
room, one, two and four microphones, each front end, heard the way `listen --input F --front-end`
hears a file; `--near`: who wakes on other words said by real people; `--false-wakes`: how often under
other talkers; `--real-commands`: the command after the wake phrase (`tests/data/real`)."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.bench

REAL = Path(__file__).resolve().parents[1] / "data" / "real" / "wake"


def test_real_bench_reports_each_condition_per_array_and_front_end(tmp_path: Path) -> None:
    pytest.importorskip("pyroomacoustics")
    result = run_cli("bench", "hear", "--real", str(REAL / "alexa"), "--model", "alexa", "--limit", "2",
                     "--babble", str(REAL / "near"), "--mics", "1,2", "--front-ends", "off,webrtc,speex",
                     "--near", str(REAL / "near"), "--false-wakes", str(REAL / "near"), "--sweep", "--oracle",
                     "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["mode"] == "real" and report["clips"] == 2 and report["babble_clips"] == 24
    assert (report["model"], report["cutoff"], report["split"]) == ("alexa", 0.85, "all")
    detected = report["detected"]
    assert report["conditions"] == ["dry", "room (fan 30 dB)", "fan 10 dB", "three talkers 10 dB", "fan 0 dB"]
    assert set(detected) == set(report["conditions"])
    assert list(detected["dry"]) == ["1 mic"]
    for cond in report["conditions"][1:]:
        assert set(detected[cond]) == {"1 mic", "2 mic averaged", "2 mic delay-sum", "2 mic superdirective",
                                       "2 mic wake-steered"}
        for row in detected[cond].values():
            assert set(row) == {"off", "webrtc", "speex"} and all(v in (0.0, 0.5, 1.0) for v in row.values())
    # Two real people saying "Alexa" wake the device as recorded; the room's echo costs one of them.
    assert detected["dry"]["1 mic"]["off"] == 1.0
    assert detected["room (fan 30 dB)"]["2 mic superdirective"]["off"] >= 0.5
    # The sweep agrees with the engine at the model's own cutoff and window.
    sweep = report["sweep"]
    at = sweep["cutoffs"].index(report["cutoff"])
    assert sweep["detected"]["dry"]["1 mic"]["off"][str(report["window"])][at] == 1.0
    assert report["problems"] == []  # a healthy simulated board: no channel fell back
    assert all(0 < v < 50 for v in report["cpu_percent"].values())
    # The beam held on the talker and the bank of fixed beams, per condition with noise, for the one
    # board asked for.
    assert set(report["oracle"]) == set(report["conditions"][1:])
    assert all(set(row) == {"2 mic superdirective", "2 mic bank of 5"} for row in report["oracle"].values())
    words = report["near_miss"]["words"]
    assert set(words) == {"computer", "jarvis", "smart_mirror", "snowboy", "view_glass"}
    assert all(row["dry"]["alexa"] == 0 for row in words.values())  # nobody said "Alexa"
    assert words["jarvis"]["dry"]["hey_jarvis"] >= 1  # its own name alone: a known trait of the model
    # Other words under other talkers, heard by one microphone and the pair's superdirective beams.
    false = report["false_wakes"]
    assert false["scenes"] == 14 and 0.01 < false["hours"] < 0.05  # every other clip of 24, by word
    assert set(false["arrays"]) == {"1 mic", "2 mic superdirective", "2 mic wake-steered"}
    for row in false["arrays"].values():
        woken = list(row["scenes_woken_at"].values())
        assert woken == sorted(woken, reverse=True) and woken[0] <= false["scenes"]  # fewer at higher cutoffs
        assert row["wakes"] >= row["scenes_woken_at"][str(report["cutoff"])]


def test_real_bench_hears_the_command_after_the_wake_phrase(tmp_path: Path, whisper_dir: Path) -> None:
    pytest.importorskip("pyroomacoustics")
    result = run_cli("bench", "hear", "--real", str(REAL / "alexa"), "--model", "alexa", "--limit", "2",
                     "--babble", str(REAL / "near"), "--mics", "1,2", "--front-ends", "off",
                     "--conditions", "0", "--real-commands", str(REAL.parent / "commands"),
                     "--set", f"asr.model={whisper_dir}", "--set", "listen.end_of_turn=vad", "--json",
                     timeout=600)
    assert result.returncode == 0, result.stderr
    commands = json.loads(result.stdout.strip().splitlines()[-1])["commands"]
    assert commands["commands"] == 2
    rooms = commands["conditions"]
    assert set(rooms) == {"room (fan 30 dB)", "three talkers 10 dB"}
    assert all(set(row) == {"1 mic", "2 mic superdirective", "2 mic wake-steered"} for row in rooms.values())
    for row in (r for rows in rooms.values() for r in rows.values()):
        assert row["opened"] in (0.0, 0.5, 1.0) and 0.0 <= row["words_heard"] <= 1.0 and row["wer"] >= 0.0
    quiet = rooms["room (fan 30 dB)"]["2 mic wake-steered"]
    # Two real people said "Alexa", then "activate Mood Lighting" and "add apples to my Shopping List":
    # in the quiet room the pair opens a turn and Whisper keeps words of its command.
    assert quiet["opened"] >= 0.5 and quiet["words_heard"] > 0.2, quiet


def test_real_bench_refuses_a_folder_without_clips(tmp_path: Path) -> None:
    result = run_cli("bench", "hear", "--real", str(tmp_path), "--json")
    assert result.returncode == 2
    assert "no .wav or .flac files" in result.stderr
    (tmp_path / "broken.flac").write_bytes(b"fLaC not really")
    result = run_cli("bench", "hear", "--real", str(tmp_path), "--json")
    assert result.returncode == 2
    assert "no .wav or .flac files that decode (1 do not)" in result.stderr
