"""packaging/broker on a real mosquitto: the fleet settings load, and the ACL lets a device read only its
own, its group's and the broadcast topics and write only its own status topics."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.mqtt.localbroker import LocalBroker, find_mosquitto
from edge_agent.mqtt.topics import Topics
from tests.conftest import REPO
from tests.mqtt_support import wait_until

BROKER = REPO / "packaging" / "broker"
USERS = {"kitchen": "pw-kitchen", "bedroom": "pw-bedroom", "automation": "pw-auto",
         "fleet-operator": "pw-operator"}
LOCAL_LINES = ("listener", "cafile", "certfile", "keyfile", "password_file", "acl_file",
               "persistence_location", "log_dest", "persistence_file", "persistence ", "allow_anonymous")
"""Lines of the shipped mosquitto.conf that name this machine's files and ports: the test supplies its own."""

pytestmark = pytest.mark.skipif(find_mosquitto() is None or shutil.which("mosquitto_passwd") is None,
                                reason="mosquitto is not installed")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    work = tmp_path_factory.mktemp("acl-broker")
    passwd = work / "passwd"
    passwd.touch()
    for user, password in USERS.items():
        subprocess.run(["mosquitto_passwd", "-b", str(passwd), user, password], check=True, timeout=30)
    shipped = [line for line in (BROKER / "mosquitto.conf").read_text().splitlines()
               if line.strip() and not line.startswith("#") and not line.startswith(LOCAL_LINES)]
    extra = "\n".join([*shipped, f"password_file {passwd}", f"acl_file {BROKER / 'mosquitto.acl'}"])
    with LocalBroker(work, allow_anonymous=False, extra=extra) as running:
        yield running


class Client:
    """A real MQTT v5 client that records SUBACK / PUBACK reason codes and what it receives."""

    def __init__(self, broker: LocalBroker, user: str, password: str | None = None) -> None:
        self.received: list[str] = []
        self.granted: dict[int, list[int]] = {}
        self.acked: dict[int, int] = {}
        self.connect_rc: int | None = None
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"test-{user}", protocol=mqtt.MQTTv5)
        self.client.username_pw_set(user, USERS.get(user) if password is None else password)
        self.client.on_connect = lambda c, u, f, rc, p: setattr(self, "connect_rc", rc.value)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda c, u, mid, rcs, p: self.granted.__setitem__(
            mid, [r.value for r in rcs])
        self.client.on_publish = lambda c, u, mid, rc, p: self.acked.__setitem__(mid, rc.value)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 0
        self.client.connect("127.0.0.1", broker.port, keepalive=10, properties=props)
        self.client.loop_start()
        wait_until(lambda: self.connect_rc is not None, 30, f"CONNACK for {user}")

    def _on_message(self, client, userdata, msg) -> None:
        with self._lock:
            self.received.append(msg.topic)

    def subscribe(self, topic: str) -> int:
        """The SUBACK reason code: the granted QoS, or >= 0x80 when refused."""
        _rc, mid = self.client.subscribe(topic, qos=1)
        return wait_until(lambda: self.granted.get(mid), 30, f"SUBACK for {topic}")[0]

    def publish(self, topic: str, payload: bytes = b"{}", retain: bool = False) -> int:
        """The PUBACK reason code: below 0x80 accepted (0, or 0x10: no subscriber), 0x87 not authorized."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        return wait_until(lambda: self.acked.get(info.mid, None) is not None and (self.acked[info.mid],),
                          30, f"PUBACK for {topic}")[0]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_the_shipped_fleet_settings_run_on_real_mosquitto(broker):
    log = Path(broker.log_path).read_text()
    assert "Error" not in log and broker.running


def test_logins_need_a_known_user_and_its_password(broker):
    clients = [Client(broker, "kitchen"), Client(broker, "bedroom", password="wrong"),
               Client(broker, "stranger", password="x")]
    try:
        assert [c.connect_rc for c in clients] == [0, 0x87, 0x87]  # mosquitto 2.0 answers "not authorized"
    finally:
        for client in clients:
            client.close()


def test_a_device_reads_only_its_own_its_groups_and_broadcast_topics(broker):
    kitchen = Client(broker, "kitchen")
    automation, operator = Client(broker, "automation"), Client(broker, "fleet-operator")
    try:
        mine = Topics("edge", "kitchen", "downstairs")
        # The daemon's own subscription layout is granted, topic by topic.
        assert [kitchen.subscribe(t) for t in mine.subscriptions()] == [1] * 6
        # Mosquitto 2.0 grants any subscription and checks read access per message delivered:
        # subscribing to another device's topics or to wildcards over everyone's brings nothing.
        for topic in ("edge/bedroom/announce", "edge/group/upstairs/announce", "edge/#", "edge/+/config"):
            kitchen.subscribe(topic)
        for topic in ("edge/kitchen/announce", "edge/group/downstairs/announce", "edge/all/announce",
                      "edge/bedroom/announce", "edge/group/upstairs/announce"):
            assert automation.publish(topic) < 0x80, topic
        for topic in ("edge/kitchen/config", "edge/group/downstairs/config", "edge/all/config",
                      "edge/bedroom/config"):
            assert operator.publish(topic, retain=True) < 0x80, topic
        # The operator's own marker, published last on a topic the kitchen may read, bounds the wait.
        assert operator.publish("edge/kitchen/config", b"{\"last\": true}", retain=True) < 0x80
        wait_until(lambda: kitchen.received.count("edge/kitchen/config") >= 2, 30, "the kitchen's messages")
        # Each once per matching subscription (its own and the wildcards), never a foreign topic.
        assert set(kitchen.received) == set(mine.subscriptions())
    finally:
        for client in (kitchen, automation, operator):
            client.close()


def test_a_device_writes_only_its_own_status_topics(broker):
    kitchen, operator = Client(broker, "kitchen"), Client(broker, "fleet-operator")
    try:
        assert operator.subscribe("edge/+/status") == 1
        mine = Topics("edge", "kitchen", "downstairs")
        for topic in (mine.status, mine.announce_status, mine.config_status, mine.transcript, mine.metrics):
            assert kitchen.publish(topic) < 0x80, topic
        for topic in ("edge/bedroom/status", "edge/kitchen/announce", "edge/all/announce", "edge/all/config",
                      "edge/group/downstairs/config"):
            assert kitchen.publish(topic) == 0x87, topic
        wait_until(lambda: "edge/kitchen/status" in operator.received, 30, "the kitchen's status")
        assert "edge/bedroom/status" not in operator.received
    finally:
        kitchen.close()
        operator.close()


def test_producers_cannot_push_config_and_the_operator_cannot_announce(broker):
    automation, operator = Client(broker, "automation"), Client(broker, "fleet-operator")
    try:
        assert automation.publish("edge/all/config") == 0x87
        assert operator.publish("edge/all/announce") == 0x87
    finally:
        automation.close()
        operator.close()
