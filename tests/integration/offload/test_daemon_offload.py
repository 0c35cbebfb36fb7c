"""The daemon speaking through the offload router: a real synthesis server on loopback."""

import asyncio
import threading

from edge_agent.daemon import Daemon, SettingsSource
from tests.integration.offload.offload_helpers import PSK
from tests.mqtt_support import Producer, Watcher, device_config, wait_until


def test_announcements_report_the_remote_engine_and_fall_back_to_local(tmp_path, broker, serve,
                                                                       monkeypatch):
    server = serve()
    monkeypatch.setenv("EDGE_OFFLOAD_PSK", PSK.decode())
    offload = {"server": server.uri, "policy": "auto", "voice": "en_US-joe-medium"}
    config = device_config(tmp_path / "device.yaml", tmp_path, offload=offload)
    source = SettingsSource(config, {"mqtt.broker": broker.url, "device.id": "dev1",
                                     "daemon.out_dir": str(tmp_path / "out")})
    daemon = Daemon(source)  # the default synthesizer: the offload router
    runner = threading.Thread(target=lambda: asyncio.run(daemon.run()), daemon=True)
    runner.start()
    watcher = Watcher(broker.url)
    producer = Producer(broker.url)
    try:
        wait_until(lambda: daemon.bridge is not None and daemon.bridge.connected, what="connect")
        assert daemon.synth.pool.wait_ready(30)  # the router's connection to the server
        producer.publish("edge/dev1/announce", {"id": "r1", "text": "Spoken by the server. Twice over."})
        done = watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "r1" and d["state"] == "done")
        assert done[0]["engine"] == "remote"
        assert (tmp_path / "out" / "r1.wav").stat().st_size > 20_000
        server.stop()
        producer.publish("edge/dev1/announce", {"id": "l1", "text": "The server is gone."})
        done = watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "l1" and d["state"] == "done")
        assert done[0]["engine"] == "local"
    finally:
        producer.close()
        watcher.close()
        daemon.stop()
        runner.join(30)
