"""`edge-agent run` with `sendspin.enabled`: a real aiosendspin server plays music to the daemon's
player while announcements arrive over a real mosquitto; the music ducks and the volume is shared."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from tests.sendspin.sendspin_skip import require_sendspin

require_sendspin()

from edge_agent.daemon import Daemon, SettingsSource  # noqa: E402
from edge_agent.sendspin.player import SendspinPlayer  # noqa: E402
from tests.mqtt_support import (  # noqa: E402
    PacedOpener,
    Producer,
    ToneSynth,
    Watcher,
    device_config,
    wait_until,
)
from tests.sendspin.sendspin_support import Heard, MusicServer, rms_at, tone, until  # noqa: E402

FULL = 0.5 / 2 ** 0.5


def start_daemon(tmp_path: Path, broker: Any) -> tuple[Daemon, threading.Thread]:
    config = device_config(tmp_path / "device.yaml", tmp_path, daemon={"state_dir": str(tmp_path / "daemon")})
    source = SettingsSource(config, {
        "mqtt.broker": broker.url, "device.id": "dev1", "daemon.listen": False, "mqtt.ha_discovery": True,
        "daemon.out_dir": str(tmp_path / "out"), "sendspin.enabled": True, "sendspin.host": "127.0.0.1",
        "sendspin.port": 0, "sendspin.zeroconf": False, "sendspin.duck_level": 0.25})
    # Each sentence of an announcement is one second of a constant level: long enough to measure.
    daemon = Daemon(source, synthesizer_factory=lambda s: ToneSynth(per_sentence_s=1.0),
                    opener_factory=lambda s: PacedOpener(tmp_path / "spoken"))
    thread = threading.Thread(target=lambda: asyncio.run(daemon.run()), daemon=True)
    thread.start()
    wait_until(lambda: daemon.sendspin is not None and daemon.bridge is not None and daemon.bridge.connected,
               what="the daemon and its player")
    return daemon, thread


def test_an_announcement_over_music_ducks_it_and_the_volume_is_shared_with_home_assistant(tmp_path, broker):
    daemon, thread = start_daemon(tmp_path, broker)
    player = daemon.sendspin
    assert isinstance(player, SendspinPlayer)
    watcher = Watcher(broker.url)
    producer = Producer(broker.url)
    marks: dict[str, int] = {}
    try:
        async def scenario() -> None:
            music = MusicServer()
            try:
                client = await music.join(player)
                streaming = asyncio.create_task(music.stream([client], tone(5.0)))
                await until(lambda: player.playout.stats.audio_blocks > 25, 20, "half a second of music")
                producer.publish("edge/dev1/announce", {"id": "a1", "text": "One. Two."})
                await until(lambda: player.status()["ducked"], 20, "the music ducked")
                marks["duck"] = player.playout.clock_us()
                await until(lambda: not player.status()["ducked"], 20, "the music restored")
                marks["restore"] = player.playout.clock_us()
                await until(lambda: player.playout.clock_us() > marks["restore"] + 500_000, 20, "0.5 s more")
                marks["volume"] = player.playout.clock_us()
                producer.publish("edge/dev1/ha/volume/set", b"0.5")  # Home Assistant's slider
                role = client.roles_by_family("player")[0]
                await until(lambda: role.volume == 50, 20, "the server told the new volume")
                _, stream = await streaming
                stream.stop()
            finally:
                await music.close()

        asyncio.run(scenario())
        assert watcher.statuses("dev1", "a1")[-1] == "done"
        assert (tmp_path / "spoken" / "a1.wav").exists()  # the announcement's own output, unaffected
        status = watcher.wait("edge/dev1/status", lambda d: d.get("music", {}).get("state") == "playing")
        assert status[-1]["music"]["volume"] in (100, 50)
    finally:
        producer.close()
        watcher.close()
        daemon.stop()
        thread.join(60)
    assert not thread.is_alive(), "the daemon did not stop"
    segment = player.playout.stats.segments[0]
    from edge_agent.audio.wav import read_wav

    out = Heard(read_wav(tmp_path / "out" / f"{segment.name}.wav").samples, segment.start_us, segment.rate)
    spoken_s = (marks["restore"] - marks["duck"]) / 1e6
    before = rms_at(out, marks["duck"] - 250_000, 0.15)
    ducked = rms_at(out, marks["duck"] + 100_000, spoken_s - 0.2)
    after = rms_at(out, marks["restore"] + 100_000, 0.3)
    halved = rms_at(out, marks["volume"] + 400_000, 0.3)  # Home Assistant's 0.5, on Sendspin's curve
    print(f"daemon: announcement ducked the music for {spoken_s:.2f} s: {before:.4f} -> {ducked:.4f} "
          f"({ducked / before:.3f}) -> {after:.4f}; volume 0.5 from Home Assistant: {halved:.4f}")
    assert 1.5 < spoken_s < 4.0  # two one-second sentences
    assert abs(before - FULL) < 0.01 * FULL and abs(after - FULL) < 0.01 * FULL
    assert abs(ducked / before - 0.25) < 0.01
    assert abs(halved - FULL * 0.5 ** 1.5) < 0.01 * FULL
    assert daemon.volume() == 0.5 and player.gain() == 0.5 ** 1.5
