"""Measure a flood of announcements against the daemon (issue 21); prints one JSON object.

A private mosquitto, the daemon in this process with a tone voice that speaks nothing until the
end (so each id's only status is its first: `queued` or `rejected`), and a producer that
publishes N announcements (QoS 1) evenly over `--burst-s` seconds. Per id: the delay from its
publish to its first status on `edge/<device>/announce/status`; how many ids had none within
5 s and none at all by the end; statuses produced by the pipeline against those received, next
to the outbox's drop counter (with the voice held, every id has one status: nothing coalesces,
so produced - received is the real number of drops).

    PYTHONPATH=. python scripts/measure_flood.py [--n 2000] [--queue-max 1000] [--burst-s 1]
                                                [--set mqtt.outbound_max_bytes=4096]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edge_agent.daemon import Daemon, SettingsSource
from edge_agent.mqtt.localbroker import LocalBroker
from tests.mqtt_support import ToneSynth, device_config, wait_until


class HeldSynth(ToneSynth):
    """Speaks nothing until `gate` is set (the warm-up excepted)."""

    gate = threading.Event()

    def stream(self, text: str, voice: str | None = None) -> Any:
        if text != "Ready.":
            self.gate.wait(600)
        yield from super().stream(text, voice)


def client(port: int) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    c.connect("127.0.0.1", port)
    c.loop_start()
    wait_until(c.is_connected, what="a client connection")
    return c


class Statuses:
    """Each id's first status on the status topic, and how many statuses came in all."""

    def __init__(self, port: int) -> None:
        self.first: dict[str, float] = {}
        self.received = 0
        self.lock = threading.Lock()
        self.client = client(port)
        self.client.on_message = self._on_message
        self.client.subscribe("edge/dev1/announce/status", qos=1)

    def _on_message(self, c: Any, u: Any, m: mqtt.MQTTMessage) -> None:
        now = time.monotonic()
        doc = json.loads(m.payload)
        with self.lock:
            self.received += 1
            self.first.setdefault(doc["id"], now)

    def wait_all(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.first) >= n:
                    break
            time.sleep(0.05)
        time.sleep(1.0)  # what is still on its way


def flood(port: int, ids: list[str], burst_s: float) -> dict[str, float]:
    """Publish one announcement per id, evenly over `burst_s`; when each was published."""
    producer = client(port)
    sent: dict[str, float] = {}
    start = time.monotonic()
    for k, ann_id in enumerate(ids):
        while time.monotonic() < start + burst_s * k / len(ids):
            time.sleep(0.0005)
        sent[ann_id] = time.monotonic()
        producer.publish("edge/dev1/announce", json.dumps({"id": ann_id, "text": "Hi."}), qos=1)
    producer.loop_stop()
    return sent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--queue-max", type=int, default=1000)
    ap.add_argument("--burst-s", type=float, default=1.0)
    ap.add_argument("--settle-s", type=float, default=60.0, help="longest wait for the statuses")
    ap.add_argument("--set", action="append", default=[], help="a daemon setting, key=value")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flood-"))
    with LocalBroker(tmp / "broker", persistence=False) as broker:
        port = int(broker.url.rsplit(":", 1)[1])
        statuses = Statuses(port)
        overrides: dict[str, Any] = {"mqtt.broker": broker.url, "device.id": "dev1",
                                     "daemon.out_dir": str(tmp / "out"),
                                     "announcements.queue_max": args.queue_max}
        for item in args.set:
            key, value = item.split("=", 1)
            overrides[key] = json.loads(value) if value[:1].isdigit() else value
        daemon = Daemon(SettingsSource(device_config(tmp / "device.yaml", tmp), overrides),
                        synthesizer_factory=lambda s: HeldSynth(per_sentence_s=0.01))
        produced: list[dict[str, Any]] = []
        daemon.announcements.observe(produced.append)
        thread = threading.Thread(target=lambda: asyncio.run(daemon.run()), daemon=True)
        thread.start()
        wait_until(lambda: daemon.bridge is not None and daemon.bridge.wait_subscribed(0.1),
                   what="the daemon")
        ids = [f"flood-{i:04d}" for i in range(args.n)]
        start = time.monotonic()
        sent = flood(port, ids, args.burst_s)
        burst = time.monotonic() - start
        statuses.wait_all(args.n, args.settle_s)
        with statuses.lock:
            first = dict(statuses.first)
            received = statuses.received
        delays = sorted(first[i] - sent[i] for i in ids if i in first)
        late = sum(1 for i in ids if i not in first or first[i] - sent[i] > 5)
        assert daemon.bridge is not None
        print(json.dumps({
            "n": args.n, "burst_s": round(burst, 2),
            "queued": sum(d["state"] == "queued" for d in produced),
            "rejected": sum(d["state"] == "rejected" for d in produced),
            "ids_without_first_status_within_5s": late,
            "ids_without_any_status": sum(1 for i in ids if i not in first),
            "first_status_p50_s": round(delays[len(delays) // 2], 3) if delays else None,
            "first_status_max_s": round(delays[-1], 3) if delays else None,
            "statuses_produced": len(produced), "statuses_received": received,
            "statuses_lost": len(produced) - received, "outbox_dropped_counter": daemon.bridge.outbox.dropped,
        }))
        HeldSynth.gate.set()
        daemon.stop()
        thread.join(30)
        statuses.client.loop_stop()


if __name__ == "__main__":
    main()
