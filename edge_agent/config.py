"""Typed settings: a tree of frozen dataclasses built from layered sources.

Layers, later wins: the defaults written in the dataclasses below, then a YAML
file, then command-line overrides (`--set tts.threads=1` or a verb's own flag).
Every error names the key path (`tts.voice: unknown voice 'x'`).
"""

from __future__ import annotations

import base64
import copy
import os
import shlex
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from edge_agent.errors import ConfigError
from edge_agent.models.catalog import load_catalog
from edge_agent.safeyaml import YamlLimits, load_yaml, load_yaml_file
from edge_agent.typedtree import build, describe, merge

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
    output_command: str | None = None
    """Play speech through this command instead of `output`: raw PCM in `output_rate`,
    `output_width` and `output_channels` on its standard input, one run per announcement
    (e.g. `aplay -r 22050 -c 1 -f S16_LE -t raw`, `paplay --raw --rate 22050 --channels 1`,
    `pw-play --rate 22050 --channels 1 -`). Split like a shell line; no shell runs it."""
    output_rate: int = 22050
    """Hertz the output command is told to expect (speech is resampled to it)."""
    output_width: int = 2
    """Bytes per sample for the output command: 1 (U8), 2 (S16_LE), 3 (S24_3LE), 4 (S32_LE)."""
    output_channels: int = 1
    """Channels for the output command (each gets the same mono speech)."""
    input_device: str | None = None
    """PortAudio input device name or index; None is the system default."""
    input_file: Path | None = None
    """Listen to this WAV file instead of the microphone (replaying recordings, testing)."""
    input_command: str | None = None
    """Listen to this command's standard output instead of the microphone: raw PCM in
    `input_rate`, `input_width` and `input_channels` (e.g. `arecord -r 16000 -c 1 -f S16_LE
    -t raw`, `parecord --raw --rate 16000 --channels 1`, `pw-record --rate 16000 --channels 1 -`).
    Restarted with backoff when it exits. Split like a shell line; no shell runs it."""
    input_pipe: str | None = None
    """Listen to raw PCM (`input_rate`, `input_width`, `input_channels`) as it arrives on this
    FIFO (created when missing; writers may come and go) or, with `"-"` (quoted in YAML: a bare
    `-` is a list), on standard input."""
    input_rate: int = 16000
    """Hertz of `input_command` / `input_pipe` audio (resampled to the 16 kHz the hearing needs)."""
    input_width: int = 2
    """Bytes per sample of `input_command` / `input_pipe` audio: 1 (U8), 2 (S16_LE), 3 (S24_3LE),
    4 (S32_LE)."""
    input_channels: int = 1
    """Channels of `input_command` / `input_pipe` audio (averaged to mono)."""
    noise_suppression: int = 0
    """Microphone noise suppression (speex, through `pyspeex-noise`): 0 off, 1..4 attenuate steady
    noise (fans, hum, traffic) by 10, 20, 30, 40 dB. About 1.7 ms of CPU per second of audio at any
    level. It does not remove other voices or music, and alone it removes speech quieter than about
    -40 dBFS with the noise: use it with `auto_gain_dbfs`."""
    auto_gain_dbfs: int = 0
    """Microphone automatic gain, ahead of noise suppression: 0 off, else the level (dB below full
    scale, 1..31) speech peaks are brought to, by at most +30 dB; it learns the talker over a few
    seconds. Helps a far or quiet talker, and lifts the noise with the speech. About 1.3 ms of CPU
    per second of audio."""
    echo_cancel: bool = True
    """Cancel the device's own playback from the microphone (speex echo canceller over the system's
    libspeexdsp, `apt-get install libspeexdsp1`), with what the sound card played as the reference.
    Only acts while something plays (about 10 ms of CPU per second of audio then, under 1 ms idle);
    it learns the room during the first 2-4 s of playback and keeps what it learnt."""
    echo_tail_ms: int = 200
    """Longest echo path the canceller models (room reverberation after the direct path), 50..1000.
    Longer tails cancel more of a reverberant room at more CPU and slower convergence."""
    echo_max_delay_ms: int = 500
    """Longest playback-to-microphone delay searched for (sound card buffers plus the air), 20..2000."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.volume <= 1.0:
            raise ValueError(f"volume: {self.volume} is outside 0..1")
        chosen = [name for name in ("input_file", "input_command", "input_pipe") if getattr(self, name)]
        if len(chosen) > 1:
            raise ValueError(f"{' and '.join(chosen)}: set one of them (each replaces the microphone)")
        for name in ("input_command", "output_command"):
            command = getattr(self, name)
            if command is not None:
                try:
                    argv = shlex.split(command)
                except ValueError as exc:
                    raise ValueError(f"{name}: cannot split {command!r} like a shell line ({exc})") from None
                if not argv:
                    raise ValueError(f"{name}: the command is empty (null means: not used)")
        if self.input_pipe == "":
            raise ValueError("input_pipe: empty (a FIFO path, '-' for standard input, or null)")
        for side in ("input", "output"):
            rate, width, channels = (getattr(self, f"{side}_{k}") for k in ("rate", "width", "channels"))
            if not 8000 <= rate <= 192000:
                raise ValueError(f"{side}_rate: {rate} Hz is outside 8000..192000")
            if width not in (1, 2, 3, 4):
                raise ValueError(f"{side}_width: {width} is not a sample width in bytes "
                                 "(1 = U8, 2 = S16_LE, 3 = S24_3LE, 4 = S32_LE)")
            if not 1 <= channels <= 8:
                raise ValueError(f"{side}_channels: {channels} is outside 1..8")
        if not 0 <= self.noise_suppression <= 4:
            raise ValueError(f"noise_suppression: {self.noise_suppression} is outside 0 (off)..4")
        if not 0 <= self.auto_gain_dbfs <= 31:
            raise ValueError(f"auto_gain_dbfs: {self.auto_gain_dbfs} is outside 0 (off)..31")
        if not 50 <= self.echo_tail_ms <= 1000:
            raise ValueError(f"echo_tail_ms: {self.echo_tail_ms} is outside 50..1000")
        if not 20 <= self.echo_max_delay_ms <= 2000:
            raise ValueError(f"echo_max_delay_ms: {self.echo_max_delay_ms} is outside 20..2000")


@dataclass(frozen=True)
class TtsSettings:
    """Local text-to-speech."""

    voice: str = "en_US-joe-medium"
    """Default voice id (see `edge-agent models list`)."""
    threads: int = 2
    """Cores for synthesis: onnxruntime intra-op threads, or as many single-threaded workers
    (a split Piper voice's vocoder windows and next-sentence fronts)."""
    idle_unload_s: float = 600.0
    """Unload a voice after this many seconds unused; 0 keeps voices loaded."""
    sentence_silence_s: float = 0.2
    """Silence inserted between sentences."""
    length_scale: float | None = None
    """Speaking rate override (larger is slower); None uses the voice's own."""
    noise_scale: float | None = None
    """Piper: how much each take of the voice varies (piper's `--noise-scale`); None uses the voice's
    own, 0 (with `noise_w` 0) makes every take of a text the same samples."""
    noise_w: float | None = None
    """Piper: how much phoneme lengths vary between takes (piper's `--noise-w`); None uses the voice's own."""
    stream_vocoder: bool = True
    """Split Piper voices at the latent and decode the vocoder in windows (first audio sooner)."""

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads: must be at least 1, not {self.threads}")
        if self.idle_unload_s < 0 or self.sentence_silence_s < 0:
            raise ValueError("idle_unload_s and sentence_silence_s must not be negative")
        if self.length_scale is not None and not 0.2 <= self.length_scale <= 5.0:
            raise ValueError(f"length_scale: {self.length_scale} is outside 0.2..5")
        for name, scale in (("noise_scale", self.noise_scale), ("noise_w", self.noise_w)):
            if scale is not None and not 0.0 <= scale <= 2.0:
                raise ValueError(f"{name}: {scale} is outside 0..2")


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
    """Exported variant (fp32, int8, fp16, int4, int8-static); empty uses the manifest's default."""
    threads: int = 2
    """onnxruntime intra-op threads for the encoder."""
    decoder_threads: int = 1
    """onnxruntime intra-op threads for the decoder (one token at a time: a second thread costs more
    in hand-offs than it saves; tiny.en int8, interleaved: 8.3 vs 11.5 ms a token, fp32 15.4 vs 19.8)."""
    language: str = "en"
    """Spoken language for multilingual models (ignored by English-only ones)."""
    max_tokens: int = 96
    """Most tokens decoded per utterance (a 20 s command needs far fewer)."""
    beam_size: int = 1
    """Hypotheses kept while decoding: 1 is greedy; 5 is Whisper's and faster-whisper's beam search,
    at about that many times the decoder's time (the exported decoder runs one hypothesis at a time)."""
    padding: Literal["bucket", "full"] = "bucket"
    """full: pad every utterance to Whisper's 30 s window; bucket: to speech + margin, rounded up."""
    bucket_s: float = 2.0
    """With `bucket` padding: encoder input lengths are multiples of this."""
    margin_s: float = 5.0
    """With `bucket` padding: silence always added after the speech before rounding up (Whisper
    needs seconds of trailing silence to end cleanly; less makes it repeat itself)."""
    retry_logprob: float = -0.6
    """With `bucket` padding: a result whose tokens average a log-probability below this is decoded
    again in Whisper's own 30 s window, and that result is kept (a short window loses or mishears
    words the model is unsure of: 1 of 154 sweep clips lost two words, all at or below -0.8)."""
    no_speech_threshold: float = 0.6
    """Drop an utterance whose no-speech probability is above this and whose tokens are unsure."""
    min_avg_logprob: float = -1.5
    """Drop an utterance whose tokens average a log-probability below this (noise Whisper made words of)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: must name a model id or an export directory")
        if self.threads < 1:
            raise ValueError(f"threads: must be at least 1, not {self.threads}")
        if self.decoder_threads < 1:
            raise ValueError(f"decoder_threads: must be at least 1, not {self.decoder_threads}")
        if not 1 <= self.max_tokens <= 224:
            raise ValueError(f"max_tokens: {self.max_tokens} is outside 1..224")
        if not 1 <= self.beam_size <= 16:
            raise ValueError(f"beam_size: {self.beam_size} is outside 1..16")
        if not 0.5 <= self.bucket_s <= 30.0:
            raise ValueError(f"bucket_s: {self.bucket_s} is outside 0.5..30")
        if not 0.0 <= self.margin_s <= 10.0:
            raise ValueError(f"margin_s: {self.margin_s} is outside 0..10")
        if self.retry_logprob > 0:
            raise ValueError(f"retry_logprob: {self.retry_logprob} is a log-probability, at most 0")
        if not 0.0 < self.no_speech_threshold <= 1.0:
            raise ValueError(f"no_speech_threshold: {self.no_speech_threshold} is outside 0..1")
        if self.min_avg_logprob > 0:
            raise ValueError(f"min_avg_logprob: {self.min_avg_logprob} is a log-probability, at most 0")


WAKE_BUILTIN = ("okay_nabu", "hey_jarvis", "alexa", "hey_mycroft")
"""microWakeWord models bundled with pymicro-wakeword."""


@dataclass(frozen=True)
class WakeSettings:
    """Wake word: microWakeWord models (TensorFlow Lite) on the microphone's 16 kHz stream."""

    models: tuple[str, ...] = ("okay_nabu",)
    """Built-in names (okay_nabu, hey_jarvis, alexa, hey_mycroft) or the path of a microWakeWord
    model's `.json`, whose `model` key names its `.tflite` beside it."""
    probability_cutoff: dict[str, float] = field(default_factory=dict)
    """Per model name (the `.tflite`'s stem): fire above this probability instead of the model's own."""
    refractory_s: float = 2.0
    """After a detection, ignore every model for this long (one utterance wakes once)."""
    during_playback: Literal["barge_in", "ignore"] = "barge_in"
    """A wake word while the device speaks: pause the announcement and start a turn, or ignore it."""
    chime: bool = True
    """Play a short chime when a turn starts (the user's cue to speak)."""

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("models: name at least one wake word model (or set listen.mode)")
        for name, cutoff in self.probability_cutoff.items():
            if not 0.0 < cutoff < 1.0:
                raise ValueError(f"probability_cutoff.{name}: {cutoff} is outside 0..1")
        if not 0.0 <= self.refractory_s <= 60.0:
            raise ValueError(f"refractory_s: {self.refractory_s} is outside 0..60")


@dataclass(frozen=True)
class ListenSettings:
    """What the microphone is used for, and the conversation turn."""

    mode: Literal["wake", "always", "off"] = "wake"
    """wake: transcribe one command after a wake word; always: transcribe everything; off: no microphone."""
    command_timeout_s: float = 8.0
    """A turn ends this long after it opened if the command has not ended by itself."""
    early_end_ms: int = 0
    """In a turn, decode at the first pause this long and end the turn there when Whisper hears a
    complete sentence (0, the default: the turn ends where the VAD's hangover ends the utterance;
    an early end drops a second sentence said after a pause longer than this)."""
    lookback_ms: int = 150
    """A turn's audio starts this long before the wake word was detected (the model decides 0.05-0.2 s
    after the phrase has ended), so a command said without a pause keeps its first word; longer takes
    in the phrase's last syllable, which Whisper writes as a word (200 ms: 'off, turn on ...')."""
    answer_wait_s: float = 5.0
    """An announcement paused by a turn waits this long for the turn's answer before it resumes."""

    def __post_init__(self) -> None:
        if not 1.0 <= self.command_timeout_s <= 60.0:
            raise ValueError(f"command_timeout_s: {self.command_timeout_s} is outside 1..60")
        if not 0 <= self.early_end_ms <= 2000:
            raise ValueError(f"early_end_ms: {self.early_end_ms} is outside 0..2000")
        if not 0 <= self.lookback_ms <= 1000:
            raise ValueError(f"lookback_ms: {self.lookback_ms} is outside 0..1000")
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


@dataclass(frozen=True)
class AnnouncementSettings:
    """Announcements received over MQTT."""

    state_dir: Path = field(default_factory=lambda: _state_home() / "announcements")
    """Journal of accepted announcements and the ids already seen (survives restarts)."""
    max_payload_bytes: int = 65536
    """Larger announcement payloads are rejected unparsed."""
    max_text_chars: int = 5000
    """Longest text, counted as written and again once normalised (numbers, units and
    ligatures spelled out: one character can become dozens)."""
    max_audio_s: float = 600.0
    """Longest audio one announcement may become; speaking stops there and its `done`
    status says `truncated` with the reason."""
    default_priority: int = 5
    """Priority of announcements that do not name one (0 low .. 9 urgent)."""
    interrupt: bool = True
    """A higher-priority announcement interrupts the one speaking at its next sentence
    boundary; the interrupted one resumes afterwards from the following sentence."""
    queue_max: int = 1000
    """Most announcements waiting; beyond that new ones are rejected."""
    dedupe_max_ids: int = 100000
    """Ids remembered to refuse repeats; the oldest finished ones are forgotten first."""
    dedupe_max_age_days: float = 30.0
    """Finished ids older than this are forgotten."""

    def __post_init__(self) -> None:
        if not 256 <= self.max_payload_bytes <= 16777216:
            raise ValueError(f"max_payload_bytes: {self.max_payload_bytes} is outside 256..16777216")
        if self.max_text_chars < 1:
            raise ValueError(f"max_text_chars: {self.max_text_chars} is below 1")
        if not self.max_audio_s > 0:
            raise ValueError(f"max_audio_s: {self.max_audio_s} must be positive")
        if not 0 <= self.default_priority <= 9:
            raise ValueError(f"default_priority: {self.default_priority} is outside 0..9")
        if self.queue_max < 1 or self.dedupe_max_ids < 1 or self.dedupe_max_age_days <= 0:
            raise ValueError("queue_max, dedupe_max_ids and dedupe_max_age_days must be positive")


FLEET_ALWAYS_PROTECTED = ("device.id", "fleet")
"""Keys no fleet config may set, whatever `fleet.protected_keys` says."""


@dataclass(frozen=True)
class FleetSettings:
    """Signed configuration pushed by the fleet operator."""

    trusted_keys: tuple[str, ...] = ()
    """Ed25519 public keys (base64 of the 32 raw bytes, as `edge-agent fleet keygen` prints)
    whose signatures are accepted; empty refuses every fleet config."""
    protected_keys: tuple[str, ...] = (
        "device.id", "fleet", "mqtt", "models", "announcements.state_dir", "daemon",
    )
    """Dotted keys (a section protects everything below it) a fleet config may not set.
    `device.id` and `fleet` are always protected."""
    state_dir: Path = field(default_factory=lambda: _state_home() / "fleet")
    """Active and previous config, the highest version applied, the inbox."""
    max_payload_bytes: int = 262144
    """Larger config payloads are rejected unparsed."""
    max_model_bytes: int = 2147483648
    """Largest model file a fleet config may ask to download."""
    download_timeout_s: float = 30.0
    """Socket timeout of model downloads (per read, not for the whole file)."""
    download_attempts: int = 5
    """Tries per file; each resumes where the last stopped (HTTP Range)."""
    probe_timeout_s: float = 120.0
    """Time allowed to test-load a downloaded model in a separate process."""

    def __post_init__(self) -> None:
        for key in self.trusted_keys:
            try:
                raw = base64.b64decode(key, validate=True)
            except ValueError:
                raw = b""
            if len(raw) != 32:
                raise ValueError(f"trusted_keys: {key[:16]!r}... is not a base64 Ed25519 public key")
        if self.max_payload_bytes < 1024 or self.max_model_bytes < 1:
            raise ValueError("max_payload_bytes (>= 1024) and max_model_bytes must be positive")
        if self.download_attempts < 1 or self.download_timeout_s <= 0 or self.probe_timeout_s <= 0:
            raise ValueError("download_attempts, download_timeout_s and probe_timeout_s must be positive")

    @property
    def protected(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*FLEET_ALWAYS_PROTECTED, *self.protected_keys)))


@dataclass(frozen=True)
class DaemonSettings:
    """`edge-agent run`."""

    out_dir: Path | None = None
    """Write each announcement to `<out_dir>/<id>.wav` instead of the sound card."""
    metrics_s: float = 60.0
    """How often a metrics snapshot is published; 0 turns it off."""
    listen: bool = True
    """Listen and publish transcripts when an ASR model is present."""
    state_dir: Path = field(default_factory=lambda: _state_home() / "daemon")
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
        _positive(self, "resolve_interval_s", "connect_timeout_s", "first_audio_deadline_s",
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
        _positive(self, "workers", "threads", "queue_bound", "max_connections", "max_handshakes",
                  "max_streams_per_connection", "max_text_chars", "max_sentence_chars", "chunk_ms",
                  "opus_bitrate", "handshake_timeout_s", "idle_timeout_s", "frame_timeout_s",
                  "write_timeout_s")
        if self.shutdown_grace_s < 0 or self.metrics_interval_s < 0:
            raise ValueError("shutdown_grace_s and metrics_interval_s must not be negative")
        if self.max_handshakes_per_source < 0:
            raise ValueError("max_handshakes_per_source: must not be negative (0 is no cap)")
        _frame_limit(self.max_frame_bytes)


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ValueError(f"{name}: must be positive, not {value}")


def _frame_limit(value: int) -> None:
    if not 4096 <= value <= 16 * 1024 * 1024:
        raise ValueError(f"max_frame_bytes: {value} is outside 4096..16777216")


@dataclass(frozen=True)
class WyomingSettings:
    """The Wyoming server (`edge-agent wyoming`, or inside `run` when `enabled`)."""

    enabled: bool = False
    """Serve Wyoming inside `edge-agent run`, sharing the daemon's voice and models."""
    uri: str = "tcp://0.0.0.0:10300"
    """`tcp://HOST:PORT` to listen on (port 0 picks a free one). Inside `edge-agent run` with
    `satellite` on, this endpoint is the satellite's and the services are on `services_uri`."""
    services_uri: str = "tcp://0.0.0.0:10701"
    """Inside `edge-agent run` with `satellite` on: `tcp://HOST:PORT` of the device's text to
    speech, speech to text and wake word (Home Assistant loads no services from an endpoint whose
    `info` has a satellite, so they get their own, advertised as `<device id>-services`).
    Unused otherwise: `uri` serves them."""
    zeroconf: bool = True
    """Advertise the service as `_wyoming._tcp.local.` (named after the device id)."""
    satellite: bool = True
    """Inside `edge-agent run`: offer the device to Home Assistant as an Assist satellite (the
    wake word here, the command's audio streamed to Home Assistant, its answers, announcements
    and timer chimes played here)."""
    max_connections: int = 16
    """Connections open at a time. When all are taken, a new one displaces the connection idle the
    longest (pings do not count as activity) that has nothing in flight; when every one is working,
    the new one is answered `busy` and closed."""
    idle_timeout_s: float = 60.0
    """A connection that sends nothing for this long is closed (Home Assistant's satellite side
    pings every few seconds; a service client opens a connection per request)."""
    event_timeout_s: float = 10.0
    """Once an event's header line has begun, the whole event must arrive within this long."""
    max_header_bytes: int = 8192
    """Longest event header line (the JSON before the data and payload)."""
    max_data_bytes: int = 65536
    """Largest `data_length` accepted."""
    max_payload_bytes: int = 262144
    """Largest `payload_length` accepted (an audio chunk: 1 s of 48 kHz stereo s16le is 192 kB)."""
    max_audio_s: float = 30.0
    """Longest audio a `transcribe` may send; more is refused with an error."""
    max_text_chars: int = 20000
    """Most characters one `synthesize` (or one streamed synthesis) may send."""
    max_speech_s: float = 600.0
    """Most audio one `synthesize` (or one streamed synthesis) is given; the rest is cut and logged.
    What costs is what is spoken: a few characters can normalise into many words."""
    samples_per_chunk: int = 1024
    """Samples per `audio-chunk` event sent to the client."""
    max_wake_speed: float = 2.0
    """Most seconds of audio one connection's wake word stream (`detect`) is listened to per second.
    A live microphone sends one a second; a client sending faster waits (nothing is dropped), after
    a head start of a few seconds (a satellite's buffered audio), so no client can keep a core busy."""
    max_announce_bytes: int = 32 * 1024 * 1024
    """Most memory the audio Home Assistant sends the satellite to play (an announcement or an
    answer) may take while it arrives: mono float32 at its own rate, so 32 MiB holds 380 s at
    Home Assistant's 22050 Hz (and 174 s at 48 kHz). A longer stream is refused with one error
    and the rest of it dropped; `announcements.max_audio_s` still bounds its length."""

    def __post_init__(self) -> None:
        endpoints = []
        for name in ("uri", "services_uri"):
            try:
                endpoints.append(parse_uri(getattr(self, name), ("tcp",)))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        satellite, services = endpoints
        if self.satellite and services.port != 0 and (satellite.host, satellite.port) == \
                (services.host, services.port):
            raise ValueError(f"services_uri: {self.services_uri!r} is the satellite's uri; the "
                             "services need an endpoint of their own")
        _positive(self, "max_connections", "idle_timeout_s", "event_timeout_s", "max_header_bytes",
                  "max_data_bytes", "max_payload_bytes", "max_audio_s", "max_text_chars",
                  "max_speech_s", "samples_per_chunk", "max_wake_speed", "max_announce_bytes")
        if self.max_header_bytes < 256:
            raise ValueError(f"max_header_bytes: {self.max_header_bytes} is below 256")


@dataclass(frozen=True)
class HermesSettings:
    """Hermes (Rhasspy's MQTT protocol) on the daemon's broker."""

    enabled: bool = False
    """Speak Hermes on the daemon's MQTT broker (`edge-agent run`)."""
    site_id: str = ""
    """Hermes site id this device answers to; empty means the device id."""

    def __post_init__(self) -> None:
        if any(c in self.site_id for c in "/+#\x00"):
            raise ValueError(f"site_id: {self.site_id!r} may not contain '/', '+', '#' or NUL")


@dataclass(frozen=True)
class LoggingSettings:
    """Log output."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    json: bool = False
    """One JSON object per line (the daemon's default under systemd)."""


@dataclass(frozen=True)
class EsphomeSettings:
    """The ESPHome native API inside `edge-agent run`: the device as Home Assistant's voice
    assistant, discovered as `_esphomelib._tcp` like linux-voice-assistant (plain text)."""

    enabled: bool = False
    """Serve the ESPHome native API (needs Python 3.11 or later: aioesphomeapi's)."""
    host: str = "0.0.0.0"
    """Address to listen on."""
    port: int = 6053
    """Port to listen on (6053 is ESPHome's; 0 picks a free one)."""
    name: str = ""
    """The device's name in Home Assistant (empty: the device id)."""
    encryption_key: str = ""
    """The Noise-encrypted transport's pre-shared key, base64 of 32 bytes (`openssl rand -base64 32`),
    the same as typed into Home Assistant; every connection is then encrypted and a plain-text client
    is refused. Empty: plain text."""
    zeroconf: bool = True
    """Advertise `_esphomelib._tcp.local.` so Home Assistant discovers the device."""
    max_connections: int = 8
    """Connections beyond this are refused."""
    max_frame_bytes: int = 65536
    """Largest frame accepted; a larger claimed length closes the connection before anything is read."""
    idle_timeout_s: float = 90.0
    """A connection that sends nothing (not even a ping) for this long is closed."""
    max_buffered_bytes: int = 1048576
    """Outgoing bytes a connection may leave unread before it is closed."""
    media_max_bytes: int = 16777216
    """Largest audio fetched from a URL Home Assistant sends (a TTS answer, an announcement)."""
    media_timeout_s: float = 20.0
    """Longest time to fetch one such URL, the whole transfer."""

    def __post_init__(self) -> None:
        if self.encryption_key:
            try:
                key = base64.b64decode(self.encryption_key, validate=True)
            except ValueError:
                key = b""
            if len(key) != 32:
                raise ValueError("encryption_key: not base64 of 32 bytes (make one with "
                                 "`openssl rand -base64 32`)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: {self.port} is outside 0..65535")
        for name in ("max_connections", "max_frame_bytes", "max_buffered_bytes", "media_max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1")
        for name in ("idle_timeout_s", "media_timeout_s"):
            if not 0.0 < getattr(self, name) <= 3600.0:
                raise ValueError(f"{name}: {getattr(self, name)} is outside 0..3600")


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


@dataclass(frozen=True)
class Endpoint:
    """A parsed `scheme://host:port`."""

    scheme: str
    host: str
    port: int


def parse_uri(uri: str, schemes: tuple[str, ...]) -> Endpoint:
    """Parse `scheme://host:port` (IPv6 hosts in brackets); ValueError says what is wrong."""
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
