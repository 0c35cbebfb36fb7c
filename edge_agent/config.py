"""Typed settings: a tree of frozen dataclasses built from layered sources.

Layers, later wins: the defaults written in the dataclasses below, then a YAML
file, then command-line overrides (`--set tts.threads=1` or a verb's own flag).
Every error names the key path (`tts.voice: unknown voice 'x'`).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from edge_agent.errors import ConfigError
from edge_agent.safeyaml import YamlLimits, load_yaml, load_yaml_file

CONFIG_ENV = "EDGE_AGENT_CONFIG"
"""Environment variable naming the config file when `--config` is not given."""


def _state_home() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME", "~/.local/state")).expanduser() / "edge-speech"


def _cache_home() -> Path:
    env = os.environ.get("EDGE_SPEECH_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "edge-speech"


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
class AudioSettings:
    """Sound output and input."""

    output: Literal["sounddevice", "wav", "null"] = "sounddevice"
    """Where speech goes: the sound card, WAV files in `fallback_dir`, or nowhere."""
    output_device: str | None = None
    """PortAudio output device name or index; None is the system default."""
    fallback: Literal["wav", "null", "error"] = "null"
    """What to do when the sound card cannot be opened."""
    fallback_dir: Path = field(default_factory=lambda: _state_home() / "audio")
    """Where WAV fallback output is written."""
    volume: float = 1.0
    """Output gain, 0..1."""
    input_device: str | None = None
    """PortAudio input device name or index; None is the system default."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.volume <= 1.0:
            raise ValueError(f"volume: {self.volume} is outside 0..1")


@dataclass(frozen=True)
class TtsSettings:
    """Local text-to-speech."""

    voice: str = "en_US-joe-medium"
    """Default voice id (see `edge-agent models list`)."""
    threads: int = 2
    """onnxruntime intra-op threads for synthesis."""
    idle_unload_s: float = 600.0
    """Unload a voice after this many seconds unused; 0 keeps voices loaded."""
    sentence_silence_s: float = 0.2
    """Silence inserted between sentences."""
    length_scale: float | None = None
    """Speaking rate override (larger is slower); None uses the voice's own."""

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads: must be at least 1, not {self.threads}")
        if self.idle_unload_s < 0 or self.sentence_silence_s < 0:
            raise ValueError("idle_unload_s and sentence_silence_s must not be negative")
        if self.length_scale is not None and not 0.2 <= self.length_scale <= 5.0:
            raise ValueError(f"length_scale: {self.length_scale} is outside 0.2..5")


@dataclass(frozen=True)
class VadSettings:
    """Voice activity detection: which frames are speech, where utterances start and end."""

    engine: Literal["webrtc", "silero"] = "webrtc"
    """webrtc: webrtcvad (tiny, no model file); silero: the Silero VAD ONNX model (`silero-vad`)."""
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
class AsrSettings:
    """Speech recognition: Whisper exported to ONNX by `edge-export whisper`."""

    model: str = "whisper-tiny.en"
    """Source model id (its export lives in `<models.cache_dir>/exported/<id>/`) or an export directory."""
    variant: str = ""
    """Exported variant (fp32, int8, fp16, int8-static); empty uses the manifest's default."""
    threads: int = 2
    """onnxruntime intra-op threads for the encoder and decoder."""
    language: str = "en"
    """Spoken language for multilingual models (ignored by English-only ones)."""
    max_tokens: int = 96
    """Most tokens decoded per utterance (a 20 s command needs far fewer)."""
    padding: Literal["bucket", "full"] = "bucket"
    """full: pad every utterance to Whisper's 30 s window; bucket: to speech + margin, rounded up."""
    bucket_s: float = 2.0
    """With `bucket` padding: encoder input lengths are multiples of this."""
    margin_s: float = 5.0
    """With `bucket` padding: silence always added after the speech before rounding up (Whisper
    needs seconds of trailing silence to end cleanly; less makes it repeat itself)."""
    no_speech_threshold: float = 0.6
    """Drop an utterance whose no-speech probability is above this and whose tokens are unsure."""
    min_avg_logprob: float = -1.5
    """Drop an utterance whose tokens average a log-probability below this (noise Whisper made words of)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: must name a model id or an export directory")
        if self.threads < 1:
            raise ValueError(f"threads: must be at least 1, not {self.threads}")
        if not 1 <= self.max_tokens <= 224:
            raise ValueError(f"max_tokens: {self.max_tokens} is outside 1..224")
        if not 0.5 <= self.bucket_s <= 30.0:
            raise ValueError(f"bucket_s: {self.bucket_s} is outside 0.5..30")
        if not 0.0 <= self.margin_s <= 10.0:
            raise ValueError(f"margin_s: {self.margin_s} is outside 0..10")
        if not 0.0 < self.no_speech_threshold <= 1.0:
            raise ValueError(f"no_speech_threshold: {self.no_speech_threshold} is outside 0..1")
        if self.min_avg_logprob > 0:
            raise ValueError(f"min_avg_logprob: {self.min_avg_logprob} is a log-probability, at most 0")


@dataclass(frozen=True)
class ModelSettings:
    """The model store."""

    cache_dir: Path = field(default_factory=lambda: _cache_home() / "models")
    """Where fetched and exported models live (never in git)."""
    catalog: Path | None = None
    """Extra catalog file whose entries add to or replace the built-in ones."""


@dataclass(frozen=True)
class MqttSettings:
    """The MQTT broker connection."""

    broker: str = "mqtt://127.0.0.1:1883"
    """`mqtt://HOST:PORT` or `mqtts://HOST:PORT`; empty disables MQTT."""
    prefix: str = "edge"
    """First topic level of every topic."""

    def __post_init__(self) -> None:
        if self.broker:
            try:
                parse_uri(self.broker, ("mqtt", "mqtts"))
            except ValueError as exc:
                raise ValueError(f"broker: {exc}") from None
        if not self.prefix or any(c in self.prefix for c in "+#\x00"):
            raise ValueError(f"prefix: {self.prefix!r} is not a valid topic prefix")


@dataclass(frozen=True)
class OffloadSettings:
    """Heavy synthesis on an `edge-agent serve` host."""

    policy: Literal["auto", "local", "remote"] = "auto"
    """auto: remote when reachable, local otherwise; local/remote: only that."""
    server: str = ""
    """`tcp://HOST:PORT` of the synthesis server; empty means local only."""

    def __post_init__(self) -> None:
        if self.server:
            try:
                parse_uri(self.server, ("tcp", "tls"))
            except ValueError as exc:
                raise ValueError(f"server: {exc}") from None


@dataclass(frozen=True)
class LoggingSettings:
    """Log output."""

    level: Literal["debug", "info", "warning", "error"] = "info"
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
    models: ModelSettings = field(default_factory=ModelSettings)
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    offload: OffloadSettings = field(default_factory=OffloadSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)


T = TypeVar("T")


@dataclass(frozen=True)
class Endpoint:
    """A parsed `scheme://host:port`."""

    scheme: str
    host: str
    port: int


def parse_uri(uri: str, schemes: tuple[str, ...]) -> Endpoint:
    """Parse `scheme://host:port` (IPv6 hosts in brackets); ValueError says what is wrong."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    if parts.scheme not in schemes:
        raise ValueError(f"{uri!r}: scheme must be one of {', '.join(s + '://' for s in schemes)}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"{uri!r}: expected {parts.scheme}://HOST:PORT")
    return Endpoint(parts.scheme, parts.hostname, port)


def build(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Build dataclass `cls` from plain data, checking keys and types recursively."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {_kind(data)}")
    assert dataclasses.is_dataclass(cls)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = _join(path, str(unknown[0]))
        raise ConfigError(f"{key}: unknown key (expected one of: {', '.join(sorted(fields))})")
    kwargs = {name: _coerce(hints[name], value, _join(path, name)) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:
        msg = str(exc)
        raise ConfigError(f"{_join(path, msg)}" if path else msg) from None


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for candidate in inner:
            try:
                return _coerce(candidate, value, path)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{path}: {value!r} is not one of {choices}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {_kind(value)}")
        return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {_kind(value)}")
        return {
            _coerce(args[0], k, path): _coerce(args[1], v, _join(path, str(k)))
            for k, v in value.items()
        }
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)  # type: ignore[arg-type]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {_kind(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {_kind(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected a number, got {_kind(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {_kind(value)}")
        return value
    if tp is Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: expected a path, got {_kind(value)}")
        return Path(value).expanduser()
    raise ConfigError(f"{path}: unsupported setting type {tp!r}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), f"{type(value).__name__} {value!r}"
    )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


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


def merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge two plain config trees; `top` wins, mappings merge key by key."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def load_settings(
    path: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Defaults, then `path` (or $EDGE_AGENT_CONFIG), then `overrides` (dotted keys)."""
    env = os.environ if env is None else env
    if path is None and env.get(CONFIG_ENV):
        path = Path(env[CONFIG_ENV])
    tree: dict[str, Any] = {}
    if path is not None:
        doc = load_yaml_file(path)
        if doc is not None and not isinstance(doc, dict):
            raise ConfigError(f"{path}: top level must be a mapping, got {_kind(doc)}")
        tree = doc or {}
    for dotted, value in (overrides or {}).items():
        _apply_override(tree, dotted, value)
    settings = build(Settings, tree)
    validate(settings)
    return settings


def validate(settings: Settings) -> None:
    """Checks that span sections or need the model catalog."""
    from edge_agent.models.catalog import load_catalog

    catalog = load_catalog(settings.models.catalog)
    voices = catalog.ids(task="tts")
    if settings.tts.voice not in voices:
        raise ConfigError(
            f"tts.voice: unknown voice {settings.tts.voice!r} (known: {', '.join(voices)})"
        )


def to_dict(obj: Any) -> Any:
    """Plain-data form of a settings tree (paths as strings), for printing and diffing."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
