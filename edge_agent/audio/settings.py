"""Audio settings (`audio.*`): the input and output devices or commands, volume, the front end."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from edge_agent.homes import state_home


@dataclass(frozen=True)
class AudioSettings:
    """Sound output and input."""

    output: Literal["sounddevice", "wav", "null"] = "sounddevice"
    """Where speech goes: the sound card, WAV files in `fallback_dir`, or nowhere."""
    output_device: str | None = None
    """PortAudio output device name or index; None is the system default."""
    fallback: Literal["wav", "null", "error"] = "null"
    """What to do when the sound card (or `output_command`) cannot be opened: `null` discards the
    audio (said once in the log; each announcement ends `done` with `played: false`), `wav` writes
    it to `fallback_dir`, `error` fails the announcement. `say` without `--out` never discards:
    with `null` it exits 2 naming the ways round."""
    fallback_dir: Path = field(default_factory=lambda: state_home() / "audio")
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
    Restarted with backoff when it exits; read at most 2x real time. Split like a shell line; no
    shell runs it."""
    input_pipe: str | None = None
    """Listen to raw PCM (`input_rate`, `input_width`, `input_channels`) as it arrives on this
    FIFO (created when missing; writers may come and go; held open while the agent runs, so a
    writer outlives a mute, read and discarded meanwhile; half a sample a writer leaves is
    dropped) or, with `"-"` (quoted in YAML: a bare `-` is a list), on standard input. Read at most
    2x real time."""
    input_rate: int = 16000
    """Hertz of `input_command` / `input_pipe` audio (resampled to the 16 kHz the hearing needs)."""
    input_width: int = 2
    """Bytes per sample of `input_command` / `input_pipe` audio: 1 (U8), 2 (S16_LE), 3 (S24_3LE),
    4 (S32_LE)."""
    input_channels: int = 1
    """Channels to capture from the microphone (PortAudio), or of `input_command` / `input_pipe`
    audio: averaged to mono, or, with `mic_geometry`, steered at the talker by the beamformer."""
    mic_geometry: str | None = None
    """Where the microphones of a multi-channel input are, in channel order: a preset
    (`respeaker_2mic`: 58 mm apart; `respeaker_4mic`: the 4-Mic Pi HAT, a 40.5 mm-radius circle;
    `respeaker_usb_4mic`: the USB Mic Array v2.0's raw channels, a 32 mm-radius circle) or positions
    in metres, `x,y x,y ...`. With it, the beamformer (`beamformer`, `steering`) steers at the
    talker ahead of the echo canceller, gain and suppressor; a dead channel,
    a channel count the geometry lacks or channels far out of step fall back to the loudest channel
    alone, with the reason on `listen.state`. None: channels are averaged (a single microphone
    is unaffected either way)."""
    beamformer: str = "superdirective"
    """How `mic_geometry`'s channels are combined: `superdirective` (MVDR against a diffuse field:
    in a simulated room with three talkers at 10 dB, 2.5 dB more talker over babble than averaging
    with two microphones, 4.3 dB with four) or `delay_sum` (0.3 and 0.6 dB)."""
    steering: str = "wake"
    """How `mic_geometry`'s beams find the talker for the wake word: `wake` (the steered beam and a
    bank of fixed beams from evenly spread directions, five for microphones on a line, eight
    otherwise, each heard by the wake word: one points at the talker before the steering has turned
    to them) or `track` (the steered beam alone, which follows the loudest voice: before the wake
    word, often someone else's). The command is heard on the steered beam either way. Held-out
    real people under three other talkers at 10 dB: `wake` found 0.785 (two microphones) and 0.886
    (four), `track` 0.658 and 0.671, for a wake engine per beam (2-3 % more of a core) and more
    false wakes with four microphones (2.8 an hour against none in that babble)."""
    noise_suppression: int = 0
    """Microphone noise suppression: 0 off, 1..4 from light to strong (`noise_suppressor` says whose).
    WebRTC's levels are its low, moderate, high and very high; speex's pull steady noise down by
    10, 20, 30, 40 dB. Neither removes other voices."""
    noise_suppressor: str = "webrtc"
    """Whose suppressor `noise_suppression` runs: `webrtc` (`webrtc-noise-gain`, as wyoming-satellite;
    about 2.2 ms of CPU per second of audio) or `speex` (`pyspeex-noise`, as Home Assistant's
    pipeline; about 1.7 ms). In `edge-agent bench hear --room` WebRTC's at 2 found as many wake words
    in noise as speex's at 2 behind a gain of 10 (40 of 144 each), one more of 24 in the quiet room,
    and lost fewer words there (command WER 0.19 against 0.25). Speex's alone removes speech quieter
    than about -40 dBFS with the noise: use it with `auto_gain_dbfs`."""
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
        if self.mic_geometry is not None:
            from edge_agent.audio.beamform import parse_geometry

            parse_geometry(self.mic_geometry)
        if self.beamformer not in ("superdirective", "delay_sum"):
            raise ValueError(f"beamformer: {self.beamformer!r} is not superdirective or delay_sum")
        if self.steering not in ("track", "wake"):
            raise ValueError(f"steering: {self.steering!r} is not track or wake")
        if not 0 <= self.noise_suppression <= 4:
            raise ValueError(f"noise_suppression: {self.noise_suppression} is outside 0 (off)..4")
        if self.noise_suppressor not in ("webrtc", "speex"):
            raise ValueError(f"noise_suppressor: {self.noise_suppressor!r} is not webrtc or speex")
        if not 0 <= self.auto_gain_dbfs <= 31:
            raise ValueError(f"auto_gain_dbfs: {self.auto_gain_dbfs} is outside 0 (off)..31")
        if not 50 <= self.echo_tail_ms <= 1000:
            raise ValueError(f"echo_tail_ms: {self.echo_tail_ms} is outside 50..1000")
        if not 20 <= self.echo_max_delay_ms <= 2000:
            raise ValueError(f"echo_max_delay_ms: {self.echo_max_delay_ms} is outside 20..2000")
