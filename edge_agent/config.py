"""Typed settings: a tree of frozen dataclasses built from layered sources, assembled here.

Each package's section lives beside it (`audio/settings.py`, `wake/settings.py`, ...) and imports
nothing above it (`homes`, `endpoints`, `checks` at most); this module assembles `Settings`, loads
and validates it, and holds the sections that have no package of their own (device, runtime,
daemon, logging) and those that cannot move yet: `vad` and `listen` (their packages' `__init__`
imports modules that import this one, so loading their settings from here would come back to a
half-loaded module), `offload` and `server` (outside `offload/` only its side packages are imported).

Layers, later wins: the defaults written in the dataclasses below, then a YAML
file, then command-line overrides (`--set tts.threads=1` or a verb's own flag).
Every error names the key path (`tts.voice: unknown voice 'x'`).
"""

from __future__ import annotations

import copy
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edge_agent.announce.settings import AnnouncementSettings
from edge_agent.asr.settings import AsrSettings
from edge_agent.audio.settings import AudioSettings
from edge_agent.checks import positive
from edge_agent.endpoints import Endpoint, parse_uri
from edge_agent.errors import ConfigError
from edge_agent.esphome.settings import EsphomeSettings
from edge_agent.fleet.settings import FLEET_ALWAYS_PROTECTED, FleetSettings
from edge_agent.hermes.settings import HermesSettings
from edge_agent.homes import state_home
from edge_agent.models.catalog import load_catalog
from edge_agent.models.settings import ModelSettings
from edge_agent.mqtt.settings import MqttSettings
from edge_agent.safeyaml import YamlLimits, load_yaml, load_yaml_file
from edge_agent.sendspin.settings import SendspinSettings
from edge_agent.tts.settings import TtsSettings
from edge_agent.typedtree import build, describe, merge
from edge_agent.wake.settings import WAKE_BUILTIN, WakeSettings
from edge_agent.wyoming.settings import WyomingSettings

__all__ = [
    "CONFIG_ENV", "FLEET_ALWAYS_PROTECTED", "WAKE_BUILTIN", "AnnouncementSettings", "AsrSettings",
    "AudioSettings", "CudaSettings", "DaemonSettings", "DeviceSettings", "Endpoint", "EsphomeSettings",
    "FleetSettings", "HermesSettings", "ListenSettings", "LoggingSettings", "ModelSettings", "MqttSettings",
    "OffloadSettings", "RuntimeSettings", "SendspinSettings", "ServerSettings", "Settings",
    "TensorrtSettings", "TtsSettings", "VadSettings", "WakeSettings", "WyomingSettings", "load_settings",
    "parse_override", "parse_uri", "validate",
]
"""Each package's settings live beside it (`audio/settings.py`, ...); they are named here too, so
`from edge_agent.config import AudioSettings` keeps working for the code that assembles settings."""

CONFIG_ENV = "EDGE_AGENT_CONFIG"
"""Environment variable naming the config file when `--config` is not given."""


@dataclass(frozen=True)
class DeviceSettings:
    """Who this device is."""

    id: str = ""
    """Device id used in MQTT topics; empty means the host name."""
    group: str = "default"
    """Fleet group this device belongs to."""

    @property
    def resolved_id(self) -> str:
        return self.id or socket.gethostname().split(".")[0]

    def __post_init__(self) -> None:
        for name in ("id", "group"):
            value = getattr(self, name)
            if any(c in value for c in "/+#\x00 "):
                raise ValueError(f"{name}: {value!r} may not contain '/', '+', '#', NUL or spaces")


@dataclass(frozen=True)
class VadSettings:
    """Voice activity detection: which frames are speech, where utterances start and end."""

    engine: Literal["webrtc", "silero"] = "silero"
    """silero: the Silero VAD ONNX model (`edge-agent models fetch silero-vad`; 2.3 MB, about 0.1 ms
    of CPU a 32 ms frame); webrtc: webrtcvad (no model file, 3 µs a frame). In `edge-agent bench hear
    --room` webrtcvad took music at 10 dB SNR for speech and left 10-13 of 13 commands open to
    `listen.command_timeout_s` (the talker's end to the turn's end p50 6.2 s); Silero ended all of them
    (p50 0.64 s, as without music)."""
    aggressiveness: int = 2
    """webrtcvad mode, 0 (keeps most audio) .. 3 (drops most non-speech)."""
    frame_ms: int = 30
    """webrtcvad frame length: 10, 20 or 30 ms (Silero always uses 32 ms)."""
    preroll_ms: int = 300
    """Audio kept from before the first speech frame, so soft onsets are not clipped."""
    hangover_ms: int = 500
    """Non-speech needed after speech to end an utterance (sets end-of-speech latency)."""
    min_utterance_ms: int = 250
    """Speech shorter than this (clicks, a cough) is dropped."""
    max_utterance_s: float = 20.0
    """An utterance is cut here and continues as the next one; at most 30 s (Whisper's window)."""
    silero_threshold: float = 0.5
    """Silero speech probability at or above which a frame counts as speech."""

    def __post_init__(self) -> None:
        if self.aggressiveness not in (0, 1, 2, 3):
            raise ValueError(f"aggressiveness: {self.aggressiveness} is not one of 0, 1, 2, 3")
        if self.frame_ms not in (10, 20, 30):
            raise ValueError(f"frame_ms: {self.frame_ms} is not one of 10, 20, 30")
        if min(self.preroll_ms, self.hangover_ms, self.min_utterance_ms) < 0:
            raise ValueError("preroll_ms, hangover_ms and min_utterance_ms must not be negative")
        if not 1.0 <= self.max_utterance_s <= 30.0:
            raise ValueError(f"max_utterance_s: {self.max_utterance_s} is outside 1..30")
        if not 0.0 < self.silero_threshold < 1.0:
            raise ValueError(f"silero_threshold: {self.silero_threshold} is outside 0..1")


@dataclass(frozen=True)
class ListenSettings:
    """What the microphone is used for, and the conversation turn."""

    mode: Literal["wake", "always", "off"] = "wake"
    """wake: transcribe one command after a wake word; always: transcribe everything; off: no microphone."""
    command_timeout_s: float = 8.0
    """A turn ends this long after it opened if the command has not ended by itself."""
    early_end_ms: int = 0
    """With `end_of_turn: vad`: decode at the first pause this long and end the turn there when
    Whisper hears a complete sentence (0, the default: the turn ends where the VAD's hangover ends the
    utterance; an early end drops a second sentence said after a pause longer than this)."""
    end_of_turn: Literal["model", "vad"] = "model"
    """model: at a pause of `turn_pause_ms` the end-of-turn model (`edge-agent models fetch smart-turn`,
    8.7 MB) judges the last 8 s of the turn; a complete turn ends there, an incomplete one waits for more
    speech up to `turn_incomplete_wait_ms`. Without the model (missing or corrupt) turns end as with
    vad, after one warning. vad: a turn ends where the VAD's hangover (`vad.hangover_ms`) ends it."""
    turn_pause_ms: int = 150
    """The pause after speech at which the end-of-turn model is asked (Whisper decodes meanwhile)."""
    turn_probability: float = 0.5
    """The model's probability from which a pause ends the turn."""
    turn_incomplete_wait_ms: int = 1000
    """After the model judged a pause incomplete, how long a silence still ends the turn (a
    mid-command pause waits this long for more speech; at most `vad.hangover_ms` when smaller)."""
    lookback_ms: int = 150
    """A turn's audio starts this long before the wake word was detected (the model decides 0.05-0.2 s
    after the phrase has ended), so a command said without a pause keeps its first word; longer takes
    in the phrase's last syllable, which Whisper writes as a word (200 ms: 'off, turn on ...')."""
    answer_wait_s: float = 5.0
    """An announcement paused by a turn waits this long for the turn's answer before it resumes (not
    at all once Home Assistant's run has ended without one)."""

    def __post_init__(self) -> None:
        if not 1.0 <= self.command_timeout_s <= 60.0:
            raise ValueError(f"command_timeout_s: {self.command_timeout_s} is outside 1..60")
        if not 0 <= self.early_end_ms <= 2000:
            raise ValueError(f"early_end_ms: {self.early_end_ms} is outside 0..2000")
        if not 0 <= self.lookback_ms <= 1000:
            raise ValueError(f"lookback_ms: {self.lookback_ms} is outside 0..1000")
        if not 30 <= self.turn_pause_ms <= 2000:
            raise ValueError(f"turn_pause_ms: {self.turn_pause_ms} is outside 30..2000")
        if not 0.0 < self.turn_probability <= 1.0:
            raise ValueError(f"turn_probability: {self.turn_probability} is outside (0, 1]")
        if not 0 <= self.turn_incomplete_wait_ms <= 10000:
            raise ValueError(f"turn_incomplete_wait_ms: {self.turn_incomplete_wait_ms} is outside 0..10000")
        if not 0.0 <= self.answer_wait_s <= 120.0:
            raise ValueError(f"answer_wait_s: {self.answer_wait_s} is outside 0..120")


Provider = Literal["tensorrt", "cuda", "cpu"]
"""onnxruntime execution providers by our names."""


@dataclass(frozen=True)
class TensorrtSettings:
    """TensorRT execution provider options (onnxruntime's `trt_*`)."""

    fp16: bool = True
    """Let TensorRT run layers in half precision."""
    engine_cache: bool = True
    """Keep built engines in `<models.cache_dir>/trt/` (building one takes minutes on a Jetson)."""
    timing_cache: bool = True
    """Keep layer timings there too, so an engine for a new profile builds faster."""
    max_workspace_mb: int = 1024
    """Scratch memory TensorRT may use while building an engine."""
    device_id: int = 0
    """GPU index."""

    def __post_init__(self) -> None:
        if self.max_workspace_mb < 16 or self.device_id < 0:
            raise ValueError("max_workspace_mb must be at least 16 and device_id not negative")


@dataclass(frozen=True)
class CudaSettings:
    """CUDA execution provider options."""

    conv_algo_search: Literal["EXHAUSTIVE", "HEURISTIC", "DEFAULT"] = "HEURISTIC"
    """cuDNN convolution algorithm search: EXHAUSTIVE benchmarks every new input shape (and
    every Piper sentence and window has one), HEURISTIC picks without timing."""
    device_id: int = 0
    """GPU index."""

    def __post_init__(self) -> None:
        if self.device_id < 0:
            raise ValueError(f"device_id: {self.device_id} is negative")


@dataclass(frozen=True)
class RuntimeSettings:
    """onnxruntime execution providers: which accelerator each use runs on."""

    providers: tuple[Provider, ...] = ("cpu",)
    """Preferred providers, best first (e.g. [tensorrt, cuda, cpu]), kept where the installed
    onnxruntime offers them; cpu always comes last. One warning names each one missing."""
    tts: tuple[Provider, ...] | None = None
    """Providers for the local voices; None uses `providers`."""
    asr: tuple[Provider, ...] | None = None
    """Providers for Whisper; None uses `providers`."""
    server: tuple[Provider, ...] | None = None
    """Providers for the voices `edge-agent serve` runs; None uses `providers`."""
    tensorrt: TensorrtSettings = field(default_factory=TensorrtSettings)
    cuda: CudaSettings = field(default_factory=CudaSettings)

    def wanted(self, use: str) -> tuple[Provider, ...]:
        """The providers asked for `use` (tts, asr, server; anything else gets `providers`)."""
        override: tuple[Provider, ...] | None = getattr(self, use, None) if use in (
            "tts", "asr", "server") else None
        return self.providers if override is None else override

    def __post_init__(self) -> None:
        for name in ("providers", "tts", "asr", "server"):
            value = getattr(self, name)
            if value is not None and not value:
                raise ValueError(f"{name}: name at least one provider (cpu is always last)")


@dataclass(frozen=True)
class DaemonSettings:
    """`edge-agent run`."""

    out_dir: Path | None = None
    """Write each announcement to `<out_dir>/<id>.wav` instead of the sound card."""
    metrics_s: float = 60.0
    """How often a metrics snapshot is published; 0 turns it off."""
    listen: bool = True
    """Listen and publish transcripts when an ASR model is present."""
    state_dir: Path = field(default_factory=lambda: state_home() / "daemon")
    """What the user switched at run time (microphone mute, volume from Home Assistant), kept
    across restarts."""

    def __post_init__(self) -> None:
        if self.metrics_s < 0:
            raise ValueError(f"metrics_s: {self.metrics_s} is negative")


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
    queue_bound: int = 32
    """Open streams the server accepts before answering BUSY."""
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
        positive(self, "workers", "threads", "queue_bound", "max_connections", "max_handshakes",
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


@dataclass(frozen=True)
class LoggingSettings:
    """Log output."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    json: bool = False
    """One JSON object per line (the daemon's default under systemd)."""


@dataclass(frozen=True)
class Settings:
    """Everything the agent can be configured with."""

    device: DeviceSettings = field(default_factory=DeviceSettings)
    audio: AudioSettings = field(default_factory=AudioSettings)
    tts: TtsSettings = field(default_factory=TtsSettings)
    vad: VadSettings = field(default_factory=VadSettings)
    asr: AsrSettings = field(default_factory=AsrSettings)
    wake: WakeSettings = field(default_factory=WakeSettings)
    listen: ListenSettings = field(default_factory=ListenSettings)
    models: ModelSettings = field(default_factory=ModelSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    offload: OffloadSettings = field(default_factory=OffloadSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    announcements: AnnouncementSettings = field(default_factory=AnnouncementSettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    wyoming: WyomingSettings = field(default_factory=WyomingSettings)
    hermes: HermesSettings = field(default_factory=HermesSettings)
    esphome: EsphomeSettings = field(default_factory=EsphomeSettings)
    sendspin: SendspinSettings = field(default_factory=SendspinSettings)


def parse_override(text: str) -> tuple[str, Any]:
    """Parse `KEY.PATH=VALUE` (VALUE is YAML, so `3`, `true`, `[a, b]` keep their types)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. tts.threads=1")
    value = load_yaml(raw, source=f"override {key}", limits=YamlLimits(max_bytes=4096))
    return key.strip(), value


def _apply_override(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])}: is not a section")
        node = child
    node[parts[-1]] = value


def load_settings(
    path: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    layers: Sequence[Mapping[str, Any]] = (),
) -> Settings:
    """Defaults, then `path` (or $EDGE_AGENT_CONFIG), then `layers` (plain trees, deep-merged
    in order: a fleet config), then `overrides` (dotted keys)."""
    env = os.environ if env is None else env
    if path is None and env.get(CONFIG_ENV):
        path = Path(env[CONFIG_ENV])
    tree: dict[str, Any] = {}
    if path is not None:
        doc = load_yaml_file(path)
        if doc is not None and not isinstance(doc, dict):
            raise ConfigError(f"{path}: top level must be a mapping, got {describe(doc)}")
        tree = doc or {}
    for layer in layers:
        tree = merge(tree, copy.deepcopy(dict(layer)))  # overrides below mutate the tree
    for dotted, value in (overrides or {}).items():
        _apply_override(tree, dotted, value)
    settings = build(Settings, tree)
    validate(settings)
    return settings


def validate(settings: Settings) -> None:
    """Checks that span sections or need the model catalog (voices are catalog ids)."""
    catalog = load_catalog(settings.models.catalog)
    catalog.check_voice("tts.voice", settings.tts.voice)
    if settings.offload.policy == "remote" and not settings.offload.targets:
        raise ConfigError("offload.policy: 'remote' needs offload.server or offload.servers (tcp://HOST:PORT)")
    for key, voice in [("offload.voice", settings.offload.voice)] + [
        (f"server.voices[{i}]", v) for i, v in enumerate(settings.server.voices)
    ]:
        if voice:
            catalog.check_voice(key, voice)
