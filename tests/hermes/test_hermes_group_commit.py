"""Says and Home Assistant notifies read in one go share one journal write and fsync (group commit),
as announcements on the announce topics do; each is still acknowledged only once it is on disk,
spoken once and answered. Against the daemon on a real mosquitto, the journal on a real file."""

from __future__ import annotations

import collections
import json
import os
import signal
from pathlib import Path
from typing import Any, ClassVar

import pytest

from edge_agent.atomic import AppendFile
from edge_agent.faults import CRASH_ENV
from tests.daemon_support import MqttDaemon
from tests.mqtt_support import DaemonProcess, Producer, Watcher, wait_until

SAYS = 40
NOTIFIES = 10


class CountingFile(AppendFile):
    """The journal's real file, noting how many `accept` records each write carried."""

    accepts_per_write: ClassVar[list[int]] = []

    def __init__(self, path: Path) -> None:
        super().__init__(path, write=self._counting_write)

    @classmethod
    def _counting_write(cls, fd: int, data: memoryview) -> int:
        accepts = bytes(data).count(b'"op":"accept"')
        if accepts:
            cls.accepts_per_write.append(accepts)
        return os.write(fd, data)


def test_says_and_notifies_that_waited_in_the_broker_are_journaled_together_and_each_spoken_once(
        tmp_path: Path, broker: Any, everything: Watcher) -> None:
    _kitchen(tmp_path, broker).stop()  # its session now holds the subscriptions
    producer = Producer(broker.url)
    try:
        for i in range(SAYS):
            producer.publish("hermes/tts/say", {"text": "Hi.", "siteId": "kitchen", "id": f"say-{i:02d}"})
            if i % 4 == 0:  # another site's says in between are answered by nobody and break no run
                producer.publish("hermes/tts/say", {"text": "Hi.", "siteId": "garage", "id": f"g-{i:02d}"})
        for i in range(NOTIFIES):
            producer.publish("edge/dev1/ha/notify", {"id": f"ha-{i:02d}", "text": "Washer done."})
    finally:
        producer.close()
    CountingFile.accepts_per_write = []
    running = _kitchen(tmp_path, broker, journal_file=CountingFile)
    try:
        finished = everything.wait("hermes/tts/sayFinished", count=SAYS, timeout=60)
        everything.wait("edge/dev1/announce/status", lambda d: d["state"] == "done"
                        and str(d["id"]).startswith("ha-"), count=NOTIFIES, timeout=60)
    finally:
        running.stop()
    assert sorted(d["id"] for d in finished) == [f"say-{i:02d}" for i in range(SAYS)]
    writes = CountingFile.accepts_per_write
    assert sum(writes) == SAYS + NOTIFIES
    # One write (and fsync) per say before; now per batch read in one go (mosquitto hands over
    # about 20 at a time, its max_inflight_messages).
    assert len(writes) <= (SAYS + NOTIFIES) // 10, writes
    spoken = sorted(p.name for p in (tmp_path / "out").glob("*.wav"))
    assert spoken == sorted([f"hermes:say-{i:02d}.wav" for i in range(SAYS)]
                            + [f"ha-{i:02d}.wav" for i in range(NOTIFIES)])
    assert not [m for m in everything.messages if m.topic == "hermes/tts/sayFinished"
                and json.loads(m.payload)["id"].startswith("g-")]


@pytest.mark.slow
def test_a_crash_between_a_journaled_batch_of_says_and_its_acknowledgements_loses_and_repeats_nothing(
        tmp_path: Path, broker: Any, everything: Watcher) -> None:
    """`edge-agent run` killed at `journal:accepted`: says that waited in the broker are on disk in
    one write, none acknowledged. The broker delivers them all again, the journal answers those it
    has as duplicates, and each say is spoken once and answered with one `sayFinished`."""
    config = tmp_path / "hermes.yaml"
    config.write_text("hermes:\n  enabled: true\n  site_id: kitchen\nwake:\n  chime: false\n")
    daemon = DaemonProcess(tmp_path, broker.url, config=config)
    try:
        daemon.start().wait_running()
        everything.wait("edge/dev1/status", lambda d: d["state"] == "online")
        daemon.kill()
        says = [f"say-{i:02d}" for i in range(12)]
        producer = Producer(broker.url)
        try:
            for say in says:
                producer.publish("hermes/tts/say", {"text": "Hi.", "siteId": "kitchen", "id": say})
        finally:
            producer.close()
        daemon.start(extra_env={CRASH_ENV: "journal:accepted"})
        assert daemon.wait_exit() == -signal.SIGKILL
        (journal,) = (tmp_path / "state").rglob("journal.jsonl")
        records = [json.loads(line) for line in journal.read_text().splitlines()]
        batch = [r["a"]["id"] for r in records if r["op"] == "accept"]
        assert len(batch) > 1 and set(batch) <= {f"hermes:{s}" for s in says}  # one write, several says
        daemon.start()
        wait_until(lambda: {f"hermes:{s}" for s in says} <= set(daemon.spoken()), timeout=180,
                   what="every say spoken")
        finished = everything.wait("hermes/tts/sayFinished", count=len(says), timeout=30)
    finally:
        daemon.close()
    assert collections.Counter(daemon.spoken()) == collections.Counter(f"hermes:{s}" for s in says)
    assert sorted(d["id"] for d in finished) == says  # one each, the first delivery's


def _kitchen(tmp_path: Path, broker: Any, **daemon_kwargs: Any) -> MqttDaemon:
    """The device with Home Assistant discovery and Hermes for site kitchen, in this process."""
    return MqttDaemon(tmp_path, broker, {"mqtt.ha_discovery": True, "hermes.enabled": True,
                                         "hermes.site_id": "kitchen", "wake.chime": False},
                      per_sentence_s=0.01, **daemon_kwargs)
