"""MQTT transport settings (`mqtt.*`): the broker, credentials, TLS, topics, the outbox."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edge_agent.endpoints import parse_uri


@dataclass(frozen=True)
class MqttSettings:
    """The MQTT broker connection."""

    broker: str = "mqtt://127.0.0.1:1883"
    """`mqtt://HOST:PORT` or `mqtts://HOST:PORT`; empty disables MQTT."""
    prefix: str = "edge"
    """First topic level of every topic."""
    client_id: str = ""
    """MQTT client id; empty means `edge-agent-<device id>`. Must stay stable: the broker keeps
    the session (subscriptions, queued announcements) under it."""
    username: str = ""
    """Broker login; empty connects without one (`password` or `password_file` goes with it)."""
    password: str = ""
    """Prefer `password_file`: this file may be readable by others."""
    password_file: Path | None = None
    """File whose first line is the password (wins over `password`)."""
    tls_ca: Path | None = None
    """CA bundle for `mqtts://`; None uses the system's trusted CAs."""
    tls_cert: Path | None = None
    """Client certificate (PEM) for brokers that require one."""
    tls_key: Path | None = None
    """Private key of `tls_cert`."""
    keepalive_s: int = 30
    """MQTT keepalive: a dead connection is noticed after about 1.5 times this."""
    session_expiry_s: int = 604800
    """How long the broker keeps this device's session (and queues announcements) while it
    is offline; must be more than 0 for announcements published while it is down to arrive."""
    reconnect_min_s: float = 0.5
    """First reconnect delay (the first attempt after a lost connection comes within it)."""
    reconnect_max_s: float = 30.0
    """Reconnect delays grow from min to max with random jitter, so a fleet does not
    reconnect in lock-step after a broker restart."""
    outbound_max_bytes: int = 4194304
    """Most bytes of messages waiting to be sent (topic, payload and 256 bytes of bookkeeping
    each): about 13,000 announcement statuses. Over it, metrics and intermediate states go
    first; an announcement's first and final statuses are never pushed out by other messages."""
    outbound_max_age_s: float = 86400.0
    """A message not sent within this long (the broker unreachable) is dropped rather than sent
    late; retained states are kept (the newest of each wins). 0: no age limit."""
    outbound_queue: int = 0
    """Most messages waiting, besides `outbound_max_bytes`; 0 (the default): no count limit. A
    count is a poor bound: a burst of small statuses exhausts it while costing little."""
    heartbeat_s: float = 30.0
    """How often the retained `online` status is refreshed."""
    max_packet_bytes: int = 16777216
    """Largest MQTT packet the broker may send us (bigger ones it drops); payloads over the
    announcement or fleet limits but under this are answered with `rejected`."""
    ha_discovery: bool = False
    """Publish Home Assistant MQTT discovery (`<ha_prefix>/device/<id>/config`): a notify entity
    that speaks, sensors, a wake-word event, volume and a microphone mute switch."""
    ha_prefix: str = "homeassistant"
    """Home Assistant's discovery prefix (its birth message comes on `<ha_prefix>/status`)."""

    def __post_init__(self) -> None:
        if self.broker:
            try:
                parse_uri(self.broker, ("mqtt", "mqtts"))
            except ValueError as exc:
                raise ValueError(f"broker: {exc}") from None
        if not self.ha_prefix or any(c in self.ha_prefix for c in "+#\x00"):
            raise ValueError(f"ha_prefix: {self.ha_prefix!r} is not a valid topic prefix")
        if not self.prefix or any(c in self.prefix for c in "+#\x00"):
            raise ValueError(f"prefix: {self.prefix!r} is not a valid topic prefix")
        if any(c in self.client_id for c in "+#/\x00"):
            raise ValueError(f"client_id: {self.client_id!r} may not contain '+', '#', '/' or NUL")
        if self.keepalive_s < 5:
            raise ValueError(f"keepalive_s: {self.keepalive_s} is below 5")
        if self.session_expiry_s <= 0:
            raise ValueError("session_expiry_s: must be more than 0 (0 drops the session at disconnect)")
        if not 0 < self.reconnect_min_s <= self.reconnect_max_s:
            raise ValueError("reconnect_min_s and reconnect_max_s: need 0 < min <= max")
        if self.outbound_queue < 0:
            raise ValueError(f"outbound_queue: {self.outbound_queue} is below 0")
        if self.outbound_max_bytes < 4096:
            raise ValueError(f"outbound_max_bytes: {self.outbound_max_bytes} is below 4096")
        if not 0 <= self.outbound_max_age_s < float("inf"):
            raise ValueError(f"outbound_max_age_s: {self.outbound_max_age_s} is not 0 or more seconds")
        if self.heartbeat_s <= 0:
            raise ValueError(f"heartbeat_s: {self.heartbeat_s} must be positive")
        if self.max_packet_bytes < 65536:
            raise ValueError(f"max_packet_bytes: {self.max_packet_bytes} is below 65536")
