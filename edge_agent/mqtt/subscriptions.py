"""What the bridge's session is subscribed to, and what it should be.

Any thread says which topics the device wants (`want`); the network thread brings the session
there (`sync`: stale topics unsubscribed, the wanted ones subscribed at QoS 1) once connected,
and counts the broker's SUBACKs so a caller can wait until they are in force. What the session
holds is recorded in a file beside the fleet state, because a persistent session outlives the
process: after a restart, a topic the new config no longer wants is still subscribed on the
broker and must be removed, though this process never subscribed to it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from edge_agent.atomic import atomic_write

log = logging.getLogger(__name__)


class Subscriber(Protocol):
    """The part of paho's client `sync` uses (called on the network thread only)."""

    def subscribe(self, topic: Any) -> tuple[MQTTErrorCode, int | None]: ...

    def unsubscribe(self, topic: Any) -> tuple[MQTTErrorCode, int | None]: ...


class Subscriptions:
    """The wanted topics, the session's, and the SUBACKs still owed."""

    def __init__(self, file: Path | None = None) -> None:
        self.file = file
        self._lock = threading.Lock()
        self._wanted: tuple[str, ...] = ()
        self.subscribed: set[str] = set(self._load())
        """What the session is subscribed to (as far as we know: the file, after a restart)."""
        self._dirty = False
        self._pending: set[int] = set()
        self._acked = threading.Event()

    def want(self, topics: tuple[str, ...]) -> None:
        """The topics the session should hold (any thread); `sync` gets it there."""
        with self._lock:
            self._wanted = topics
            self._dirty = True

    def wait_acked(self, connected: threading.Event, timeout: float) -> bool:
        """Wait until the broker has acknowledged the wanted subscriptions on a live connection."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if not connected.wait(max(0.0, remaining)) or remaining <= 0:
                return False
            with self._lock:
                done = not self._dirty and not self._pending
            if done and self._acked.wait(0):
                return True
            self._acked.wait(min(0.05, max(0.0, remaining)))

    def connected(self, session_present: bool) -> None:
        """A new connection: subscribe again (`sync`); a new session holds nothing to remove."""
        with self._lock:
            self._dirty = True
            self._pending.clear()  # a SUBACK owed on the old connection never comes
            if not session_present:
                self.subscribed = set()

    def sync(self, client: Subscriber) -> None:
        """Bring the session to the wanted topics (the network thread, connected)."""
        with self._lock:
            if not self._dirty:
                return
            self._dirty = False
            wanted = self._wanted
            if wanted:
                self._acked.clear()
            else:
                self._acked.set()
        stale = sorted(self.subscribed - set(wanted))
        if stale:
            client.unsubscribe(stale)
            log.info("unsubscribed from %s", ", ".join(stale))
        if wanted:
            # Retained messages (configs) only for new subscriptions: after a resumed
            # session they were delivered already.
            opts = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
            rc, mid = client.subscribe([(t, opts) for t in wanted])
            if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
                with self._lock:
                    self._pending.add(mid)
        if set(wanted) != self.subscribed:
            self.subscribed = set(wanted)
            self._save()

    def acked(self, mid: int, reasons: Any) -> None:
        """The broker's SUBACK for `mid` (the network thread)."""
        failed = [str(r) for r in reasons if getattr(r, "is_failure", False)]
        if failed:
            log.error("broker refused a subscription: %s", ", ".join(failed))
        with self._lock:
            self._pending.discard(mid)
            if not self._pending:
                self._acked.set()

    def _load(self) -> list[str]:
        if self.file is None:
            return []
        try:
            data = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return []
        return [t for t in data if isinstance(t, str)] if isinstance(data, list) else []

    def _save(self) -> None:
        if self.file is None:
            return
        try:
            atomic_write(self.file, json.dumps(sorted(self.subscribed)).encode())
        except OSError as exc:
            log.warning("cannot record subscriptions in %s: %s", self.file, exc)
