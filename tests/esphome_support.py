"""Support for the ESPHome API tests: a daemon with the API on, Home Assistant's own client
library connected to it, and an HTTP server for the audio Home Assistant hands over as URLs."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aioesphomeapi import APIClient

from benchmarks.loopback import FileServer
from edge_agent.audio.wav import WavWriter
from edge_agent.daemon import Daemon, SettingsSource
from tests.mqtt_support import ToneSynth, device_config, wait_until


class MediaServer(FileServer):
    """Files under `root` on http://127.0.0.1:PORT/, as Home Assistant's TTS proxy serves them."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.root = root

    def tone(self, name: str, seconds: float = 0.5, rate: int = 22050) -> str:
        t = np.arange(int(seconds * rate)) / rate
        writer = WavWriter(self.root / name, rate)
        writer.write((0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32))
        writer.close()
        return self.url(name)

    def encoded(self, name: str, samples: np.ndarray, rate: int, kind: str) -> bytes:
        """`samples` (frames x channels, or mono) as a FLAC or MP3 file served as `name`: its bytes."""
        import soundfile

        soundfile.write(self.root / name, samples, rate, format=kind)
        return (self.root / name).read_bytes()


@pytest.fixture
def media(tmp_path: Path) -> Iterator[MediaServer]:
    root = tmp_path / "media"
    root.mkdir()
    server = MediaServer(root)
    yield server
    server.close()


def run_daemon(tmp_path: Path, broker: Any, overrides: dict[str, Any], **factories: Any) -> Iterator[Daemon]:
    config = device_config(tmp_path / "device.yaml", tmp_path)
    source = SettingsSource(config, {
        "mqtt.broker": broker.url, "device.id": "kitchen", "daemon.out_dir": str(tmp_path / "out"),
        "esphome.enabled": True, "esphome.host": "127.0.0.1", "esphome.port": 0, "esphome.zeroconf": False,
        "listen.mode": "off", **overrides})
    factories.setdefault("synthesizer_factory", lambda s: ToneSynth(rate=22050))
    daemon = Daemon(source, **factories)
    thread = threading.Thread(target=lambda: asyncio.run(daemon.run()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: daemon.esphome is not None, timeout=120, what="the ESPHome API")
        yield daemon
    finally:
        daemon.stop()
        thread.join(30)
    assert not thread.is_alive()


@pytest.fixture
def device(tmp_path: Path, broker: Any) -> Iterator[Daemon]:
    yield from run_daemon(tmp_path, broker, {})


def port_of(daemon: Daemon) -> int:
    assert daemon.esphome is not None
    return daemon.esphome.port


async def connected(daemon: Daemon, noise_psk: str | None = None) -> AsyncIterator[APIClient]:
    """Home Assistant's client, connected and logged in as Home Assistant does (encrypted with
    `noise_psk`)."""
    client = APIClient("127.0.0.1", port_of(daemon), password=None, client_info="Home Assistant test",
                       noise_psk=noise_psk)
    await asyncio.wait_for(client.connect(login=True), 10)
    try:
        yield client
    finally:
        await client.disconnect()
