"""Where a streamed turn goes: a remote side that transcribes it (Home Assistant).

`RemoteRouter` (a `HearObserver` of the conversation turn) asks each `RemoteTurns`
whether it is `streaming` (a controller is connected) when a wake word opens a
turn, and hands that turn's events to the first that is: `begin_turn`, then
`audio` blocks (16 kHz, from where the wake phrase ended), then `end_turn`. All
three are called on the hearing loop's thread and must only queue work. The
remote side ends the turn early through the `end_turn` callback it was given (it
has its transcript), and says when its run ended without an answer through the
`no_answer` callback (`Conversation.unanswered`), so announcements held for the
answer resume at once rather than after `listen.answer_wait_s`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from edge_agent.audio.frames import Samples
from edge_agent.listen.hearing import Reopened, Streamed, TurnEnded, Woke
from edge_agent.listen.turn import HearObserver


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


class RemoteRouter(HearObserver):
    """Hands each streamed turn to the first taker that is `streaming` when its wake word fires.

    `takers()` lists who may take a turn, in order of preference (asked at each wake word: the
    services start after the listener). With none streaming, the turn is ended at once through
    `end_turn` (the hearing loop's), so the device does not wait for a transcript no one makes.
    """

    def __init__(self, takers: Callable[[], Sequence[RemoteTurns]],
                 end_turn: Callable[[str], None]) -> None:
        self._takers = takers
        self._end_turn = end_turn
        self._current: RemoteTurns | None = None
        """Where the current wake word's turn streams (the listener thread's alone)."""

    def streaming(self) -> bool:
        """Whether a wake word heard now streams its turn (the hearing loop asks)."""
        return any(taker.streaming for taker in self._takers())

    def woke(self, event: Woke) -> None:
        if not event.streamed:
            return
        self._current = next((t for t in self._takers() if t.streaming), None)
        if self._current is None:
            self._end_turn(event.conversation_id)
        else:
            found = event.detection
            self._current.begin_turn(event.conversation_id, found.model, found.wake_word, found.time)

    def reopened(self, event: Reopened) -> None:
        """A conversation continued without a wake word: the same kind of turn, with no phrase."""
        self._current = next((t for t in self._takers() if t.streaming), None)
        if self._current is None:
            self._end_turn(event.conversation_id)
        else:
            self._current.begin_turn(event.conversation_id, "", "", 0.0)

    def streamed(self, event: Streamed) -> None:
        if self._current is not None:
            self._current.audio(event.conversation_id, event.samples)

    def turn_ended(self, event: TurnEnded) -> None:
        if self._current is not None:
            self._current.end_turn(event.conversation_id)
            self._current = None
