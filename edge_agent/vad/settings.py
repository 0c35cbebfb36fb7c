"""The VAD's settings section (`vad`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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
