"""Music and voice together: what the device says and hears ducks or pauses the music.

`MusicCues` sits between the daemon's voice and the players through their small
interface (`duck`/`restore`, `pause`/`resume`, the `Music` protocol): the Sendspin player
and the ESPHome media player's track player alike. An announcement, a
timer's chime (an urgent announcement) and a turn's answer duck the music while they are
spoken; a wake word pauses the music here until the turn ends (`sendspin.pause_on_wake`;
otherwise it ducks), so the microphone hears the talker instead of the band. Every cue is
keyed (announcement id, conversation id), so overlapping ones nest and each is released once.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from edge_agent.listen.hearing import Reopened, TurnEnded, Woke
from edge_agent.listen.turn import HearObserver

log = logging.getLogger(__name__)


class Music(Protocol):
    """What the cues need of a player (`player.SendspinPlayer`, `esphome.player.TrackPlayer`)."""

    def duck(self, reason: str = ...) -> None: ...

    def restore(self, reason: str = ...) -> None: ...

    def pause(self, reason: str = ...) -> None: ...

    def resume(self, reason: str = ...) -> None: ...


class MusicCues(HearObserver):
    """Told the announcement statuses and the turns (any thread); each player is added to `players`
    once it runs."""

    def __init__(self, *, pause_on_wake: bool = True) -> None:
        self.players: list[Music] = []
        self.pause_on_wake = pause_on_wake

    def on_announce_status(self, doc: dict[str, Any]) -> None:
        """`announce.pipeline.Announcer.observe`: duck while an announcement is spoken."""
        ann_id = doc.get("id")
        if not isinstance(ann_id, str):
            return
        for player in list(self.players):
            if doc.get("state") == "speaking":
                player.duck(f"announcement:{ann_id}")
            else:  # done, failed, expired, rejected, or queued again after an interruption
                player.restore(f"announcement:{ann_id}")

    def woke(self, event: Woke) -> None:
        for player in list(self.players):
            if self.pause_on_wake:
                player.pause(f"turn:{event.conversation_id}")
            else:
                player.duck(f"turn:{event.conversation_id}")

    def reopened(self, event: Reopened) -> None:
        for player in list(self.players):
            player.duck(f"turn:{event.conversation_id}")

    def turn_ended(self, event: TurnEnded) -> None:
        for player in list(self.players):
            player.resume(f"turn:{event.conversation_id}")
            player.restore(f"turn:{event.conversation_id}")
