"""The microphone muted from Home Assistant stays muted across a daemon restart (real mosquitto,
the real hearing loop: wake word, VAD and the exported Whisper on a Piper clip)."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from speech_fixtures import silence, write_wav

from edge_agent.bench.clips import load_16k, piper_clip
from edge_agent.daemon import Daemon, SettingsSource
from tests.mqtt_support import Producer, ToneSynth, Watcher, device_config, wait_until

WAKE_COMMAND = "Okay Nabu, turn on the kitchen lights."


class Running:
    """`edge-agent run` in this process with the real listener (what it hears: `audio.input_file`)."""

    def __init__(self, tmp_path: Path, broker: Any, whisper_dir: Path, heard: Path) -> None:
        config = device_config(tmp_path / "device.yaml", tmp_path,
                               daemon={"state_dir": str(tmp_path / "daemon")})
        source = SettingsSource(config, {"mqtt.broker": broker.url, "device.id": "dev1",
                                         "mqtt.ha_discovery": True, "daemon.out_dir": str(tmp_path / "out"),
                                         "asr.model": str(whisper_dir), "audio.input_file": str(heard)})
        self.daemon = Daemon(source, synthesizer_factory=lambda s: ToneSynth())
        self.thread = threading.Thread(target=lambda: asyncio.run(self.daemon.run()), daemon=True)
        self.thread.start()
        wait_until(lambda: self.daemon.bridge is not None and self.daemon.bridge.connected, what="connect")

    def stop(self) -> None:
        self.daemon.stop()
        self.thread.join(60)
        assert not self.thread.is_alive()


def mute_states(watcher: Watcher) -> list[bytes]:
    return [m.payload for m in watcher.messages if m.topic == "edge/dev1/ha/mic_mute"]


@pytest.fixture(scope="module")
def wake_command(clip_cache: Path, piper_voice: Any) -> np.ndarray:
    return load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice))


def test_a_microphone_muted_from_home_assistant_stays_muted_after_a_restart(
        tmp_path: Path, broker: Any, whisper_dir: Path, wake_command: np.ndarray) -> None:
    quiet = write_wav(tmp_path / "quiet.wav", silence(0.5))
    room = write_wav(tmp_path / "room.wav", np.concatenate([silence(0.5), wake_command, silence(2.0)]))
    producer = Producer(broker.url)
    try:
        first = Running(tmp_path, broker, whisper_dir, quiet)
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
            second = Running(tmp_path, broker, whisper_dir, room)
            try:
                status = after.wait("edge/dev1/status", lambda d: d["state"] == "online")[0]
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
