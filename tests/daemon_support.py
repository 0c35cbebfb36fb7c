"""`edge-agent run` in this process with the real listener (what it hears is configured), for tests
that feed it audio and watch what it publishes on a real mosquitto."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from edge_agent.daemon import Daemon, SettingsSource
from tests.mqtt_support import ToneSynth, device_config, wait_until


class HearingDaemon:
    """The daemon (device `dev1`) on a thread: the real hearing loop on the configured input with the
    exported Whisper at `whisper_dir` (none: not listening), announcements spoken by `ToneSynth`."""

    def __init__(self, tmp_path: Path, broker: Any, whisper_dir: Path | None,
                 overrides: dict[str, Any]) -> None:
        config = device_config(tmp_path / "device.yaml", tmp_path,
                               daemon={"state_dir": str(tmp_path / "daemon")})
        hearing = {"asr.model": str(whisper_dir)} if whisper_dir is not None else {"daemon.listen": False}
        source = SettingsSource(config, {"mqtt.broker": broker.url, "device.id": "dev1", **hearing,
                                         **overrides})
        self.daemon = Daemon(source, synthesizer_factory=lambda s: ToneSynth())
        self.thread = threading.Thread(target=lambda: asyncio.run(self.daemon.run()), daemon=True)
        self.thread.start()
        wait_until(lambda: self.daemon.bridge is not None and self.daemon.bridge.connected, what="connect")

    def stop(self) -> None:
        self.daemon.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the daemon did not stop"


class MqttDaemon:
    """`edge-agent run` in this process with a tone for a voice and no listener, connected and
    subscribed to a real mosquitto: for tests of what it answers on MQTT."""

    def __init__(self, tmp_path: Path, broker: Any, overrides: dict[str, Any] | None = None, *,
                 per_sentence_s: float | None = None, **daemon_kwargs: Any) -> None:
        config = device_config(tmp_path / "device.yaml", tmp_path)
        source = SettingsSource(config, {"mqtt.broker": broker.url, "device.id": "dev1",
                                         "daemon.out_dir": str(tmp_path / "out"),
                                         "mqtt.reconnect_max_s": 1.0, **(overrides or {})})
        tone = {} if per_sentence_s is None else {"per_sentence_s": per_sentence_s}
        self.daemon = Daemon(source, synthesizer_factory=lambda s: ToneSynth(**tone), **daemon_kwargs)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.daemon.run()), daemon=True)
        self.thread.start()
        wait_until(lambda: self.daemon.bridge is not None and self.daemon.bridge.connected
                   and self.daemon.bridge.wait_subscribed(0.1), what="connect and subscribe")

    def counters(self) -> dict[str, int]:
        return dict(self.daemon.metrics.snapshot()["counters"])

    def stop(self) -> None:
        self.daemon.stop()
        self.thread.join(30)
        assert not self.thread.is_alive()
