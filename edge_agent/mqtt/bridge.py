"""The broker connection: one network thread owns the paho client.

paho-mqtt is driven as an external event loop (`loop_read` / `loop_write` /
`loop_misc` around our own `select`), so that

- every paho call happens on one thread (publishing from several threads has
  deadlocked paho before), while other threads hand messages over through a
  bounded `Outbox` and wake the loop through a socket pair;
- reconnecting is ours: delays grow from `reconnect_min_s` to `reconnect_max_s`
  with random jitter (paho's own backoff has none, so a fleet would hammer a
  restarted broker in lock-step);
- inbound messages are read ahead of the handler (up to `_READ_AHEAD_BYTES`) and
  handled in order between reads, so the broker's acknowledgements of what we
  publish, which wait in the same TCP stream behind its messages to us, are seen
  at once and a flood of announcements does not hold up their statuses;
- an inbound QoS 1 message is acknowledged only after the handler has made it
  durable (`manual_ack`). With a batch handler (`on_messages`) the messages read ahead
  are handed over together, up to `_BATCH_MAX`, so the handler can make them durable
  with one write and one fsync (the announcement journal's group commit) and all of
  them are acknowledged after it; a handler that cannot persist it (a full disk) leaves
  it unacknowledged and the connection is dropped, so the broker delivers it
  again, after the same growing, jittered delay as a failed connect: a handler
  that keeps refusing costs a reconnect every `reconnect_max_s`, not a tight loop.
  A handler that *raises* is a bug or a payload nobody foresaw, not a full disk:
  such a message is retried the same way, but after `_HANDLER_ATTEMPTS` deliveries it
  is acknowledged and dropped (counted in `mqtt_inbound_dropped`, logged once), so
  one poison message cannot stop every message behind it.

The session is persistent (stable client id, `clean_start=False`, session expiry
> 0): announcements published while the device is down wait in the broker.

Three units share the work: `Session` holds the state and takes paho's callbacks,
`Bridge` runs the network loop that drives it, `InboundQueue` keeps the messages read
ahead and acknowledges them; what the session is subscribed to is `subscriptions.py`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import select
import socket
import ssl
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.endpoints import parse_uri
from edge_agent.errors import ConfigError
from edge_agent.metrics import Metrics
from edge_agent.mqtt.outbox import Message, Outbox
from edge_agent.mqtt.settings import MqttSettings
from edge_agent.mqtt.subscriptions import Subscriptions

__all__ = ["Bridge", "InboundHandler", "Message", "Outbox", "first_reconnect_delay", "read_password",
           "reconnect_delay", "tls_context"]
"""`Message` and `Outbox` live in `outbox`; adapters take `Message` from here, with the bridge."""

log = logging.getLogger(__name__)

InboundHandler = Callable[[str, bytes, bool], bool]
"""(topic, payload, retained) -> True once the message is safe to acknowledge."""
BatchHandler = Callable[[Sequence[tuple[str, bytes, bool]]], Sequence[bool]]
"""`InboundHandler` for several messages in order: one result per message it handled, stopping
after the first False (the messages after it are left unhandled: they come again)."""

_INFLIGHT = 20
"""QoS 1 messages handed to paho and not yet acknowledged by the broker."""

_HANDLER_ATTEMPTS = 3
"""Deliveries of one message whose handler raised before it is acknowledged and dropped."""

_FAILURES_REMEMBERED = 64
"""Messages whose handler raised, remembered (by topic and payload hash) to count attempts."""

_READ_AHEAD_BYTES = 1 << 20
"""Messages read but not yet handled (and not acknowledged) stop the reading at this many bytes."""

_READS_PER_STEP = 64
"""Most `loop_read` calls in one turn of the loop (each reads as many packets as paho has in flight)."""

_BATCH_MAX = 256
"""Messages handed to a batch handler at most at once (one journal fsync for them all)."""

_HANDLE_SLICE_S = 0.05
"""Messages read ahead are handled in slices this long, the socket served between them."""

_FLUSH_BEFORE_DROP_S = 1.0
"""Longest a connection dropped for a refused message stays up to send what is queued."""


def reconnect_delay(settings: MqttSettings, streak: int, rng: random.Random | None = None) -> float:
    """Delay before the next attempt after `streak` failed ones: exponential growth from
    `reconnect_min_s` to `reconnect_max_s`, jitter in its upper half."""
    cap = min(settings.reconnect_max_s, settings.reconnect_min_s * 2 ** min(max(streak, 1) - 1, 20))
    return (rng or _RNG).uniform(cap / 2, cap)


def first_reconnect_delay(settings: MqttSettings, rng: random.Random | None = None) -> float:
    """Delay before the first attempt after a lost connection: anywhere in [0, reconnect_min_s]."""
    return (rng or _RNG).uniform(0.0, settings.reconnect_min_s)


_RNG = random.Random()


@dataclass(frozen=True)
class _Inbound:
    """A message read and not yet handled."""

    topic: str
    payload: bytes
    retain: bool
    mid: int
    qos: int

    @property
    def cost(self) -> int:
        return len(self.topic) + len(self.payload)


def _readable(sock: Any) -> bool:
    """Bytes wait on `sock` (for TLS, decrypted ones too)."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return bool(readable)


def read_password(settings: MqttSettings) -> str:
    if settings.password_file is None:
        return settings.password
    try:
        lines = settings.password_file.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"mqtt.password_file: cannot read {settings.password_file}: "
                          f"{exc.strerror}") from None
    if not lines or not lines[0]:
        raise ConfigError(f"mqtt.password_file: {settings.password_file} is empty")
    return lines[0]


def tls_context(settings: MqttSettings) -> ssl.SSLContext:
    """Certificate and host name checked; a client certificate when configured."""
    try:
        ctx = ssl.create_default_context(cafile=str(settings.tls_ca) if settings.tls_ca else None)
        if settings.tls_cert is not None:
            ctx.load_cert_chain(str(settings.tls_cert), str(settings.tls_key) if settings.tls_key else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"mqtt TLS files: {exc}") from None
    return ctx


class InboundQueue:
    """Messages read ahead of the handler, handled in order and acknowledged once it has made
    them durable (the module docstring says why). A refusal marks the connection to be dropped
    (`drop`) for their redelivery; a handler that raises has `_HANDLER_ATTEMPTS` deliveries of a
    message before the message is given up."""

    def __init__(self, on_message: InboundHandler, on_messages: BatchHandler | None,
                 ack: Callable[[int, int], None], metrics: Metrics) -> None:
        self.on_message = on_message
        self.on_messages = on_messages
        self.ack = ack
        self.metrics = metrics
        self.messages: deque[_Inbound] = deque()
        """Messages read and not yet handled (nor acknowledged), oldest first."""
        self.bytes = 0
        self.drop = False
        """A message was refused: the connection is to be dropped for its redelivery."""
        self.drop_by = 0.0
        self.refusals = 0
        """Messages the handler refused in a row; each drop waits longer before reconnecting."""
        self._failures: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        """(topic, payload hash) -> deliveries whose handler raised, the most recent last."""

    @property
    def full(self) -> bool:
        """Reading stops here until the handler catches up."""
        return self.bytes >= _READ_AHEAD_BYTES

    def add(self, message: _Inbound) -> None:
        self.messages.append(message)
        self.bytes += message.cost

    def handle_next(self) -> None:
        """Carry out the oldest message, or with a batch handler up to `_BATCH_MAX` of them."""
        if self.on_messages is not None:
            batch = [self.messages.popleft() for _ in range(min(_BATCH_MAX, len(self.messages)))]
            self.bytes -= sum(m.cost for m in batch)
            self.handle_batch(batch)
        else:
            message = self.messages.popleft()
            self.bytes -= message.cost
            self.handle(message)

    def handle(self, message: _Inbound) -> None:
        """Carry out one message read ahead; acknowledge it once the handler says it is stored."""
        try:
            ok = self.on_message(message.topic, message.payload, message.retain)
        except Exception:
            ok = self.handler_raised(message.topic, message.payload)
        self.settle(message, ok)

    def handle_batch(self, batch: list[_Inbound]) -> None:
        """Carry out messages read ahead with the batch handler; acknowledge each it says is
        stored, in order, up to its first refusal. A handler that raises gets each message
        again through `on_message`, where a poison message is counted and given up."""
        assert self.on_messages is not None
        try:
            results = list(self.on_messages([(m.topic, m.payload, m.retain) for m in batch]))
        except Exception:
            log.warning("inbound batch handler failed on %d messages; handling them one by one", len(batch),
                        exc_info=True)
            for message in batch:
                if self.drop:
                    return  # refused: the rest comes again
                self.handle(message)
            return
        for message, ok in zip(batch, results, strict=False):  # it may stop short
            self.settle(message, ok)
            if not ok:
                return
        if len(results) < len(batch):  # a handler that stopped without a refusal: the rest comes again
            self.settle(batch[len(results)], False)

    def settle(self, message: _Inbound, ok: bool) -> None:
        """Acknowledge a handled message, or refuse it: reconnect for its redelivery."""
        if ok:
            self.refusals = 0
            if self._failures:  # it went through after all
                self._failures.pop((message.topic, hashlib.sha256(message.payload).digest()), None)
            if message.qos > 0:
                self.ack(message.mid, message.qos)
        else:
            # Not acknowledged: reconnect (after a back-off) so the broker delivers it again,
            # with everything read after it.
            self.forget()
            self.refusals += 1
            self.drop = True
            # What we have to say (a status saying why we refuse, PUBACKs owed to us) goes out
            # before the drop, else a refusal right after each CONNACK would keep the device mute.
            self.drop_by = time.monotonic() + _FLUSH_BEFORE_DROP_S

    def forget(self) -> None:
        """Drop what was read and not handled: unacknowledged, the broker delivers it again."""
        self.messages.clear()
        self.bytes = 0

    def handler_raised(self, topic: str, payload: bytes) -> bool:
        """Count a delivery whose handler raised; True once it has had its attempts (give it up)."""
        key = (topic, hashlib.sha256(payload).digest())
        attempts = self._failures.pop(key, 0) + 1
        if attempts == 1:
            log.exception("inbound handler failed on a message to %s (%d bytes); it is delivered "
                          "again, at most %d times in all", topic, len(payload), _HANDLER_ATTEMPTS)
        if attempts < _HANDLER_ATTEMPTS:
            self._failures[key] = attempts
            while len(self._failures) > _FAILURES_REMEMBERED:
                self._failures.popitem(last=False)
            return False
        self.metrics.inc("mqtt_inbound_dropped")
        log.error("inbound message to %s (%d bytes) dropped: its handler failed on %d deliveries",
                  topic, len(payload), attempts)
        return True


class Session:
    """The session's state and what paho's callbacks say about it. Any thread may queue a message
    (`publish`) or set the subscriptions; `Bridge` drives the client on its network thread."""

    def __init__(self, settings: MqttSettings, client_id: str, *, will: Message,
                 on_message: InboundHandler, on_connect: Callable[[bool], None] | None = None,
                 metrics: Metrics | None = None, subscriptions_file: Path | None = None,
                 on_messages: BatchHandler | None = None) -> None:
        self.settings = settings
        self.client_id = client_id
        self.endpoint = parse_uri(settings.broker, ("mqtt", "mqtts"))
        self.outbox = Outbox(settings.outbound_max_bytes, max_age_s=settings.outbound_max_age_s,
                             max_count=settings.outbound_queue)
        self.metrics = metrics or Metrics()
        self._on_connect = on_connect
        self.subscriptions = Subscriptions(subscriptions_file)
        self.inbound = InboundQueue(on_message, on_messages, self._ack, self.metrics)
        self._connected = threading.Event()
        self._stopping = threading.Event()
        self._unacked: set[int] = set()
        self._window = _INFLIGHT
        """QoS 1 messages we may have in flight on this connection."""
        self._hold_until = 0.0
        self._final: list[Message] = []
        self._stop_deadline = 0.0
        self._connecting_since = 0.0
        self._attempts = 0
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._client = self._make_client(will)

    # -- public, any thread --------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    def wait_subscribed(self, timeout: float) -> bool:
        """Wait until the broker has acknowledged the current subscriptions."""
        return self.subscriptions.wait_acked(self._connected, timeout)

    @property
    def _subscribed(self) -> set[str]:
        return self.subscriptions.subscribed

    def publish(self, message: Message) -> None:
        """Queue `message`; the network thread sends it as soon as the broker is reachable."""
        self.outbox.put(message)
        self._wake()

    def set_subscriptions(self, topics: Iterable[str]) -> None:
        """The topics this session should be subscribed to (QoS 1); others are unsubscribed."""
        self.subscriptions.want(tuple(dict.fromkeys(topics)))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")

    # -- paho set-up ---------------------------------------------------------------------

    def _make_client(self, will: Message) -> mqtt.Client:
        s = self.settings
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=mqtt.MQTTv5, manual_ack=True)
        client.max_inflight_messages_set(_INFLIGHT)
        client.will_set(will.topic, will.payload, qos=will.qos, retain=will.retain)
        if s.username:
            client.username_pw_set(s.username, read_password(s))
        if self.endpoint.scheme == "mqtts":
            client.tls_set_context(tls_context(s))
        client.on_socket_open = self._socket_opened
        client.on_connect = self._connected_cb
        client.on_disconnect = self._disconnected_cb
        client.on_message = self._message_cb
        client.on_publish = self._published_cb
        client.on_subscribe = self._subscribed_cb
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = s.session_expiry_s
        props.MaximumPacketSize = s.max_packet_bytes
        client.connect_async(self.endpoint.host, self.endpoint.port, keepalive=s.keepalive_s,
                             clean_start=False, properties=props)
        return client

    @staticmethod
    def _socket_opened(client: mqtt.Client, userdata: Any, sock: Any) -> None:
        # Nagle plus delayed ACKs put a 40 ms floor under small messages; paho leaves it on.
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:  # a unix socket or an exotic transport
            log.debug("cannot set TCP_NODELAY: %s", exc)

    # -- paho callbacks (network thread) -------------------------------------------------

    def _connected_cb(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any,
                      props: Any) -> None:
        if reason.is_failure:
            if self._loud():
                log.error("broker %s refused the connection (attempt %d): %s", self.settings.broker,
                          self._attempts, reason)
            return
        self._attempts = 0
        # The broker's Receive Maximum bounds what we may have in flight (paho ignores it).
        self._window = max(1, min(_INFLIGHT, int(getattr(props, "ReceiveMaximum", _INFLIGHT))))
        self.inbound.drop = False  # a drop owed on the old connection is moot
        self.inbound.forget()  # its packet ids meant nothing on the old one; the broker resends
        self._connected.set()
        self.metrics.inc("mqtt_connects")
        log.info("connected to %s as %s (session %s)", self.settings.broker, self.client_id,
                 "resumed" if flags.session_present else "new")
        self.subscriptions.connected(bool(flags.session_present))
        if self._on_connect is not None:
            try:
                self._on_connect(bool(flags.session_present))
            except Exception:
                log.exception("on_connect handler failed")

    def _disconnected_cb(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any,
                         props: Any) -> None:
        # paho can report one disconnect twice (#870): count transitions, not calls.
        self.inbound.forget()  # unacknowledged: the broker delivers it again on the next connection
        if self._connected.is_set():
            self._connected.clear()
            self.metrics.inc("mqtt_disconnects")
            if not self._stopping.is_set():
                log.warning("disconnected from %s: %s", self.settings.broker, reason)
                # Not at once: every device of a fleet saw the same broker go away at the same moment.
                first = time.monotonic() + first_reconnect_delay(self.settings)
                self._hold_until = max(self._hold_until, first)

    def _message_cb(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.metrics.inc("mqtt_received")
        if self.inbound.drop:
            # This connection is being dropped for a refused message: the rest of what arrives
            # on it stays unacknowledged and comes again with the redelivery.
            return
        inbound = _Inbound(message.topic, bytes(message.payload), bool(message.retain), message.mid,
                           message.qos)
        self.inbound.add(inbound)

    def _ack(self, mid: int, qos: int) -> None:
        self._client.ack(mid, qos)  # the client as it is now (made below; a test wraps its `ack`)

    def _published_cb(self, client: mqtt.Client, userdata: Any, mid: int, reason: Any,
                      props: Any) -> None:
        self._unacked.discard(mid)
        if getattr(reason, "is_failure", False):
            log.warning("broker refused a publish: %s", reason)

    def _subscribed_cb(self, client: mqtt.Client, userdata: Any, mid: int, reasons: Any,
                       props: Any) -> None:
        self.subscriptions.acked(mid, reasons)

    def _loud(self) -> bool:
        """Log the 1st, 10th and every 100th failure of a streak, not all of them."""
        return self._attempts in (1, 10) or self._attempts % 100 == 0

    def _backoff(self, streak: int | None = None) -> float:
        return reconnect_delay(self.settings, self._attempts if streak is None else streak)


class Bridge(Session):
    """A persistent MQTT v5 session in a background thread: the network loop that drives it."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mqtt", daemon=True)
        self._thread.start()

    def stop(self, final: Sequence[Message] = (), timeout: float = 3.0) -> None:
        """Send `final` (and what is queued) if connected, within `timeout`, then disconnect."""
        self._final = list(final)
        self._stop_deadline = time.monotonic() + timeout
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout + 7)
        self._wake_r.close()
        self._wake_w.close()

    # -- network thread ------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._client.socket() is None:
                    self._connected.clear()
                    hold = self._hold_until - time.monotonic()
                    if hold > 0:
                        self._stopping.wait(hold)
                        continue
                    if not self._try_connect():
                        self._stopping.wait(self._backoff())
                        continue
                self._step(0.05 if self.inbound.drop else 0.5)
            except Exception:  # a bug here must cost a reconnect, not the daemon's MQTT
                log.exception("MQTT network loop failed; reconnecting")
                with contextlib.suppress(Exception):
                    self._close_socket()
                self._stopping.wait(self._backoff())
        try:
            self._shutdown()
        except Exception:
            log.exception("MQTT shutdown failed")

    def _try_connect(self) -> bool:
        self._attempts += 1
        self.inbound.forget()  # read on a connection that is gone: its packet ids mean nothing now
        try:
            rc = self._client.reconnect()
        except (OSError, ValueError) as exc:
            level = logging.WARNING if self._loud() else logging.DEBUG
            log.log(level, "broker %s unreachable (attempt %d): %s", self.settings.broker,
                    self._attempts, exc)
            return False
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS and self._client.socket() is None:
            return False
        self._connecting_since = time.monotonic()
        return True

    def _step(self, timeout: float) -> None:
        client = self._client
        self._send_pending()
        self.outbox.report()
        sock = client.socket()
        if sock is None:
            return
        inbound = self.inbound
        reading = not inbound.full
        pending = sock.pending() if isinstance(sock, ssl.SSLSocket) and reading else 0
        handling = bool(inbound.messages) and self._connected.is_set() and not self._stopping.is_set()
        wlist = [sock] if client.want_write() else []
        rlist = [sock, self._wake_r] if reading else [self._wake_r]
        try:
            readable, writable, _ = select.select(rlist, wlist, [], 0 if pending or handling else timeout)
        except (OSError, ValueError):
            readable, writable = [sock], []
        if self._wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                self._wake_r.recv(4096)
        if sock in readable or pending:
            self._read(sock)
        if client.socket() is not None and (sock in writable or client.want_write()):
            client.loop_write()
        if handling and client.socket() is not None:
            self._handle_some(sock)
        if client.socket() is not None:
            client.loop_misc()
        if (client.socket() is not None and not self._connected.is_set()
                and time.monotonic() - self._connecting_since > 2 * client.connect_timeout + 5):
            log.warning("no CONNACK from %s; reconnecting", self.settings.broker)
            self._close_socket()
        if inbound.drop and client.socket() is not None and (
                time.monotonic() >= inbound.drop_by or not (len(self.outbox) or self._unacked)):
            delay = self._backoff(inbound.refusals)
            if inbound.refusals in (1, 10) or inbound.refusals % 100 == 0:
                log.warning("a message could not be stored (%d in a row); reconnecting in %.1f s for "
                            "its redelivery", inbound.refusals, delay)
            self._hold_until = time.monotonic() + delay
            self._close_socket()  # reads to EOF: nothing more arrives on this connection
            inbound.drop = False

    def _read(self, sock: Any) -> None:
        """Read what the broker has sent, up to `_READ_AHEAD_BYTES` of messages not yet handled.

        Reading ahead of the handler is what keeps statuses flowing under a flood. Our
        PUBACKs come in the one TCP stream behind the messages the broker sends us, and
        the broker does not keep that backlog short (mosquitto 2.0.11 sends past the
        receive maximum once we publish QoS 1 ourselves): handled one by one at journal
        speed, 2000 announcements kept the send window full for the whole flood and their
        statuses waited behind it. Read ahead, each PUBACK is seen at once and frees its
        place in the window, while the messages wait, unacknowledged, for the handler.
        """
        client = self._client
        for _ in range(_READS_PER_STEP):
            client.loop_read()
            if client.socket() is None:
                return
            self._send_pending()  # acknowledgements just read free places in the send window
            if client.want_write():
                client.loop_write()
            if self.inbound.full or not _readable(sock):
                return

    def _handle_some(self, sock: Any) -> None:
        """Handle messages read ahead for up to `_HANDLE_SLICE_S`, then let the loop do the rest.

        Between two messages, acknowledgements that came in are read and their places in
        the send window refilled: a window's round trip costs one handler call, not a slice."""
        deadline = time.monotonic() + _HANDLE_SLICE_S
        inbound = self.inbound
        while inbound.messages and not inbound.drop and self._connected.is_set():
            inbound.handle_next()
            if self._client.socket() is None:
                return
            self._send_pending()  # statuses the handler queued
            if self._client.want_write():
                self._client.loop_write()  # the acknowledgement and those statuses
            if time.monotonic() >= deadline:
                return
            if not inbound.full and _readable(sock):
                self._read(sock)

    def _close_socket(self) -> None:
        # A broken connection, not a clean DISCONNECT: the broker keeps our session (and
        # the unacknowledged messages in it) and, if it notices, publishes the will.
        sock: Any = self._client.socket()
        self._connected.clear()
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        for _ in range(1000):  # paho reads what is buffered, then EOF; it closes and resets its state
            self._client.loop_read()
            if self._client.socket() is None:
                break

    def _send_pending(self) -> None:
        """Once connected: subscriptions first (what the device hears), then the outbox."""
        if self._connected.is_set():
            self.subscriptions.sync(self._client)
            self._drain()

    def _drain(self) -> None:
        while len(self._unacked) < self._window:
            message = self.outbox.pop()
            if message is None:
                return
            info = self._client.publish(message.topic, message.payload, message.qos, message.retain)
            if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                self.outbox.push_front(message)
                return
            if message.qos > 0:
                self._unacked.add(info.mid)
            self.metrics.inc("mqtt_sent")

    def _shutdown(self) -> None:
        deadline = self._stop_deadline
        if self._connected.is_set():
            for message in self._final:
                self.outbox.put(message)
            while (len(self.outbox) or self._unacked) and time.monotonic() < deadline:
                if self._client.socket() is None:
                    break
                self._step(0.05)
            if len(self.outbox) or self._unacked:
                log.warning("shutting down with %d messages unsent", len(self.outbox) + len(self._unacked))
            self._client.disconnect()
            while self._client.socket() is not None and time.monotonic() < deadline + 1:
                self._step(0.05)
        self._close_socket_quietly()
        self._connected.clear()
        self.outbox.report(final=True)

    def _close_socket_quietly(self) -> None:
        sock = self._client.socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
