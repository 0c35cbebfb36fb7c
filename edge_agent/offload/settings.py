"""The offload settings sections: `offload` (the device's client side) and `server` (`edge-agent serve`).

Both live here, not in their side packages: importing a side package loads its whole side, and
the settings are read by everything that assembles configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from edge_agent.checks import positive
from edge_agent.endpoints import parse_uri


@dataclass(frozen=True)
class OffloadSettings:
    """Heavy synthesis on an `edge-agent serve` host."""

    policy: Literal["auto", "local", "remote"] = "auto"
    """auto: remote when reachable, local otherwise; local/remote: only that."""
    server: str = ""
    """`tcp://HOST:PORT` (or `tls://HOST:PORT`) of the synthesis server; empty means local only."""
    servers: tuple[str, ...] = ()
    """More servers (with `server`, one list): a new stream goes to the healthy one with the least load.
    A host name stands for every address it resolves to (a Kubernetes headless Service)."""
    resolve_interval_s: float = 30.0
    """How often server host names are resolved again (servers come and go)."""
    voice: str = "kokoro-82m"
    """Voice asked of the server; empty means the local voice (`tts.voice`)."""
    codec: Literal["auto", "opus", "pcm16"] = "auto"
    """Audio on the wire; auto is Opus when both sides have it."""
    psk_file: Path | None = None
    """File holding the pre-shared key; None reads $EDGE_OFFLOAD_PSK."""
    tls_ca: Path | None = None
    """CA bundle that signed the server's certificate (tls:// only); None is the system store."""
    tls_server_name: str = ""
    """Name to verify in the server's certificate; empty is the host from `server`."""
    connect_timeout_s: float = 2.0
    """Budget for TCP connect, TLS and the key exchange."""
    first_audio_deadline_s: float = 3.0
    """The first remote sentence must be complete by then, else the utterance is spoken locally."""
    sentence_timeout_s: float = 3.0
    """Each later sentence may take this long, or as long as the audio still queued for playback."""
    stall_probe_s: float = 1.0
    """When the queued audio is down to this and the next remote sentence is missing, the server is
    pinged; no PONG within half of it (at most `ping_timeout_s`) moves the rest on at once. 0: off."""
    ping_interval_s: float = 5.0
    """How often each connected server is pinged (its PONG reports its load)."""
    ping_timeout_s: float = 2.0
    """A ping unanswered this long counts as a failure (towards `breaker_failures`)."""
    breaker_failures: int = 3
    """Consecutive failures (pings, requests, connects) that open the circuit breaker."""
    breaker_open_s: float = 30.0
    """How long an open breaker keeps requests local before a probe may close it."""
    reconnect_min_s: float = 0.5
    """First reconnect delay."""
    reconnect_max_s: float = 30.0
    """Reconnect backoff bounds (exponential, full jitter)."""
    max_frame_bytes: int = 65536
    """Largest frame payload accepted from the server."""
    max_request_chars: int = 5000
    """Most characters of text one request carries (a server refuses more than its
    `server.max_text_chars`); a longer text goes as several requests, one after another."""

    def __post_init__(self) -> None:
        if self.max_request_chars < 1:
            raise ValueError(f"max_request_chars: {self.max_request_chars} is below 1")
        if self.server:
            try:
                parse_uri(self.server, ("tcp", "tls"))
            except ValueError as exc:
                raise ValueError(f"server: {exc}") from None
        for i, uri in enumerate(self.servers):
            try:
                parse_uri(uri, ("tcp", "tls"))
            except ValueError as exc:
                raise ValueError(f"servers[{i}]: {exc}") from None
        positive(self, "resolve_interval_s", "connect_timeout_s", "first_audio_deadline_s",
                  "sentence_timeout_s", "ping_interval_s", "ping_timeout_s", "breaker_open_s",
                  "reconnect_min_s", "reconnect_max_s", "breaker_failures")
        if self.reconnect_max_s < self.reconnect_min_s:
            raise ValueError("reconnect_max_s: must not be below reconnect_min_s")
        if self.stall_probe_s < 0:
            raise ValueError("stall_probe_s: must not be negative (0 turns the probe off)")
        _frame_limit(self.max_frame_bytes)

    @property
    def targets(self) -> tuple[str, ...]:
        """Every configured server URI, `server` first, each once: the one list every caller uses
        (`server` and `servers` are two spellings of it)."""
        return tuple(dict.fromkeys(((self.server,) if self.server else ()) + self.servers))

    @property
    def offloads(self) -> bool:
        """Whether synthesis may leave the device: a server is configured and policy is not local."""
        return bool(self.targets) and self.policy != "local"


@dataclass(frozen=True)
class ServerSettings:
    """`edge-agent serve`: the synthesis server."""

    RENAMED: ClassVar[dict[str, str]] = {"queue_bound": "max_streams"}
    """Old keys still read under their new names (typedtree), so older config files keep loading."""

    host: str = "127.0.0.1"
    """Address to listen on (0.0.0.0 or :: for every interface)."""
    port: int = 10700
    """Port to listen on."""
    psk_file: Path | None = None
    """File holding the pre-shared key; None reads $EDGE_OFFLOAD_PSK."""
    insecure: bool = False
    """Run without a key. Only allowed on a loopback address."""
    tls_cert: Path | None = None
    """PEM certificate chain; with `tls_key`, connections are TLS."""
    tls_key: Path | None = None
    """PEM private key of `tls_cert`."""
    voices: tuple[str, ...] = ("kokoro-82m", "en_US-joe-medium")
    """Voices loaded at start and offered to clients (the first is the default)."""
    kokoro_speaker: str = "af_heart"
    """Kokoro voice pack used for `kokoro-82m`."""
    workers: int = 2
    """Sentences synthesized at once (the batch: requests arriving together share these)."""
    threads: int = 1
    """onnxruntime intra-op threads per worker."""
    max_streams: int = 32
    """Most streams open at once, all connections together; a new stream beyond them is refused at
    once with BUSY (naming this key), never queued, and the open ones go on unharmed."""
    max_connections: int = 256
    """Authenticated connections beyond this are answered BUSY and closed."""
    max_handshakes: int = 512
    """Connections that have not sent a complete HELLO yet (not counted in `max_connections`);
    as many again may have sent it and owe their AUTH. A new one beyond this closes one no
    further on than itself: from the address holding the most, its oldest. Keep it above the
    half-open connections an attack may hold: every one closed comes straight back and costs an
    accept (and above 100: one burst of accepts comes in before anyone's first bytes are read)."""
    max_handshakes_per_source: int = 0
    """Connections in each handshake stage from one address (an IPv6 /64); one more closes that
    address's oldest. 0: no cap (the default: a full budget already closes the busiest address's
    first, and a cap turns a held connection into one reopened at once, at the attacker's rate).
    Never where many devices share one address (NAT, a proxy)."""
    max_streams_per_connection: int = 8
    """Open streams one connection may have; more are refused (TOO_MANY_STREAMS)."""
    max_text_chars: int = 5000
    """Most characters of text one request may carry; more is refused (BAD_REQUEST)."""
    max_sentence_chars: int = 300
    """Longest sentence of a request (the device splits at the same length): synthesis cost
    and memory grow with a sentence's length, not with the request's."""
    max_frame_bytes: int = 65536
    """Largest frame payload accepted from a client."""
    chunk_ms: int = 500
    """Audio per AUDIO frame."""
    opus_bitrate: int = 24000
    """Opus bitrate in bits per second, for clients that agreed on Opus."""
    handshake_timeout_s: float = 5.0
    """The whole handshake (HELLO to AUTH), from accept, whatever the reads in between."""
    idle_timeout_s: float = 60.0
    """Connections with no frame (clients ping) for this long are closed."""
    frame_timeout_s: float = 10.0
    """A frame must arrive whole within this long of its first byte."""
    write_timeout_s: float = 10.0
    """A client that stops reading for this long is disconnected."""
    shutdown_grace_s: float = 10.0
    """On SIGTERM, open streams get this long to finish."""
    metrics_interval_s: float = 60.0
    """Log a metrics snapshot this often; 0 turns it off."""
    metrics_port: int | None = None
    """HTTP port for Prometheus (`/metrics`) and the probes (`/ready`, `/live`); None turns it off
    (needs the `server` extra: prometheus-client)."""
    metrics_host: str = ""
    """Address the metrics port listens on; empty is `host`."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is outside 0..65535")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port: {self.metrics_port} is outside 0..65535")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert: tls_cert and tls_key go together")
        if not self.voices:
            raise ValueError("voices: at least one voice")
        positive(self, "workers", "threads", "max_streams", "max_connections", "max_handshakes",
                  "max_streams_per_connection", "max_text_chars", "max_sentence_chars", "chunk_ms",
                  "opus_bitrate", "handshake_timeout_s", "idle_timeout_s", "frame_timeout_s",
                  "write_timeout_s")
        if self.shutdown_grace_s < 0 or self.metrics_interval_s < 0:
            raise ValueError("shutdown_grace_s and metrics_interval_s must not be negative")
        if self.max_handshakes_per_source < 0:
            raise ValueError("max_handshakes_per_source: must not be negative (0 is no cap)")
        _frame_limit(self.max_frame_bytes)


def _frame_limit(value: int) -> None:
    if not 4096 <= value <= 16 * 1024 * 1024:
        raise ValueError(f"max_frame_bytes: {value} is outside 4096..16777216")
