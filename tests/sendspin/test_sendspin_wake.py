"""The daemon's real hearing loop over music: a wake word pauses the music until the turn ends (real
mosquitto, a real aiosendspin server, the wake word, VAD and the exported Whisper on our voice's
clip arriving in real time on the microphone's FIFO)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.sendspin.sendspin_skip import require_sendspin

require_sendspin()

from benchmarks.clips import load_16k, piper_clip  # noqa: E402
from edge_agent.audio.wav import encode_pcm  # noqa: E402
from tests.daemon_support import HearingDaemon  # noqa: E402
from tests.mqtt_support import Watcher, wait_until  # noqa: E402
from tests.sendspin.sendspin_support import MusicServer, heard, tone, until  # noqa: E402
from tests.speech_fixtures import silence  # noqa: E402


def speak_into(fifo: Path, audio: np.ndarray) -> None:
    block = 320  # 20 ms, as a sound server delivers it
    started = time.monotonic()
    with fifo.open("wb", buffering=0) as mic:
        for start in range(0, len(audio), block):
            mic.write(encode_pcm(audio[start:start + block], 2))
            # Pacing, not synchronisation: the stream arrives in real time, as a microphone's.
            ahead = (start + block) / 16000 - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)


@pytest.mark.slow
def test_a_wake_word_pauses_the_music_until_the_turn_ends(tmp_path: Path, broker: Any, whisper_dir: Path,
                                                          clip_cache: Path, piper_voice: Any, caplog) -> None:
    caplog.set_level("INFO", logger="edge_agent.sendspin")
    command = load_16k(piper_clip("Okay Nabu, turn on the kitchen lights.", clip_cache, piper_voice))
    room = np.concatenate([silence(1.0), command, silence(3.0)])
    fifo = tmp_path / "mic.pcm"
    watcher = Watcher(broker.url)
    device = HearingDaemon(tmp_path, broker, whisper_dir, {
        "audio.input_pipe": str(fifo), "wake.chime": False, "daemon.out_dir": str(tmp_path / "out"),
        "sendspin.enabled": True, "sendspin.host": "127.0.0.1", "sendspin.port": 0,
        "sendspin.zeroconf": False})
    try:
        watcher.wait("edge/dev1/status", lambda d: d.get("listen", {}).get("state") == "listening")
        player = wait_until(lambda: device.daemon.sendspin, what="the player")

        async def scenario() -> None:
            music = MusicServer()
            try:
                client = await music.join(player)
                streaming = asyncio.create_task(music.stream([client], tone(len(room) / 16000 + 3.0)))
                await until(lambda: player.playout.stats.audio_blocks > 25, 20, "half a second of music")
                talker = threading.Thread(target=speak_into, args=(fifo, room), daemon=True)
                talker.start()
                await until(lambda: player.status()["paused"], 30, "the music paused by the wake word")
                await until(lambda: not player.status()["paused"], 60, "the music back after the turn")
                _, stream = await streaming
                stream.stop()
                talker.join(30)
            finally:
                await music.close()

        asyncio.run(scenario())
        assert watcher.wait("edge/dev1/transcript")[0]["wake_word"] == "Okay Nabu"
    finally:
        device.stop()
        watcher.close()
    cues = [r.getMessage() for r in caplog.records if r.getMessage().startswith("sendspin: music")]
    assert len(cues) == 2 and cues[0].startswith("sendspin: music paused (turn:"), cues
    assert cues[1].startswith("sendspin: music no longer paused (turn:"), cues
    [out] = heard(player, tmp_path / "out")  # one segment: the timeline ran on through the pause
    level = np.sqrt(np.mean(out.samples[: len(out.samples) // 2400 * 2400].reshape(-1, 2400) ** 2, axis=1))
    loud = level > 0.3  # 50 ms windows at the tone's full level (0.354)
    quiet = np.nonzero(~loud)[0]
    assert loud[:10].all() and loud[-20:-10].all()  # music before the wake word and after the turn
    pause_s = len(quiet[(quiet > 10) & (quiet < len(loud) - 20)]) * 0.05
    print(f"wake word: the music paused for {pause_s:.2f} s")
    assert pause_s > 0.5
