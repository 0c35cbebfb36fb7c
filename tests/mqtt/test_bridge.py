import itertools
import os
import socket
import subprocess
import sys
import threading

from edge_agent.config import MqttSettings
from edge_agent.mqtt.bridge import Bridge, Message, first_reconnect_delay, reconnect_delay
from edge_agent.mqtt.localbroker import LocalBroker, free_port
from tests.mqtt_support import Producer, Watcher, wait_until


class Inbox:
    def __init__(self, accept=lambda n: True):
        self.items = []
        self.lock = threading.Lock()
        self.accept = accept

    def __call__(self, topic, payload, retained):
        with self.lock:
            self.items.append((topic, payload))
            return self.accept(len(self.items))

    def payloads(self):
        with self.lock:
            return [p for _, p in self.items]


def make_bridge(url, inbox, client_id="dev", topics=("edge/dev/announce",), **settings):
    s = MqttSettings(broker=url, reconnect_min_s=0.05, reconnect_max_s=0.5, **settings)
    bridge = Bridge(s, client_id, will=Message("edge/dev/status", b'{"state":"offline"}', 1, True),
                    on_message=inbox)
    bridge.set_subscriptions(topics)
    bridge.start()
    assert bridge.wait_connected(30)
    if topics:  # a message published before the broker holds the subscription is not ours
        assert bridge.wait_subscribed(30)
    return bridge


def test_tcp_nodelay_is_set_on_the_broker_socket(broker):
    bridge = make_bridge(broker.url, Inbox())
    try:
        sock = bridge._client.socket()
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        bridge.stop()


def test_messages_published_while_the_client_is_away_arrive_when_it_returns(broker):
    inbox = Inbox()
    bridge = make_bridge(broker.url, inbox)
    bridge.stop()
    producer = Producer(broker.url)
    for i in range(5):
        producer.publish("edge/dev/announce", f"m{i}".encode())
    producer.close()
    bridge = make_bridge(broker.url, inbox)
    try:
        wait_until(lambda: len(inbox.payloads()) == 5, what="queued messages")
        assert inbox.payloads() == [f"m{i}".encode() for i in range(5)]
    finally:
        bridge.stop()


def test_a_message_not_acknowledged_by_the_handler_is_delivered_again(broker):
    inbox = Inbox(accept=lambda n: n > 1)  # the first delivery "fails to persist"
    bridge = make_bridge(broker.url, inbox)
    try:
        Producer(broker.url).publish("edge/dev/announce", b"important")
        wait_until(lambda: len(inbox.payloads()) >= 2, what="redelivery")
        assert set(inbox.payloads()) == {b"important"}
    finally:
        bridge.stop()


def test_a_handler_that_keeps_refusing_is_retried_with_growing_delays_not_in_a_loop(broker):
    """A full disk: every delivery refused. Each drop waits its back-off before reconnecting,
    and what the device says meanwhile (its status) still reaches the broker."""
    import time as _time

    calls: list[float] = []
    bridge_box: list[Bridge] = []

    def refuse_four(n):
        calls.append(_time.monotonic())
        bridge_box[0].publish(Message("edge/dev/status", f'{{"refused": {n}}}'.encode(), 1))
        return n > 4

    inbox = Inbox(accept=refuse_four)
    watcher = Watcher(broker.url, "edge/dev/status")
    s = MqttSettings(broker=broker.url, reconnect_min_s=0.2, reconnect_max_s=0.8)
    bridge = Bridge(s, "dev", will=Message("edge/dev/will", b"x", 1, False), on_message=inbox)
    bridge_box.append(bridge)
    bridge.set_subscriptions(["edge/dev/announce"])
    bridge.start()
    try:
        assert bridge.wait_connected(30) and bridge.wait_subscribed(30)
        Producer(broker.url).publish("edge/dev/announce", b"important")
        wait_until(lambda: len(calls) >= 5, what="four refusals and the accepted redelivery")
        gaps = [b - a for a, b in itertools.pairwise(calls)]
        assert all(gap >= 0.1 for gap in gaps[:4]), gaps  # at least half of reconnect_min_s
        assert sum(gaps[:4]) >= 0.1 + 0.2 + 0.4 + 0.4 - 0.05, gaps  # the delays grew
        watcher.wait("edge/dev/status", lambda d: d.get("refused") == 1)  # sent before the drop
        assert set(inbox.payloads()) == {b"important"}
        assert bridge.metrics.snapshot()["counters"]["mqtt_connects"] == 5
    finally:
        bridge.stop()
        watcher.close()


def test_outbound_messages_wait_for_the_broker_and_survive_its_restart(broker):
    bridge = make_bridge(broker.url, Inbox())
    watcher = Watcher(broker.url, "edge/dev/out", client_id="watcher")
    try:
        broker.save()  # it acknowledges a subscription before saving it
        broker.kill()
        wait_until(lambda: not bridge.connected, what="disconnect")
        for i in range(3):
            bridge.publish(Message("edge/dev/out", f"s{i}".encode()))
        broker.start()
        assert bridge.wait_connected(60)
        wait_until(lambda: len(watcher.messages) == 3, what="the queued messages")
        assert [m.payload for m in watcher.messages] == [b"s0", b"s1", b"s2"]
    finally:
        watcher.close()
        bridge.stop()


def test_the_will_marks_the_device_offline_when_the_connection_dies(broker, tmp_path):
    script = (
        "import os, signal, sys\n"
        "from edge_agent.config import MqttSettings\n"
        "from edge_agent.mqtt.bridge import Bridge, Message\n"
        f"b = Bridge(MqttSettings(broker={broker.url!r}), 'victim', "
        "will=Message('edge/victim/status', b'offline', 1, True), on_message=lambda *a: True)\n"
        "b.start(); assert b.wait_connected(30)\n"
        "b.publish(Message('edge/victim/status', b'online', 1, True))\n"
        "import time\n"
        "while len(b.outbox) or b._unacked: time.sleep(0.01)\n"
        "print('ready', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            check=False)
    assert "ready" in result.stdout
    watcher = Watcher(broker.url, "edge/victim/status")
    try:
        wait_until(lambda: any(m.payload == b"offline" and m.retain for m in watcher.messages),
                   what="the retained will")
    finally:
        watcher.close()


def test_reconnect_delays_grow_with_jitter_and_stay_within_bounds():
    bridge = Bridge(MqttSettings(broker="mqtt://127.0.0.1:9", reconnect_min_s=0.5, reconnect_max_s=8),
                    "x", will=Message("t", b""), on_message=lambda *a: True)
    delays = {}
    for attempt in (1, 2, 3, 4, 5, 10):
        bridge._attempts = attempt
        delays[attempt] = [bridge._backoff() for _ in range(200)]
    assert all(0.25 <= d <= 0.5 for d in delays[1])
    assert all(4 <= d <= 8 for d in delays[10])
    assert len({round(d, 6) for d in delays[10]}) > 100  # jittered, not lock-step
    assert max(delays[3]) <= 2.0 < min(delays[5]) * 2


def test_the_first_reconnect_after_a_lost_connection_is_jittered_too():
    import random

    s = MqttSettings(reconnect_min_s=0.5, reconnect_max_s=8)
    rng = random.Random(7)
    firsts = [first_reconnect_delay(s, rng) for _ in range(500)]
    # A fleet that lost its broker at one instant does not come back at one instant.
    assert all(0 <= d <= 0.5 for d in firsts) and max(firsts) - min(firsts) > 0.4
    assert all(0.25 <= reconnect_delay(s, 1, rng) <= 0.5 for _ in range(100))


def test_a_missing_broker_is_retried_until_it_appears(tmp_path):
    broker = LocalBroker(tmp_path / "late")
    broker.port = free_port()
    s = MqttSettings(broker=f"mqtt://127.0.0.1:{broker.port}", reconnect_min_s=0.05, reconnect_max_s=0.2)
    bridge = Bridge(s, "early", will=Message("t", b""), on_message=lambda *a: True)
    bridge.start()
    try:
        wait_until(lambda: bridge._attempts >= 3, what="retries")
        assert not bridge.connected
        broker.start()
        assert bridge.wait_connected(60)
    finally:
        bridge.stop()
        broker.kill()


def test_subscriptions_dropped_from_the_desired_set_are_removed(broker, tmp_path):
    inbox = Inbox()
    subs = tmp_path / "subs.json"
    s = MqttSettings(broker=broker.url)
    bridge = Bridge(s, "mover", will=Message("t", b""), on_message=inbox, subscriptions_file=subs)
    bridge.set_subscriptions(["edge/group/old/announce"])
    bridge.start()
    assert bridge.wait_connected(30)
    wait_until(subs.exists, what="subscriptions recorded")
    bridge.stop()
    # Restarted with another group: the old group's topic must not deliver any more.
    bridge = Bridge(s, "mover", will=Message("t", b""), on_message=inbox, subscriptions_file=subs)
    bridge.set_subscriptions(["edge/group/new/announce"])
    bridge.start()
    try:
        assert bridge.wait_connected(30)
        wait_until(lambda: "old" not in subs.read_text(), what="old subscription removed")
        producer = Producer(broker.url)
        producer.publish("edge/group/old/announce", b"stale")
        producer.publish("edge/group/new/announce", b"fresh")
        wait_until(lambda: b"fresh" in inbox.payloads(), what="new group message")
        assert b"stale" not in inbox.payloads()
    finally:
        bridge.stop()


def test_a_message_whose_handler_keeps_raising_is_dropped_after_its_attempts_and_the_rest_flows(
        broker, caplog):
    """Defence in depth: a handler that raises (a bug, a payload nobody foresaw) is not a full
    disk. The message is delivered again a bounded number of times, then acknowledged and
    dropped, counted and logged once; what was published after it is handled."""
    from edge_agent.mqtt import bridge as bridge_module

    def handler(n):
        if inbox.items[-1][1] == b"poison":
            raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")
        return True

    inbox = Inbox(accept=handler)
    bridge = make_bridge(broker.url, inbox)
    producer = Producer(broker.url)
    try:
        producer.publish("edge/dev/announce", b"poison")
        producer.publish("edge/dev/announce", b"next")
        wait_until(lambda: b"next" in inbox.payloads(), what="the message after the poison")
        counters = bridge.metrics.snapshot()["counters"]
        assert inbox.payloads().count(b"poison") == bridge_module._HANDLER_ATTEMPTS
        assert counters["mqtt_inbound_dropped"] == 1
        assert counters["mqtt_connects"] == bridge_module._HANDLER_ATTEMPTS  # one redelivery each
        producer.publish("edge/dev/announce", b"later")
        wait_until(lambda: b"later" in inbox.payloads(), what="a later message")
        assert inbox.payloads().count(b"poison") == bridge_module._HANDLER_ATTEMPTS  # never again
        lines = [r.getMessage() for r in caplog.records if r.name == "edge_agent.mqtt.bridge"]
        assert sum("inbound handler failed" in line for line in lines) == 1
        assert sum("dropped: its handler failed on 3 deliveries" in line for line in lines) == 1
    finally:
        producer.close()
        bridge.stop()


def test_with_a_tiny_byte_bound_every_drop_is_counted_and_the_log_says_how_many(
        broker, caplog, monkeypatch):
    """100 first statuses published while the broker is away overflow a 4 KiB outbox. None pushes
    out another id's (the first ones stay, the later ones are dropped as they come); what arrives
    once the broker is back plus the counter is all 100, and the warnings add up to the counter."""
    from edge_agent.mqtt import outbox as outbox_module

    monkeypatch.setattr(outbox_module, "LOG_EVERY_S", 0.2)
    watcher = Watcher(broker.url, "edge/dev/announce/status", client_id="watcher")
    broker.save()
    broker.kill()
    s = MqttSettings(broker=broker.url, reconnect_min_s=0.05, reconnect_max_s=0.5, outbound_max_bytes=4096)
    bridge = Bridge(s, "dev", will=Message("edge/dev/status", b"offline", 1, True), on_message=Inbox())
    ids = [f"a{i:03d}" for i in range(100)]
    try:
        bridge.start()
        with caplog.at_level("WARNING", logger="edge_agent.mqtt.outbox"):
            for ann_id in ids:
                bridge.publish(Message.json("edge/dev/announce/status", {"id": ann_id, "state": "rejected"},
                                            key=ann_id))
            dropped = bridge.outbox.dropped
            broker.start()
            assert bridge.wait_connected(60)
            wait_until(lambda: len(watcher.messages) == 100 - dropped, what="the statuses kept")

            def logged():
                lines = [r.getMessage() for r in caplog.records
                         if r.getMessage().startswith("outbound messages dropped: ")]
                return sum(int(line.split()[3]) for line in lines)

            wait_until(lambda: logged() == dropped, what="warnings that add up to the drops")
        assert 80 < dropped < 100 and bridge.outbox.dropped_final == dropped
        assert [m.json()["id"] for m in watcher.messages] == ids[:100 - dropped]
    finally:
        bridge.stop()
        watcher.close()


def test_the_send_window_is_the_brokers_receive_maximum(tmp_path):
    """A broker that takes 5 unacknowledged messages at a time (its CONNACK says so) is sent at
    most 5 at once (paho would send 20); everything still arrives, in order."""
    with LocalBroker(tmp_path / "small", persistence=False, extra="max_inflight_messages 5") as small:
        watcher = Watcher(small.url, "edge/dev/out")
        bridge = make_bridge(small.url, Inbox())
        try:
            assert bridge._window == 5
            for i in range(50):
                bridge.publish(Message("edge/dev/out", f"m{i}".encode()))
            wait_until(lambda: len(watcher.messages) == 50, what="all 50 messages")
            assert [m.payload for m in watcher.messages] == [f"m{i}".encode() for i in range(50)]
        finally:
            bridge.stop()
            watcher.close()


def test_messages_read_ahead_of_a_refused_one_are_left_for_the_redelivery_in_order(broker):
    """Messages read ahead wait unacknowledged: when one is refused (a full disk), those read after
    it are not handled on that connection; the redelivery brings them all, and each is accepted
    once, in the order published."""
    inbox = Inbox(accept=lambda n: n != 2)  # the second delivery is refused, once
    bridge = make_bridge(broker.url, inbox)
    producer = Producer(broker.url)
    try:
        infos = [producer.publish("edge/dev/announce", f"m{i}".encode(), wait=False) for i in range(5)]
        for info in infos:
            info.wait_for_publish(timeout=30)
        wait_until(lambda: len(inbox.payloads()) >= 6, what="the refused one and the rest redelivered")
        calls = inbox.payloads()
        accepted = [p for n, p in enumerate(calls, 1) if n != 2]
        assert calls[1] == b"m1" and accepted == [f"m{i}".encode() for i in range(5)]
    finally:
        producer.close()
        bridge.stop()


def test_a_flood_is_journaled_in_batches_and_each_acknowledged_only_after_its_fsync(broker, tmp_path):
    """Group commit with the real journal: announcements that waited in the broker while the device
    was away are read ahead and journaled a batch per write and fsync, and no acknowledgement
    leaves before the fsync that made its record durable."""
    from edge_agent.announce.journal import Journal
    from edge_agent.announce.pipeline import Announcer, Speaking
    from edge_agent.announce.playout import DirOpener
    from edge_agent.atomic import AppendFile
    from edge_agent.config import AnnouncementSettings
    from tests.mqtt_support import ToneSynth

    settings = AnnouncementSettings(state_dir=tmp_path / "state")
    journal_file = settings.state_dir / "journal.jsonl"
    disk = {"fsyncs": 0, "durable": 0, "acked": 0, "early": 0}
    """fsyncs of the journal, its records on disk at the last one, acknowledgements sent, and
    those sent while more had been acknowledged than were on disk."""

    def fsync(fd):
        os.fsync(fd)
        disk["fsyncs"] += 1
        disk["durable"] = journal_file.read_bytes().count(b"\n")  # one `accept` line per announcement

    journal = Journal(settings.state_dir, settings, open_file=lambda p: AppendFile(p, fsync=fsync))
    announcer = Announcer(Speaking(settings, ToneSynth(), DirOpener(tmp_path / "out"), frozenset()), journal)
    announcer.recover()  # not started: what is accepted stays queued
    make_bridge(broker.url, Inbox()).stop()  # the device's session and its subscription, then away
    n = 300
    producer = Producer(broker.url)
    infos = [producer.publish("edge/dev/announce", {"id": f"a{i}", "text": "Hi."}, wait=False)
             for i in range(n)]
    for info in infos:
        info.wait_for_publish(timeout=30)

    batches: list[int] = []

    def on_messages(batch):
        batches.append(len(batch))
        return announcer.submit_many([(payload, topic) for topic, payload, _ in batch])

    s = MqttSettings(broker=broker.url, reconnect_min_s=0.05, reconnect_max_s=0.5)
    bridge = Bridge(s, "dev", will=Message("edge/dev/status", b"{}", 1, True),
                    on_message=lambda topic, payload, retained: announcer.submit(payload, topic),
                    on_messages=on_messages)
    ack = bridge._client.ack

    def checked_ack(mid, qos):
        disk["acked"] += 1
        disk["early"] += disk["acked"] > disk["durable"]
        return ack(mid, qos)

    bridge._client.ack = checked_ack
    bridge.set_subscriptions(["edge/dev/announce"])
    bridge.start()
    try:
        wait_until(lambda: disk["acked"] >= n, what="every announcement acknowledged")
    finally:
        bridge.stop()
        producer.close()
    assert disk["early"] == 0
    assert len(announcer.queue) == n and disk["acked"] == n
    assert max(batches) > 1 and disk["fsyncs"] < n / 2, (disk, batches)  # fewer fsyncs than messages
