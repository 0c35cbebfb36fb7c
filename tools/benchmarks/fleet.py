"""A simulated fleet against a local mosquitto: group fan-out, a signed config to `all`, a broker restart.

The devices are real MQTT v5 clients with the daemon's session and subscription
layout and its reconnect policy (`benchmarks.herd`), all in this process;
the broker is a private mosquitto with persistence saved on every change (what
the README asks of a production broker). Three phases:

1. fan-out: a producer publishes announcements to the fleet's group, one after the
   other finishes; per device and announcement the delay from publish to delivery
   (p50/p95/max), and how many never arrived;
2. config: a signed envelope for `all`, retained; each device parses and verifies it
   with the fleet code and the trusted public key (delay to verified, p50/p95/max);
3. restart: the broker is saved and SIGKILLed, announcements are published while it
   is down (the producer's client queues them), it comes back on the same port; every
   device must resume its session (CONNACK session present) and get each announcement
   exactly once; reconnections are counted per `--bin-s` from the broker's launch, to show
   the jittered backoff spreading them. If the wait runs out, the report names the devices
   that did not come back and those missing an announcement.

Delivery times include this process handling every device on one thread, which a real
fleet (one CPU each) does not pay: the figures are an upper bound for the broker path.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from benchmarks.herd import Herd, SimDevice
from benchmarks.report import emit, machine, percentile
from edge_agent.commands.context import Context
from edge_agent.config import MqttSettings
from edge_agent.errors import UsageError
from edge_agent.fleet.envelope import FleetRejected, decode_payload, parse_envelope, sign, verify
from edge_agent.mqtt.localbroker import LocalBroker

GROUP = "fleet"
GOAL_FANOUT_P95_S = 1.0
MAX_CONFIG_BYTES = 65536
SAMPLE = 10
"""How many device ids an incomplete restart names (the counts cover the rest)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=int, default=1000, help="simulated devices (default 1000)")
    parser.add_argument("--announcements", type=int, default=5, help="group announcements to fan out")
    parser.add_argument("--while-down", type=int, default=3,
                        help="announcements published while the broker is down")
    parser.add_argument("--down-s", type=float, default=1.0, help="how long the broker stays down")
    parser.add_argument("--bin-s", type=float, default=0.5, help="width of the reconnection-rate bins")
    parser.add_argument("--timeout", type=float, default=180.0, help="bound on each phase's wait")


@dataclass
class Ledger:
    """What each device received: announcement id -> delivery times, config verdicts."""

    deliveries: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """device -> announcement id -> monotonic delivery times (more than one: a duplicate)."""
    configs: dict[str, tuple[float, bool, str]] = field(default_factory=dict)
    """device -> (monotonic time, verified, reason) of the last config it got."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def got(self, device: str, ann_id: str) -> int:
        return len(self.deliveries.get(device, {}).get(ann_id, ()))

    def everyone_has(self, devices: list[SimDevice], ann_ids: list[str]) -> bool:
        return all(self.got(d.id, a) for d in devices for a in ann_ids)


class Fleet:
    """The broker, the herd and a producer, for one bench run."""

    def __init__(self, workdir: Path, devices: int, settings: MqttSettings) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.broker = LocalBroker(workdir)
        self.settings = settings
        self.ledger = Ledger()
        self.key = Ed25519PrivateKey.generate()
        self.trusted = [self.key.public_key()]
        self.count = devices
        self.herd: Herd | None = None
        self.producer: mqtt.Client | None = None

    def start(self, timeout: float) -> float:
        """Broker, then every device connected and subscribed; returns the seconds that took."""
        self.broker.start()
        self.herd = Herd("127.0.0.1", self.broker.port, self.count, settings=self.settings, group=GROUP,
                         on_message=self._on_message)
        started = time.monotonic()
        self.herd.start()
        if not self.herd.wait(lambda: all(d.subscribed for d in self.devices), timeout):
            raise RuntimeError(f"{sum(d.subscribed for d in self.devices)} of {self.count} devices "
                               f"subscribed within {timeout:g} s")
        elapsed = time.monotonic() - started
        self.producer = _producer(self.broker.port, self.settings)
        return elapsed

    @property
    def devices(self) -> list[SimDevice]:
        assert self.herd is not None
        return self.herd.devices

    def close(self) -> None:
        if self.producer is not None:
            self.producer.disconnect()
            self.producer.loop_stop()
        if self.herd is not None:
            self.herd.stop()
        self.broker.kill()

    # -- on the herd's thread ----------------------------------------------------------------------

    def _on_message(self, device: SimDevice, message: mqtt.MQTTMessage, at: float) -> None:
        kind = device.topics.kind(message.topic)
        if kind == "announce":
            try:
                ann_id = str(json.loads(message.payload)["id"])
            except (ValueError, KeyError, TypeError):
                return
            with self.ledger.lock:
                self.ledger.deliveries.setdefault(device.id, {}).setdefault(ann_id, []).append(at)
        elif kind == "config":
            try:
                envelope = parse_envelope(decode_payload(bytes(message.payload), MAX_CONFIG_BYTES))
                verify(envelope, self.trusted)
                ok, reason = envelope.matches(device.id, GROUP), ""
            except FleetRejected as exc:
                ok, reason = False, str(exc)
            with self.ledger.lock:
                self.ledger.configs[device.id] = (time.monotonic(), ok, reason)

    # -- phases ---------------------------------------------------------------------------------------

    def _publish(self, topic: str, payload: dict[str, Any], retain: bool = False) -> float:
        assert self.producer is not None
        sent = time.monotonic()
        self.producer.publish(topic, json.dumps(payload), qos=1, retain=retain)
        return sent

    def _everyone_has(self, ann_ids: list[str]) -> Callable[[], bool]:
        return lambda: self.ledger.everyone_has(self.devices, ann_ids)

    def fan_out(self, count: int, timeout: float) -> dict[str, Any]:
        topic = f"{self.settings.prefix}/group/{GROUP}/announce"
        latencies: list[float] = []
        missing = 0
        for n in range(count):
            ann_id = f"fanout-{n}"
            assert self.herd is not None
            sent = self._publish(topic, {"id": ann_id, "text": "Dinner is ready.", "priority": 5})
            self.herd.wait(self._everyone_has([ann_id]), timeout)
            with self.ledger.lock:
                for device in self.devices:
                    times = self.ledger.deliveries.get(device.id, {}).get(ann_id, [])
                    if times:
                        latencies.append(times[0] - sent)
                    else:
                        missing += 1
        return {"deliveries": len(latencies), "lost": missing, **_spread(latencies)}

    def push_config(self, timeout: float) -> dict[str, Any]:
        body = {"version": int(time.time() * 1000), "target": "all", "issued_at": time.time(),
                "config": {"announcements": {"default_priority": 4}}}
        sent = self._publish(f"{self.settings.prefix}/all/config", sign(body, self.key), retain=True)
        assert self.herd is not None
        self.herd.wait(lambda: len(self.ledger.configs) >= self.count, timeout)
        with self.ledger.lock:
            verdicts = list(self.ledger.configs.values())
        verified = [t - sent for t, ok, _ in verdicts if ok]
        reasons = Counter(reason for _, ok, reason in verdicts if not ok)
        return {"verified": len(verified), "rejected": dict(reasons), "missing": self.count - len(verdicts),
                **_spread(verified)}

    def restart_broker(self, while_down: int, down_s: float, bin_s: float, timeout: float) -> dict[str, Any]:
        herd = self.herd
        assert herd is not None and self.producer is not None
        self.broker.save()
        self.broker.kill()
        killed = time.monotonic()
        herd.wait(lambda: not any(d.connected for d in self.devices), timeout)
        topic = f"{self.settings.prefix}/group/{GROUP}/announce"
        ids = [f"while-down-{n}" for n in range(while_down)]
        for ann_id in ids:  # queued by the producer's client until the broker is back
            self._publish(topic, {"id": ann_id, "text": "The broker was away.", "priority": 5})
        threading.Event().wait(max(0.0, down_s - (time.monotonic() - killed)))  # the outage itself
        # The restart is timed from the launch: mosquitto accepts connections before `start()`
        # has seen it ready, and a device connecting in between has reconnected all the same.
        launched = time.monotonic()
        self.broker.start()
        up = time.monotonic()

        def back(device: SimDevice) -> bool:
            return bool(device.connects) and device.connects[-1][0] > launched

        has_all = self._everyone_has(ids)
        done = herd.wait(lambda: all(d.connected and back(d) for d in self.devices) and has_all(), timeout)
        with self.ledger.lock:
            copies = {d.id: [self.ledger.got(d.id, a) for a in ids] for d in self.devices}
        reconnected = [d.connects[-1][0] - launched for d in self.devices if back(d)]
        resumed = sum(1 for d in self.devices if back(d) and d.connects[-1][1])
        bins = Counter(int(t // bin_s) for t in reconnected)
        rate = [bins.get(i, 0) for i in range(max(bins) + 1)] if bins else []
        absent = [d.id for d in self.devices if not (d.connected and back(d))]
        short = [device for device, counts in copies.items() if 0 in counts]
        flat = [c for counts in copies.values() for c in counts]
        return {
            "complete": done, "down_s": round(launched - killed, 3),
            "broker_start_s": round(up - launched, 3),
            "sessions_resumed": resumed, "reconnected": len(reconnected),
            "not_reconnected": len(absent), "not_reconnected_ids": absent[:SAMPLE],
            "missing_announcements": len(short), "missing_announcements_ids": short[:SAMPLE],
            "reconnect_s": _spread(reconnected),
            "connections_per_bin": rate, "bin_s": bin_s,
            "peak_connections_per_s": round(max(rate) / bin_s, 1) if rate else 0.0,
            "published_while_down": len(ids), "exactly_once": sum(1 for c in flat if c == 1),
            "lost": sum(1 for c in flat if c == 0), "duplicates": sum(c - 1 for c in flat if c > 1),
            "expected": len(flat),
        }


def _producer(port: int, settings: MqttSettings) -> mqtt.Client:
    """A well-behaved producer: persistent session, QoS 1, paho's queue while disconnected."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="fleet-bench-producer", protocol=mqtt.MQTTv5)
    client.reconnect_delay_set(1, 2)
    connected = threading.Event()
    client.on_connect = lambda c, u, f, r, p: connected.set()
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = settings.session_expiry_s
    client.connect("127.0.0.1", port, keepalive=settings.keepalive_s, clean_start=False, properties=props)
    client.loop_start()
    if not connected.wait(30):
        raise RuntimeError("the producer could not connect to the local broker")
    return client


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50_s": float("nan"), "p95_s": float("nan"), "max_s": float("nan")}
    return {"p50_s": round(percentile(values, 50), 4), "p95_s": round(percentile(values, 95), 4),
            "max_s": round(max(values), 4)}


@dataclass(frozen=True)
class Plan:
    """What one run does (the command-line options)."""

    devices: int = 1000
    announcements: int = 5
    while_down: int = 3
    down_s: float = 1.0
    bin_s: float = 0.5
    timeout: float = 180.0

    def __post_init__(self) -> None:
        if self.devices < 1 or self.announcements < 1 or self.while_down < 1:
            raise UsageError("--devices, --announcements and --while-down must be at least 1")
        if self.down_s < 0 or self.bin_s <= 0 or self.timeout <= 0:
            raise UsageError("--down-s must not be negative; --bin-s and --timeout must be positive")


def measure(plan: Plan, settings: MqttSettings | None = None) -> dict[str, Any]:
    """Run the three phases; the result is what `bench fleet --json` prints."""
    settings = settings or MqttSettings()
    devices, timeout = plan.devices, plan.timeout
    with tempfile.TemporaryDirectory(prefix="edge-fleet-") as tmp:
        fleet = Fleet(Path(tmp), devices, settings)
        try:
            connect_s = fleet.start(timeout)
            fan = fleet.fan_out(plan.announcements, timeout)
            config = fleet.push_config(timeout)
            restart = fleet.restart_broker(plan.while_down, plan.down_s, plan.bin_s, timeout)
        finally:
            fleet.close()
    return {
        "devices": devices, "connect_all_s": round(connect_s, 3), "fanout": fan, "config": config,
        "restart": restart, "reconnect_min_s": settings.reconnect_min_s,
        "reconnect_max_s": settings.reconnect_max_s,
        "goal_fanout_p95_s": GOAL_FANOUT_P95_S,
        "goals_met": bool(fan["lost"] == 0 and fan["p95_s"] <= GOAL_FANOUT_P95_S
                          and config["verified"] == devices and restart["complete"] and restart["lost"] == 0
                          and restart["duplicates"] == 0 and restart["sessions_resumed"] == devices),
    }


def run(ctx: Context, args: argparse.Namespace) -> int:
    import os

    load = os.getloadavg()[0]
    plan = Plan(args.devices, args.announcements, args.while_down, args.down_s, args.bin_s, args.timeout)
    result = measure(plan, ctx.settings.mqtt)
    result["machine"] = machine()
    result["load_1m_before"] = round(load, 2)
    fan, cfg, rs = result["fanout"], result["config"], result["restart"]
    lines = [
        f"fleet of {result['devices']} simulated devices (load {load:.2f}); all connected and subscribed "
        f"in {result['connect_all_s']:.2f} s",
        f"fan-out ({args.announcements} group announcements): p50 {fan['p50_s'] * 1000:.0f} ms, "
        f"p95 {fan['p95_s'] * 1000:.0f} ms, max {fan['max_s'] * 1000:.0f} ms, lost {fan['lost']} "
        f"(goal p95 <= {GOAL_FANOUT_P95_S:g} s, 0 lost)",
        f"config to all: {cfg['verified']} verified, rejected {cfg['rejected'] or 0}, "
        f"missing {cfg['missing']}; p50 {cfg['p50_s'] * 1000:.0f} ms, p95 {cfg['p95_s'] * 1000:.0f} ms, "
        f"max {cfg['max_s'] * 1000:.0f} ms",
        f"broker restart (down {rs['down_s']:.2f} s): {rs['sessions_resumed']}/{result['devices']} sessions "
        f"resumed; {rs['published_while_down']} announcements published while down: "
        f"{rs['exactly_once']}/{rs['expected']} delivered exactly once, lost {rs['lost']}, "
        f"duplicates {rs['duplicates']}",
        f"reconnections after the restart: p50 {rs['reconnect_s']['p50_s']:.2f} s, "
        f"p95 {rs['reconnect_s']['p95_s']:.2f} s, max {rs['reconnect_s']['max_s']:.2f} s; "
        f"per {rs['bin_s']:g} s: {rs['connections_per_bin']} (peak {rs['peak_connections_per_s']}/s)",
        *([] if rs["complete"] else [
            f"restart incomplete after {args.timeout:g} s: {rs['not_reconnected']} devices not reconnected "
            f"{rs['not_reconnected_ids']}, {rs['missing_announcements']} missing an announcement "
            f"{rs['missing_announcements_ids']}"]),
        f"goals met: {result['goals_met']}",
    ]
    emit(result, lines, args.json)
    return 0
