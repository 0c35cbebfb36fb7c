"""What announcements are checked and spoken with, as one immutable bundle.

The bundle is replaced whole (`pipeline.Announcer.swap`, one reference assignment) and never
mutated, so a reader that takes it once (a submission, one announcement being spoken) sees one
consistent set of settings, synthesizer, opener and voices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edge_agent.announce.playout import SinkOpener
from edge_agent.announce.settings import AnnouncementSettings
from edge_agent.tts.voice import Synthesizer


@dataclass(frozen=True)
class Speaking:
    """Everything an announcement is checked and spoken with; replaced whole, never mutated."""

    settings: AnnouncementSettings
    synth: Synthesizer
    opener: SinkOpener
    voices: frozenset[str]
    """Voice ids an announcement may ask for."""


CurrentSpeaking = Callable[[], Speaking]
"""Reads the bundle in use now (each reader takes it once per request or announcement)."""
