"""MQTT announcements: publish -> first audio sample at the sink, p50/p95, vs direct local synthesis.

The daemon runs in this process (its real MQTT session, journal, queue and local
voice; only the sink is a timing null sink), against a private mosquitto unless
`--broker` is given. Announcements are sent one at a time, each after the
previous one is done, so the figure is latency, not queueing. The reference is
the same voice asked directly for the same text (time to its first chunk), run
interleaved: the difference is what MQTT, validation, the journal and the queue cost.

`--burst N` measures acknowledgement instead: N announcements published at once
(on the announce topic, or as Hermes says with `--burst-topic hermes`), timed from
the first publish to each one's first status (`queued`, sent only once it is in the
journal, when the device acknowledges it), the speaker held meanwhile. `--fsync-delay-ms` makes every journal
fsync that much slower, as on an SD card, to show what the journal's group commit saves.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from benchmarks.report import emit, machine, percentile
from edge_agent.announce.message import Announcement
from edge_agent.atomic import AppendFile
from edge_agent.audio.frames import Samples
from edge_agent.audio.sinks import NullSink, Sink
from edge_agent.commands.context import Context
from edge_agent.config import parse_override, parse_uri
from edge_agent.daemon import Daemon, SettingsSource
from edge_agent.errors import UsageError
from edge_agent.mqtt.localbroker import LocalBroker
from edge_agent.parts import local_synthesizer

TEXTS = (
    "Dinner is ready.",
    "The front door is open. Please close it.",
    "The washing machine has finished.",
    "Someone is at the door.",
    "It is 7:30 pm and the oven is still on.",
)
GOAL_P95_S = 0.300


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=100, help="announcements to time")
    parser.add_argument("--broker", metavar="mqtt://HOST:PORT",
                        help="use this broker (default: start a private mosquitto)")
    parser.add_argument("--burst", type=int, default=0, metavar="N",
                        help="publish N announcements at once and time their acknowledgement (not latency)")
    parser.add_argument("--burst-topic", choices=("announce", "hermes"), default="announce",
                        help="where the burst is published: edge/<device>/announce or hermes/tts/say")
    parser.add_argument("--fsync-delay-ms", type=float, default=0.0, metavar="MS",
                        help="add this much to every journal fsync (slow storage, e.g. 20 for an SD card)")


class _TimingSink:
    """A null sink that notes when the first samples arrive."""

    def __init__(self, sample_rate: int, on_first: Any) -> None:
        self.inner = NullSink(sample_rate)
        self.sample_rate = sample_rate
        self.frames = 0
        self._on_first = on_first

    def write(self, samples: Samples) -> None:
        if self.frames == 0:
            self._on_first(time.perf_counter())
        self.inner.write(samples)
        self.frames += len(samples)

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()


class _TimingOpener:
    keeps_open = False

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.cond = threading.Condition()

    def open(self, ann: Announcement, sample_rate: int) -> Sink:
        def note(t: float) -> None:
            with self.cond:
                self.first.setdefault(ann.id, t)
                self.cond.notify_all()

        return _TimingSink(sample_rate, note)


def run(ctx: Context, args: argparse.Namespace) -> int:
    if args.count < 2:
        raise UsageError("--count must be at least 2")
    if args.burst < 0 or args.fsync_delay_ms < 0:
        raise UsageError("--burst and --fsync-delay-ms must not be negative")
    with tempfile.TemporaryDirectory(prefix="edge-bench-mqtt-") as tmp_name:
        tmp = Path(tmp_name)
        broker = None
        url = args.broker
        if url is None:
            # For a burst, without persistence: the private broker saves its database after every
            # change (for the fault tests), which alone held a burst to ~120 messages a second.
            broker = LocalBroker(tmp / "broker", persistence=not args.burst).start()
            url = broker.url
        try:
            parse_uri(url, ("mqtt",))
        except ValueError as exc:
            raise UsageError(f"--broker: {exc}") from None
        overrides: dict[str, Any] = dict(parse_override(item) for item in args.overrides)
        overrides |= {
            "mqtt.broker": url, "device.id": f"bench-{int(time.time())}",
            "announcements.state_dir": str(tmp / "announcements"), "fleet.state_dir": str(tmp / "fleet"),
            "daemon.metrics_s": 0, "daemon.listen": False, "daemon.out_dir": None,
        }
        if args.burst:
            overrides |= {"announcements.queue_max": max(args.burst, 1000),
                          "hermes.enabled": args.burst_topic == "hermes"}
        source = SettingsSource(Path(args.config) if args.config else None, overrides)
        load_before = os.getloadavg()[0]
        opener = _TimingOpener()
        journal = _SlowStorage(args.fsync_delay_ms / 1000)
        daemon = Daemon(source, opener_factory=lambda _s: opener, journal_file=journal.open)
        try:
            if args.burst:
                result, lines = _burst(daemon, journal, url, args.burst, args.burst_topic)
            else:
                reference = local_synthesizer(source.build())
                result, lines = _measure(daemon, opener, reference, url, args.count)
        finally:
            if broker is not None:
                broker.kill()
    load_after = os.getloadavg()[0]
    result["loadavg_1min"] = [round(load_before, 2), round(load_after, 2)]
    lines.append(f"machine load (1-min average) before/after: {load_before:.2f} / {load_after:.2f} "
                 f"on {os.cpu_count()} CPUs: absolute times are only comparable at similar load")
    result |= {"broker": "private mosquitto" if args.broker is None else args.broker,
               "voice": daemon.settings.tts.voice, "threads": daemon.settings.tts.threads,
               "machine": machine()}
    emit(result, lines, args.json)
    return 0


class _SlowStorage:
    """Opens the journal's file with every fsync `delay_s` slower (and counts them)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.fsyncs = 0

    def open(self, path: Path) -> AppendFile:
        return AppendFile(path, fsync=self._fsync)

    def _fsync(self, fd: int) -> None:
        self.fsyncs += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        os.fsync(fd)


class _FirstStatus:
    """Each announcement's first status, as the producer sees it."""

    def __init__(self, url: str, status_topic: str) -> None:
        ep = parse_uri(url, ("mqtt",))
        self.first: dict[str, float] = {}
        self.cond = threading.Condition()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_a: self.subscribed.set()
        self.client.connect(ep.host, ep.port, keepalive=30)
        self.client.loop_start()
        self.client.subscribe(status_topic, qos=1)

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        now = time.perf_counter()
        ann_id = str(json.loads(msg.payload).get("id"))
        with self.cond:
            self.first.setdefault(ann_id, now)
            self.cond.notify_all()

    def wait_all(self, ids: list[str], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: all(i in self.first for i in ids), timeout)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _burst(daemon: Any, journal: _SlowStorage, url: str, count: int,
           topic: str) -> tuple[dict[str, Any], list[str]]:
    runner = threading.Thread(target=lambda: asyncio.run(daemon.run()), name="daemon", daemon=True)
    runner.start()
    statuses = _FirstStatus(url, daemon.topics.announce_status)
    producer = _Producer(url, daemon.topics.announce_status)
    site = daemon.settings.hermes.site_id or daemon.device
    try:
        _wait(lambda: statuses.subscribed.is_set() and daemon.bridge is not None and daemon.bridge.connected
              and daemon.bridge.wait_subscribed(0.1) and daemon.announcements.running, 60,
              "the daemon to start")
        # Held (as for a conversation turn), the speaker speaks none of them: the figure is what
        # acknowledging costs, not synthesis competing for the CPU.
        daemon.announcements.hold()
        names = [f"burst-{i:05d}" for i in range(count)]
        ids = [f"hermes:{n}" for n in names] if topic == "hermes" else names
        fsyncs_before = journal.fsyncs
        start = time.perf_counter()
        for name, text in zip(names, itertools.cycle(TEXTS), strict=False):
            if topic == "hermes":
                say = {"id": name, "text": text, "siteId": site}
                producer.client.publish("hermes/tts/say", json.dumps(say), qos=1)
            else:
                producer.publish(daemon.topics.announce, name, text)
        published = time.perf_counter() - start
        if not statuses.wait_all(ids, 600):
            missing = sum(i not in statuses.first for i in ids)
            raise UsageError(f"{missing} announcements got no status in 600 s")
        fsyncs = journal.fsyncs - fsyncs_before
        delays = [statuses.first[i] - start for i in ids]
    finally:
        statuses.close()
        producer.close()
        daemon.stop()
        runner.join(30)
    last = max(delays)
    result = {"burst": count, "burst_topic": topic, "fsync_delay_ms": journal.delay_s * 1000,
              "published_s": published, "all_acknowledged_s": last,
              "p50_acknowledged_s": percentile(delays, 50),
              "per_second": count / last, "journal_fsyncs": fsyncs}
    lines = [
        f"burst of {count} announcements on {topic}, journal fsync +{journal.delay_s * 1000:g} ms:",
        f"  published in {published:.3f} s; every one acknowledged (queued status) after {last:.3f} s "
        f"(p50 {result['p50_acknowledged_s']:.3f} s), {count / last:.0f} a second",
        f"  journal fsyncs meanwhile: {fsyncs} (the speaker held: none of them spoken)",
    ]
    return result, lines


class _Producer:
    """Publishes announcements and follows their statuses."""

    def __init__(self, url: str, status_topic: str) -> None:
        ep = parse_uri(url, ("mqtt",))
        self.finished: set[str] = set()
        self.cond = threading.Condition()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.connect(ep.host, ep.port, keepalive=30)
        self.client.loop_start()
        self.client.subscribe(status_topic, qos=1)

    def _on_subscribe(self, *_args: Any) -> None:
        self.subscribed.set()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        doc = json.loads(msg.payload)
        if doc.get("state") in ("done", "failed", "rejected", "expired"):
            with self.cond:
                self.finished.add(str(doc.get("id")))
                self.cond.notify_all()

    def publish(self, topic: str, ann_id: str, text: str) -> None:
        self.client.publish(topic, json.dumps({"id": ann_id, "text": text}), qos=1)

    def wait_finished(self, ann_id: str, timeout: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: ann_id in self.finished, timeout)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _first_audio(opener: _TimingOpener, ann_id: str, timeout: float) -> float:
    with opener.cond:
        if not opener.cond.wait_for(lambda: ann_id in opener.first, timeout):
            raise UsageError(f"announcement {ann_id} produced no audio within {timeout:g} s")
        return opener.first[ann_id]


def _measure(daemon: Any, opener: _TimingOpener, reference: Any, url: str,
             count: int) -> tuple[dict[str, Any], list[str]]:
    runner = threading.Thread(target=lambda: asyncio.run(daemon.run()), name="daemon", daemon=True)
    runner.start()
    producer = _Producer(url, daemon.topics.announce_status)
    ours: list[float] = []
    direct: list[float] = []
    try:
        _wait(lambda: producer.subscribed.is_set() and daemon.bridge is not None
              and daemon.bridge.connected and daemon.announcements.running, 60, "the daemon to start")
        for i in range(count + 3):  # three warm-up rounds are not counted
            text = TEXTS[i % len(TEXTS)]
            ann_id = f"bench-{i}"
            t0 = time.perf_counter()
            producer.publish(daemon.topics.announce, ann_id, text)
            first = _first_audio(opener, ann_id, 60)
            producer.wait_finished(ann_id, 60)
            t1 = time.perf_counter()
            stream = iter(reference.stream(text))
            next(stream)
            t2 = time.perf_counter()
            for _ in stream:  # finish it: no leftover work may slow the next announcement
                pass
            if i >= 3:
                ours.append(first - t0)
                direct.append(t2 - t1)
    finally:
        producer.close()
        daemon.stop()
        runner.join(30)
    return _report(ours, direct, count)


def _report(ours: list[float], direct: list[float], count: int) -> tuple[dict[str, Any], list[str]]:
    p50, p95 = percentile(ours, 50), percentile(ours, 95)
    r50, r95 = percentile(direct, 50), percentile(direct, 95)
    result = {
        "count": count, "p50_s": p50, "p95_s": p95, "max_s": max(ours),
        "reference": "direct local synthesis, time to first chunk (same voice, same texts)",
        "reference_p50_s": r50, "reference_p95_s": r95,
        "overhead_p50_s": p50 - r50, "ratio": p50 / r50 if r50 else None,
        "goal_p95_s": GOAL_P95_S, "goal_met": p95 <= GOAL_P95_S,
    }
    lines = [
        f"MQTT publish -> first audio sample, {count} announcements, one at a time:",
        f"  ours:      p50 {p50 * 1000:6.1f} ms  p95 {p95 * 1000:6.1f} ms  max {max(ours) * 1000:6.1f} ms",
        f"  reference: p50 {r50 * 1000:6.1f} ms  p95 {r95 * 1000:6.1f} ms  (direct synthesis, first chunk)",
        f"  overhead p50 {(p50 - r50) * 1000:.1f} ms; ratio (ours/ref, p50) {result['ratio']:.3f}; "
        f"goal p95 <= {GOAL_P95_S * 1000:.0f} ms: {'met' if result['goal_met'] else 'NOT met'}",
    ]
    return result, lines


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise UsageError(f"timed out waiting for {what}")
        time.sleep(0.01)

