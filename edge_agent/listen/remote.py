"""Where a streamed turn goes: a remote side that transcribes it (Home Assistant).

The daemon asks each `RemoteTurns` whether it is `streaming` (a controller is
connected) when a wake word opens a turn, and hands that turn's events to the
first that is: `begin_turn`, then `audio` blocks (16 kHz, from where the wake
phrase ended), then `end_turn`. All three are called on the hearing loop's thread
and must only queue work. The remote side ends the turn early through the
`end_turn` callback it was given (it has its transcript).
"""

from __future__ import annotations

from typing import Protocol

from edge_agent.audio.frames import Samples


class RemoteTurns(Protocol):
    """The Wyoming satellite and the ESPHome API's voice assistant."""

    @property
    def streaming(self) -> bool:
        """A controller is connected: a wake word now streams its turn to it (any thread)."""
        ...

    def begin_turn(self, conversation_id: str, wake_model: str, wake_word: str, timestamp_s: float) -> None:
        ...

    def audio(self, conversation_id: str, samples: Samples) -> None:
        ...

    def end_turn(self, conversation_id: str) -> None:
        ...
