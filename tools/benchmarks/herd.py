"""Many simulated devices on one thread: real paho MQTT v5 clients with the daemon's session layout.

A simulated device is what the broker sees of `edge-agent run`: the same client id
scheme (`edge-agent-<device id>`), a persistent session (`clean_start=False`, a
session expiry), the daemon's subscriptions (`Topics.subscriptions()`, QoS 1,
sent only when the session is new) and its reconnect policy
(`mqtt.bridge.first_reconnect_delay`, then `reconnect_delay`). Nothing else: no
voice, no journal. One thread drives every client through one selector (paho's
external-loop callbacks), so a thousand devices cost a thousand sockets, not a
thousand threads. Everything a device receives goes to `on_message` on that thread.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.config import MqttSettings
from edge_agent.mqtt.bridge import first_reconnect_delay, reconnect_delay
from edge_agent.mqtt.topics import Topics

log = logging.getLogger(__name__)

MISC_INTERVAL_S = 1.0
"""How often every client's keepalive and timeouts are serviced."""


@dataclass(eq=False)
class SimDevice:
    """One simulated device and what happened to it."""

    topics: Topics
    client: mqtt.Client
    connected: bool = False
    subscribed: bool = False
    streak: int = 0
    """Failed connection attempts in a row."""
    retry_at: float | None = None
    """Monotonic time of the next connection attempt, when one is scheduled."""
    connects: list[tuple[float, bool]] = field(default_factory=list)
    """(monotonic time, session present) of every accepted connection."""
    disconnects: int = 0

    @property
    def id(self) -> str:
        return self.topics.device


MessageHandler = Callable[[SimDevice, "mqtt.MQTTMessage", float], None]


class Herd:
    """`count` simulated devices of one group; `start`, wait on conditions, `stop`."""

    def __init__(self, host: str, port: int, count: int, *, settings: MqttSettings, group: str,
                 on_message: MessageHandler, id_prefix: str = "sim") -> None:
        self.host = host
        self.port = port
        self.settings = settings
        self.on_message = on_message
        self.devices = [self._make(Topics(settings.prefix, f"{id_prefix}-{i:04d}", group))
                        for i in range(count)]
        self.changed = threading.Condition()
        """Notified after every batch of network events: wait on it for a condition to hold."""
        self._selector = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, SimDevice]] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._requests: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="fleet-herd", daemon=True)

    def _make(self, topics: Topics) -> SimDevice:
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"edge-agent-{topics.device}",
                             protocol=mqtt.MQTTv5)
        device = SimDevice(topics, client)
        client.user_data_set(device)
        client.on_socket_open = self._socket_open
        client.on_socket_close = self._socket_close
        client.on_socket_register_write = self._register_write
        client.on_socket_unregister_write = self._unregister_write
        client.on_connect = self._connected
        client.on_disconnect = self._disconnected
        client.on_subscribe = self._subscribed
        client.on_message = self._message
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = self.settings.session_expiry_s
        client.connect_async(self.host, self.port, keepalive=self.settings.keepalive_s, clean_start=False,
                             properties=props)
        return device

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Schedule every device's first connection at once and start the thread."""
        now = time.monotonic()
        for device in self.devices:
            self._schedule(device, now)
        self._thread.start()

    def stop(self) -> None:
        def disconnect_all() -> None:
            for device in self.devices:
                if device.client.socket() is not None:
                    with contextlib.suppress(Exception):
                        device.client.disconnect()
                        device.client.loop_write()
            self._stop.set()

        if self._thread.is_alive():
            self.call(disconnect_all)
            self._thread.join(10)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def call(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the herd's thread (paho clients are touched by that thread only)."""
        self._requests.append(fn)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait, woken by network events, until `predicate()` holds; False after `timeout`."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.changed.wait(min(remaining, 0.5))
        return True

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        last_misc = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, device = heapq.heappop(self._timers)
                if device.retry_at is not None and device.retry_at <= now:
                    device.retry_at = None
                    self._connect(device)
            timeout = 0.2 if not self._timers else min(0.2, max(0.0, self._timers[0][0] - now))
            for key, mask in self._selector.select(timeout):
                if key.data is None:
                    self._serve_requests()
                    continue
                client = key.data.client
                if mask & selectors.EVENT_READ:
                    client.loop_read(max_packets=20)
                if mask & selectors.EVENT_WRITE and client.socket() is not None:
                    client.loop_write()
            if time.monotonic() - last_misc >= MISC_INTERVAL_S:
                last_misc = time.monotonic()
                for device in self.devices:
                    if device.client.socket() is not None:
                        device.client.loop_misc()
            with self.changed:
                self.changed.notify_all()

    def _serve_requests(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)
        while self._requests:
            self._requests.pop(0)()

    def _schedule(self, device: SimDevice, when: float) -> None:
        if device.retry_at is not None and device.retry_at <= when:
            return  # an earlier attempt is already due (paho may report one disconnect twice)
        device.retry_at = when
        heapq.heappush(self._timers, (when, next(self._seq), device))

    def _connect(self, device: SimDevice) -> None:
        try:
            device.client.reconnect()
        except (OSError, ValueError):
            self._failed(device)

    def _failed(self, device: SimDevice) -> None:
        device.streak += 1
        self._schedule(device, time.monotonic() + reconnect_delay(self.settings, device.streak))

    # -- paho callbacks (herd thread) ------------------------------------------------------------

    def _socket_open(self, client: mqtt.Client, device: SimDevice, sock: Any) -> None:
        # The daemon sets it too: small packets would otherwise wait out Nagle + delayed ACK.
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._selector.register(sock, selectors.EVENT_READ, device)

    def _socket_close(self, client: mqtt.Client, device: SimDevice, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def _register_write(self, client: mqtt.Client, device: SimDevice, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, device)

    def _unregister_write(self, client: mqtt.Client, device: SimDevice, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.modify(sock, selectors.EVENT_READ, device)

    def _connected(self, client: mqtt.Client, device: SimDevice, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            return  # the broker closes the socket; `_disconnected` schedules the retry
        device.connected = True
        device.streak = 0
        device.connects.append((time.monotonic(), bool(flags.session_present)))
        if flags.session_present and device.subscribed:
            return  # the broker kept the subscriptions, as it does for the daemon
        device.subscribed = False
        client.subscribe([(topic, 1) for topic in device.topics.subscriptions()])

    def _disconnected(self, client: mqtt.Client, device: SimDevice, flags: Any, reason: Any,
                      props: Any) -> None:
        if self._stop.is_set():
            return
        if device.connected:
            device.connected = False
            device.disconnects += 1
            self._schedule(device, time.monotonic() + first_reconnect_delay(self.settings))
        else:
            self._failed(device)

    def _subscribed(self, client: mqtt.Client, device: SimDevice, mid: int, reasons: Any, props: Any) -> None:
        device.subscribed = not any(getattr(r, "is_failure", False) for r in reasons)

    def _message(self, client: mqtt.Client, device: SimDevice, message: mqtt.MQTTMessage) -> None:
        self.on_message(device, message, time.monotonic())
