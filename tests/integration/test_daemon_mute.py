"""The microphone muted from Home Assistant stays muted across a daemon restart (real mosquitto,
the real hearing loop: wake word, VAD and the exported Whisper on a Piper clip)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.clips import load_16k, piper_clip
from tests.daemon_support import HearingDaemon
from tests.mqtt_support import Producer, Watcher, wait_until
from tests.speech_fixtures import silence, write_wav

WAKE_COMMAND = "Okay Nabu, turn on the kitchen lights."


def mute_states(watcher: Watcher) -> list[bytes]:
    return [m.payload for m in watcher.messages if m.topic == "edge/dev1/ha/mic_mute"]


@pytest.fixture(scope="module")
def wake_command(clip_cache: Path, piper_voice: Any) -> np.ndarray:
    return load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice))


def test_a_microphone_muted_from_home_assistant_stays_muted_after_a_restart(
        tmp_path: Path, broker: Any, whisper_dir: Path, wake_command: np.ndarray) -> None:
    quiet = write_wav(tmp_path / "quiet.wav", silence(0.5))
    room = write_wav(tmp_path / "room.wav", np.concatenate([silence(0.5), wake_command, silence(2.0)]))
    settings = {"mqtt.ha_discovery": True, "daemon.out_dir": str(tmp_path / "out")}
    producer = Producer(broker.url)
    try:
        first = HearingDaemon(tmp_path, broker, whisper_dir, {**settings, "audio.input_file": str(quiet)})
        try:
            seen = Watcher(broker.url)
            try:
                producer.publish("edge/dev1/ha/mic_mute/set", b"ON")  # Home Assistant's switch (not retained)
                wait_until(lambda: b"ON" in mute_states(seen), what="the switch's state ON")
            finally:
                seen.close()
        finally:
            first.stop()
        assert json.loads((tmp_path / "daemon" / "controls.json").read_text())["mic_muted"] is True

        after = Watcher(broker.url)
        try:
            second = HearingDaemon(tmp_path, broker, whisper_dir, {**settings, "audio.input_file": str(room)})
            try:
                # A status may go out while the daemon still starts (listen "off" until the
                # listener has been decided): the first one that says how it listens.
                status = after.wait("edge/dev1/status",
                                    lambda d: d["state"] == "online" and d["listen"]["state"] != "off")[0]
                assert status["listen"]["state"] == "muted"
                wait_until(lambda: mute_states(after) and mute_states(after)[-1] == b"ON",
                           what="the switch's state ON after the restart")
                assert b"OFF" not in mute_states(after)
                assert second.daemon.listener is None  # the microphone (here: the room's file) never opened
                assert after.find("edge/dev1/wake") == [] and after.find("edge/dev1/transcript") == []

                # The same room, unmuted: the wake word and the command are heard, so the silence
                # above was the mute's doing.
                producer.publish("edge/dev1/ha/mic_mute/set", b"OFF")
                woke = after.wait("edge/dev1/wake", timeout=180)
                heard = after.wait("edge/dev1/transcript", timeout=180)
            finally:
                second.stop()
        finally:
            after.close()
    finally:
        producer.close()
    assert woke[0]["wake_word"] == "Okay Nabu"
    assert "kitchen lights" in heard[0]["text"].lower()
    assert json.loads((tmp_path / "daemon" / "controls.json").read_text())["mic_muted"] is False
