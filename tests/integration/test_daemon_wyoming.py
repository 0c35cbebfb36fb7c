"""`edge-agent run` with `wyoming.enabled`: the server runs on the daemon's loop with the daemon's voice."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize

from edge_agent.audio.wav import from_pcm16
from edge_agent.daemon import Daemon, SettingsSource
from tests.mqtt_support import ToneSynth, device_config, wait_until


def test_the_daemon_serves_wyoming_with_its_own_synthesizer_and_stops_it(tmp_path, broker) -> None:
    config = device_config(tmp_path / "device.yaml", tmp_path)
    synth = ToneSynth(rate=22050)
    source = SettingsSource(config, {"mqtt.broker": broker.url, "device.id": "dev1",
                                     "daemon.out_dir": str(tmp_path / "out"), "wyoming.enabled": True,
                                     "wyoming.uri": "tcp://127.0.0.1:0", "wyoming.zeroconf": False,
                                     "wyoming.services_uri": "tcp://127.0.0.1:0"})
    daemon = Daemon(source, synthesizer_factory=lambda s: synth, listener_factory=lambda s, accept_wake: None)
    thread = threading.Thread(target=lambda: asyncio.run(daemon.run()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: daemon.wyoming is not None and daemon.wyoming.address, what="wyoming server")
        assert daemon.wyoming is not None and daemon.wyoming.services_address is not None
        _, port = daemon.wyoming.services_address  # the satellite (on by default) has wyoming.uri

        async def go() -> tuple[Info, bytes]:
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Describe().event())
                info = await asyncio.wait_for(client.read_event(), 5)
                await client.write_event(Synthesize(text="One. Two.").event())
                pcm = b""
                while (event := await asyncio.wait_for(client.read_event(), 10)) is not None:
                    if AudioChunk.is_type(event.type):
                        pcm += AudioChunk.from_event(event).audio
                    if event.type == "audio-stop":
                        break
                assert info is not None
                return Info.from_event(info), pcm

        info, pcm = asyncio.run(go())
        assert info.tts and not info.asr  # no Whisper export in this cache: no ASR offered
        levels = np.unique(np.round(from_pcm16(pcm), 2))
        assert list(levels) == [0.1, 0.2]  # ToneSynth's two sentences: the daemon's synthesizer spoke
        assert synth.calls[-1] == "One. Two."
    finally:
        daemon.stop()
        thread.join(30)
    assert not thread.is_alive()
