"""`edge-agent bench hear --real DIR`: a folder of talker clips in the simulated room, one, two and four
microphones, each front end, heard the way `listen --input F --front-end` hears a file (our Piper
voice here: no licensed recordings of real people are available offline)."""

import json
from pathlib import Path

import pytest

from benchmarks.clips import load_16k, piper_clip
from tests.conftest import run_cli
from tests.speech_fixtures import write_wav

pytestmark = pytest.mark.bench


def test_real_bench_reports_each_condition_per_array_and_front_end(tmp_path: Path, clip_cache: Path,
                                                                   piper_voice) -> None:
    pytest.importorskip("pyroomacoustics")
    folder = tmp_path / "talkers"
    (folder / "babble").mkdir(parents=True)
    write_wav(folder / "joe.wav", load_16k(piper_clip("Okay Nabu, turn on the kitchen lights.", clip_cache,
                                                      piper_voice)))
    for i, text in enumerate(("What is the weather like tomorrow?", "Set a timer for ten minutes.")):
        write_wav(folder / "babble" / f"{i}.wav", load_16k(piper_clip(text, clip_cache, piper_voice)))
    result = run_cli("bench", "hear", "--real", str(folder), "--mics", "1,2", "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["mode"] == "real" and report["clips"] == 1 and report["babble_clips"] == 2
    detected = report["detected"]
    assert report["conditions"] == ["dry", "room (fan 30 dB)", "fan 10 dB", "three talkers 10 dB", "fan 0 dB"]
    assert set(detected) == set(report["conditions"])
    assert list(detected["dry"]) == ["1 mic"]
    for cond in report["conditions"][1:]:
        assert set(detected[cond]) == {"1 mic", "2 mic averaged", "2 mic delay-sum", "2 mic superdirective"}
        for row in detected[cond].values():
            assert set(row) == {"off", "webrtc", "speex"} and all(v in (0.0, 1.0) for v in row.values())
    # The clean recording wakes the device on one microphone and, in the quiet room, on two.
    assert detected["dry"]["1 mic"]["off"] == 1.0
    assert detected["room (fan 30 dB)"]["2 mic superdirective"]["off"] == 1.0
    assert report["problems"] == []  # a healthy simulated board: no channel fell back
    assert all(0 < v < 50 for v in report["cpu_percent"].values())


def test_real_bench_refuses_a_folder_without_clips(tmp_path: Path) -> None:
    result = run_cli("bench", "hear", "--real", str(tmp_path), "--json")
    assert result.returncode == 2
    assert "no .wav files" in result.stderr

