"""`edge-agent bench hear --room --quick`: the living-room simulation end to end on real audio (our
Piper voice and espeak-ng in a pyroomacoustics room, the real wake models, front end, canceller,
Whisper and openWakeWord), and a report whose figures hang together (run with -m bench)."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.speech_fixtures import whisper_dir  # noqa: F401  (session fixture)

pytestmark = pytest.mark.bench


def test_room_bench_reports_every_condition_off_and_on_with_the_goals(shared_cache: Path,
                                                                       whisper_dir: Path) -> None:  # noqa: F811
    pytest.importorskip("pyroomacoustics")
    result = run_cli("bench", "hear", "--room", "--quick", "--json", "--whisper", str(whisper_dir),
                     "--set", f"models.cache_dir={shared_cache}", timeout=900)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["mode"] == "room"
    conditions = report["conditions"]
    assert conditions == ["clean", "babble 10 dB", "music 10 dB", "fan 10 dB", "babble 0 dB", "music 0 dB",
                          "fan 0 dB", "echo +0 dB", "echo +10 dB"]
    room = report["rooms"][0]
    assert 0.25 <= room["rt60_measured_s"] <= 0.8
    assert all(1.0 <= d <= 3.0 for d in room["talker_m"]) and all(2.0 <= d <= 4.0 for d in room["noise_m"])

    device = report["device"]
    for cond in conditions:
        for path in ("front end off", "front end default", "front end on", "front end speex"):
            assert 0.0 <= device[cond][path]["detected"] <= 1.0
    # Our Piper voice says "Okay Nabu" in the room without noise: the device wakes and hears the command.
    clean = device["clean"]["front end on"]
    assert clean["detected"] > 0
    assert clean["transcripts"] >= 1 and 0.0 <= clean["wer"] < 1.0
    assert 0.0 < clean["eos_to_transcript_p50_s"] <= clean["eos_to_transcript_p95_s"]
    assert device["dry"]["detected"] > 0

    side = report["side_by_side"]
    assert side["models"] == ["alexa", "hey_jarvis", "hey_mycroft"]
    assert {"front end off", "front end default", "front end on", "front end speex"} <= set(side["clean"])

    negatives = report["negatives"]
    assert negatives["audio_h"] == pytest.approx(1 / 60, abs=0.001)  # one 60 s minute, our voice playing
    assert negatives["playing_fraction"] == 1.0
    assert negatives["front end on"]["false_accepts"] >= 0
    # Speex's chain and the default front end heard the same minute in passes of their own.
    for path in ("front end speex", "front end default"):
        assert negatives[path]["false_accepts"] >= 0
        per_hour = negatives[path]["false_accepts"] / negatives["audio_h"]
        assert negatives[path]["per_hour"] == pytest.approx(per_hour, rel=0.01)
    cpu = negatives["cpu"]
    assert 0 < cpu["front_end_percent"] < cpu["hear_path_percent"] < 100
    assert cpu["wake_percent"] > 0 and cpu["vad_percent"] > 0

    ours = next(v for k, v in report["echo"].items() if k.startswith("ours: speex"))
    assert ours["erle_db_after_4s_median"] > 10  # the canceller cancels in the simulated room
    goals = report["goals"]
    assert {"detection_clean", "detection_10db", "detection_0db", "detection_echo_0db",
            "false_accepts_per_hour", "erle_db", "cpu_percent", "wer_ratio clean"} <= set(goals)
    assert all(isinstance(g["met"], bool) for g in goals.values())
    # Scored for the default front end too, each goal from that path's own figures.
    default = report["goals_default"]
    assert set(default) == set(goals)
    assert default["detection_clean"]["value"] == device["clean"]["front end default"]["detected"]
    assert default["false_accepts_per_hour"]["value"] == negatives["front end default"]["per_hour"]
