"""Hearing: wake word, one command, transcript (`listen.mode`), over any audio source."""

from __future__ import annotations

from edge_agent.listen.hearing import (
    Event,
    Heard,
    Hearing,
    HearingLoop,
    Reopened,
    Streamed,
    TurnEnded,
    Woke,
    build_hearing,
)

__all__ = ["Event", "Heard", "Hearing", "HearingLoop", "Reopened", "Streamed", "TurnEnded", "Woke",
           "build_hearing"]
