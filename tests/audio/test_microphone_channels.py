"""A 2-microphone board through PortAudio: every channel captured, then the beamformer.

The board is a real ALSA capture device that PortAudio opens like any card: ALSA's `file` plugin
in front of its `null` device, whose `infile` supplies the captured frames (written here from a
real person's recording, `tests/data/real`). The capture runs in a child process, which reads
this test's ALSA configuration from its `HOME` when PortAudio starts. The `null` device keeps no
time (it delivers as fast as it is read), so the source's queue is made long enough to hold the
whole clip: a real card's pace never fills it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from edge_agent.audio.beamform import FRAME, HOP
from edge_agent.wake import WakeEngine
from edge_agent.wake.settings import WakeSettings

REAL = Path(__file__).resolve().parents[1] / "data" / "real" / "wake"
RATE = 16000
CAPTURE = """
import json, sys
import numpy as np
from edge_agent.audio.sources import SoundDeviceSource

source = SoundDeviceSource("board", queue_s=600.0, channels=int(sys.argv[1]),
                           mic_geometry=sys.argv[2] or None)
blocks, total = [], 0
for block in source.blocks():
    blocks.append(block)
    total += block.size
    if total >= int(sys.argv[3]):
        break
source.close()
np.save(sys.argv[4], np.concatenate(blocks)[:int(sys.argv[3])])
print(json.dumps({"problem": getattr(source.mixer, "problem", None), "name": source.device_name}))
"""
OPEN = """
import json, sys
import numpy as np
from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.sources import open_source

source = open_source(AudioSettings(input_device="board", input_channels=int(sys.argv[1]),
                                   mic_geometry=sys.argv[2] or None))
np.save(sys.argv[4], np.zeros(0))
print(json.dumps({"channels": source.channels, "mixer": type(source.mixer).__name__,
                  "problem": source.mixer.problem}))
source.close()
"""


def talker() -> np.ndarray:
    """A real person saying "Alexa", with a second of quiet on each side."""
    x, rate = soundfile.read(REAL / "alexa" / "0.flac", dtype="float32")
    assert rate == RATE
    pad = np.zeros(RATE, dtype=np.float32)
    return np.concatenate([pad, x / max(1e-6, float(np.abs(x).max())) * 0.5, pad])


def capture(tmp_path: Path, frames: np.ndarray, geometry: str | None, script: str = CAPTURE,
            ) -> tuple[np.ndarray, dict[str, object]]:
    """`frames` (n, channels) captured through PortAudio from an ALSA device by the microphone source."""
    pytest.importorskip("sounddevice")
    raw = tmp_path / "board.raw"
    (np.clip(frames, -1, 1) * 32767).astype("<i2").tofile(raw)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".asoundrc").write_text(
        'pcm.board {\n type file\n slave.pcm "null"\n file "/dev/null"\n'
        f' infile "{raw}"\n format "raw"\n hint {{ show on description "test board" }}\n}}\n')
    out = tmp_path / "heard.npy"
    env = {**os.environ, "HOME": str(home)}
    done = subprocess.run([sys.executable, "-c", script, str(frames.shape[1]), geometry or "",
                           str(frames.shape[0] - FRAME), str(out)],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    if "PortAudio is not installed" in done.stderr:
        pytest.skip("PortAudio is not installed here (apt install libportaudio2)")
    assert done.returncode == 0, done.stderr
    return np.load(out), json.loads(done.stdout.strip().splitlines()[-1])


def woke(samples: np.ndarray) -> bool:
    engine = WakeEngine.load(WakeSettings(models=("alexa",)))
    try:
        return any(d.model == "alexa" for d in engine.feed(samples))
    finally:
        engine.close()


def test_both_channels_of_a_two_microphone_board_are_captured_and_steered(tmp_path: Path) -> None:
    x = talker()
    delayed = np.concatenate([np.zeros(2, dtype=np.float32), x[:-2]])  # the far microphone, 2 samples on
    frames = np.c_[x, delayed] + np.random.default_rng(1).normal(0, 0.002, (x.size, 2)).astype(np.float32)
    heard, report = capture(tmp_path, frames, "respeaker_2mic")
    assert report == {"problem": None, "name": "board"}
    lag = FRAME - HOP  # the beamformer's latency
    n = heard.size - lag
    assert float(np.corrcoef(heard[lag:], x[:n])[0, 1]) > 0.95
    assert woke(heard)


def test_a_dead_channel_on_the_card_falls_back_to_the_live_one(tmp_path: Path) -> None:
    x = talker()
    heard, report = capture(tmp_path, np.c_[np.zeros_like(x), x], "respeaker_2mic")
    assert report["problem"] == ("audio.mic_geometry: channel 0 is dead (silent or 30 dB below the others): "
                                 "hearing channel 1 alone")
    assert np.sqrt(np.mean(heard ** 2)) > 0.5 * np.sqrt(np.mean(x ** 2))  # the live channel's level
    assert woke(heard)


def test_without_a_geometry_the_channels_are_averaged(tmp_path: Path) -> None:
    x = talker()
    heard, report = capture(tmp_path, np.c_[x, 0.5 * x], None)
    assert report == {"problem": None, "name": "board"}
    assert np.allclose(heard, 0.75 * x[:heard.size], atol=2e-3)



def test_the_daemon_s_settings_open_every_channel_of_the_card(tmp_path: Path) -> None:
    """`open_source` (what `listen` and the daemon call) asks PortAudio for `audio.input_channels`."""
    _, report = capture(tmp_path, np.zeros((RATE, 4), dtype=np.float32), "respeaker_4mic",
                        script=OPEN)
    assert report == {"channels": 4, "mixer": "Beamformer", "problem": None}
