"""`bench turn --answer`'s parts: the player that times a daemon's answer, and the client that answers."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.turnanswer import OUTPUT_RATE, Answerer, Player, first_answer
from tests.mqtt_support import Producer, Watcher, wait_until
from tests.speech_fixtures import run_cli


def test_the_player_times_an_answers_first_audible_sample_as_played_from_its_first_byte(tmp_path: Path):
    player = Player(tmp_path / "out.pcm").start()
    try:
        quiet = np.zeros(round(0.2 * OUTPUT_RATE), dtype="<i2")  # a voice's silence before its speech
        loud = np.full(OUTPUT_RATE // 10, 8000, dtype="<i2")
        written = time.monotonic()
        # One run of the output command, as the daemon starts it for each answer.
        subprocess.run(["dd", f"of={player.path}", "bs=4096", "status=none"],
                       input=np.concatenate([quiet, loud]).tobytes(), check=True, timeout=30)
        wait_until(lambda: player.audible, what="the answer's audio")
    finally:
        player.close()
    assert written + 0.2 <= player.audible[0] < written + 0.2 + 1.0


def test_an_answer_is_timed_after_the_speech_and_one_during_it_is_told_apart():
    assert first_answer([5.0, 5.1], started=1.0, speech_written=4.0, until=9.0) == (5.0, False)
    assert first_answer([3.0, 5.0], started=1.0, speech_written=4.0, until=9.0) == (5.0, True)
    assert first_answer([9.5], started=1.0, speech_written=4.0, until=9.0) == (None, False)


def test_each_transcript_of_a_turn_is_answered_with_its_conversation_id(broker: Any):
    heard: list[tuple[str, dict[str, Any]]] = []
    done = threading.Event()

    def on_transcript(device: str, arrived: float, doc: dict[str, Any]) -> None:
        heard.append((device, doc))
        done.set()

    watcher = Watcher(broker.url)
    answerer = Answerer(broker.url, on_transcript)
    producer = Producer(broker.url, client_id="bench-turn-device")
    try:
        producer.publish("edge/dev1/transcript", {"text": "turn on the lights", "start": 1.0, "end": 2.0,
                                                  "ts": 0.0, "conversation_id": "c1"})
        answer = watcher.wait("edge/dev1/announce")[0]
        assert done.wait(10)
    finally:
        producer.close()
        answerer.close()
        watcher.close()
    assert answer["conversation_id"] == "c1" and answer["text"] and answer["id"].startswith("answer-")
    assert heard == [("dev1", {"event": "transcript", "text": "turn on the lights", "start": 1.0, "end": 2.0,
                               "ts": 0.0, "conversation_id": "c1"})]


@pytest.mark.bench
def test_bench_turn_answer_times_the_daemons_answer_after_its_transcript(
        whisper_dir, turn_model, shared_cache):
    result = run_cli("bench", "turn", "--answer", "--json", "--real", "none", "--one", "1", "--two", "0",
                     "--voices", "piper:joe", "--set", f"asr.model={whisper_dir}",
                     "--set", f"models.cache_dir={shared_cache}", timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for end in ("vad", "model"):
        figures = report["synthetic"][end]
        assert figures["answers_timed"] == 1 and figures["answered_early"] == 0, figures
        # Heard, answered over MQTT, spoken: the answer's first audio comes after the transcript.
        assert figures["p50_s"] < figures["answer_p50_s"] < figures["p50_s"] + 5.0, figures
    assert "answer_p50_le_0.45" in report["goals"] and "rss_le_330_mb" not in report["goals"]
