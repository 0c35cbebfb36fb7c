"""Signed fleet config through a running daemon and a real broker."""

import signal

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_agent.faults import CRASH_ENV
from tests.mqtt_support import DaemonProcess, Producer, Watcher, device_config, signed

pytestmark = pytest.mark.slow

CONFIG = "edge/dev1/config"
STATUS = "edge/dev1/config/status"


@pytest.fixture
def setup(tmp_path, broker):
    config = device_config(tmp_path / "device.yaml", tmp_path)
    daemon = DaemonProcess(tmp_path, broker.url, config=config)
    watcher = Watcher(broker.url, client_id="fleet-watcher")
    producer = Producer(broker.url)
    yield daemon, watcher, producer
    producer.close()
    watcher.close()
    daemon.close()


def queued_priority(watcher, producer, ann_id):
    producer.publish("edge/dev1/announce", {"id": ann_id, "text": "Check."})
    return watcher.wait("edge/dev1/announce/status",
                        lambda d: d["id"] == ann_id and d["state"] == "queued")[0]["priority"]


def test_a_signed_config_applies_and_every_bad_one_leaves_it_active(setup):
    daemon, watcher, producer = setup
    daemon.start().wait_running()
    producer.publish(CONFIG, signed(5, {"announcements": {"default_priority": 2}}), retain=True)
    watcher.wait(STATUS, lambda d: d["version"] == 5 and d["state"] == "applied")
    watcher.wait("edge/dev1/status", lambda d: d["config_version"] == 5)
    assert queued_priority(watcher, producer, "p1") == 2

    bomb = b'a: &a ["x","x","x","x","x","x","x","x"]\n' + b"".join(
        f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n".encode()
        for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    bad = [
        (CONFIG, signed(6, {"announcements": {"default_priority": 9}}, key=Ed25519PrivateKey.generate())),
        (CONFIG, signed(4, {"announcements": {"default_priority": 9}})),
        ("edge/group/default/config", signed(7, {"announcements": {"default_priority": 9}},
                                              target="device:other")),
        (CONFIG, signed(8, {"announcements": {"default_priority": 9}}, expires_at=1000)),
        (CONFIG, signed(9, {"device": {"id": "stolen"}})),
        (CONFIG, bomb),
        (CONFIG, b"x:" + b" [" * 100 + b"]" * 100),
        (CONFIG, b"a: " + b"x" * (10 * 1024 * 1024)),
    ]
    for topic, payload in bad:
        producer.publish(topic, payload, retain=True)
    rejected = watcher.wait(STATUS, lambda d: d["state"] == "rejected", count=len(bad))
    reasons = " | ".join(d["error"] for d in rejected)
    for expected in ("bad signature", "replay", "is not this device", "expired", "protected key",
                     "expands to more than", "deeper", "limit is 262144"):
        assert expected in reasons
    assert all(d["active_version"] == 5 for d in rejected)
    assert queued_priority(watcher, producer, "p2") == 2
    assert daemon.alive


def test_a_kill_while_applying_resumes_or_rolls_back_after_restart(setup):
    daemon, watcher, producer = setup
    daemon.start(extra_env={CRASH_ENV: "fleet:version:renamed"}).wait_running()
    producer.publish(CONFIG, signed(10, {"announcements": {"default_priority": 3}}), retain=True)
    assert daemon.wait_exit() == -signal.SIGKILL
    daemon.start().wait_running()  # the payload waited in the inbox: the apply completes now
    watcher.wait(STATUS, lambda d: d["version"] == 10 and d["state"] == "applied")
    assert queued_priority(watcher, producer, "q1") == 3
    daemon.terminate()

    daemon.start(extra_env={CRASH_ENV: "fleet:health-checked"}).wait_running()
    producer.publish(CONFIG, signed(11, {"announcements": {"default_priority": 7}}), retain=True)
    assert daemon.wait_exit() == -signal.SIGKILL
    daemon.start().wait_running()  # it died on trial: the previous config comes back
    report = watcher.wait(STATUS, lambda d: d["version"] == 11 and d["state"] != "applied")
    assert report[0]["state"] in ("rolled_back", "rejected")
    watcher.wait(STATUS, lambda d: d["version"] == 11 and d["state"] == "rolled_back")
    assert queued_priority(watcher, producer, "q2") == 3
    watcher.wait("edge/dev1/status", lambda d: d["state"] == "online" and d["config_version"] == 10)
