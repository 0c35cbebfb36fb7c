"""Announcement settings (`announcements.*`): limits, the journal, expiry."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.homes import state_home


@dataclass(frozen=True)
class AnnouncementSettings:
    """Announcements received over MQTT."""

    state_dir: Path = field(default_factory=lambda: state_home() / "announcements")
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
