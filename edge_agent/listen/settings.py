"""The listener's settings section (`listen`): what the microphone is for, and the turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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
