"""A two-microphone board with a dead channel, on the running daemon: heard on the live channel,
and the reason on its status (`listen.channels`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.clips import load_16k, piper_clip
from tests.daemon_support import HearingDaemon
from tests.mqtt_support import Watcher
from tests.speech_fixtures import silence

WAKE_COMMAND = "Okay Nabu, turn on the kitchen lights."


def test_a_dead_channel_is_on_the_status_and_the_live_one_is_heard(
        tmp_path: Path, broker: Any, whisper_dir: Path, clip_cache: Path, piper_voice: Any) -> None:
    room = np.concatenate([silence(0.5), load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice)),
                           silence(2.0)])
    frames = np.c_[room, np.zeros_like(room)]  # channel 1 gives digital silence (a broken mic)
    raw = tmp_path / "board.raw"  # what `arecord -c 2 -f S16_LE -t raw` would write
    raw.write_bytes(np.round(np.clip(frames, -1, 1) * 32767).astype("<i2").tobytes())
    watcher = Watcher(broker.url)
    running = HearingDaemon(tmp_path, broker, whisper_dir, {
        "audio.input_command": f"cat {shlex.quote(str(raw))}", "audio.input_channels": 2,
        "audio.mic_geometry": "respeaker_2mic", "wake.chime": False})
    try:
        status = watcher.wait("edge/dev1/status", lambda d: "channels" in d.get("listen", {}), timeout=180)
        woke = watcher.wait("edge/dev1/wake", timeout=180)[0]
        heard = watcher.wait("edge/dev1/transcript", timeout=180)[0]
    finally:
        running.stop()
        watcher.close()
    listen = status[0]["listen"]
    assert listen["state"] == "listening"
    assert listen["channels"] == ("audio.mic_geometry: channel 1 is dead (silent or 30 dB below the "
                                  "others): hearing channel 0 alone")
    assert woke["wake_word"] == "Okay Nabu"
    assert "kitchen lights" in heard["text"].lower()
