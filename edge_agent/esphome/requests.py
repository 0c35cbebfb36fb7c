"""What Home Assistant asks the device to play, fetched and handed to what plays it.

A URL to speak (a turn's answer, an announcement with its pre-announcement chime, a media
player's `play_media` with the announcement flag) is fetched (`fetcher`), joined into one
clip and queued as an audio announcement; its `done(state, error)` is told on the server's
loop once the announcement is final. A track (`play_media` without the flag) is fetched for
the media player's own `TrackPlayer`, one at a time: a new one stops the old before it is
fetched, and the track's samples stay counted in the `MediaBudget` until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from google.protobuf.message import Message

from edge_agent.announce.pipeline import Announcer
from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import resample
from edge_agent.esphome.entities import Entities
from edge_agent.esphome.fetcher import Fetcher
from edge_agent.esphome.media import Fetched, MediaError
from edge_agent.esphome.player import Track, TrackPlayer

# A child of the assistant's logger, whose part this was: its level and filters cover this too.
log = logging.getLogger("edge_agent.esphome.assistant.requests")

FINAL = frozenset({"done", "expired", "failed", "rejected"})

Done = Callable[[str, str | None], None]
"""Told an announcement's final state and error, on the server's loop."""


class Controller(Protocol):
    """One API connection, as the assistant sees it (the server's `ApiConnection`)."""

    peer: str

    def send(self, *messages: Message) -> bool:
        """Write now (the server's loop); False when the connection is gone or not reading."""
        ...

    def post(self, *messages: Message) -> None:
        """Write from any thread."""
        ...


class MediaRequests:
    """Fetches and hand-overs on the server's loop; the announcer's statuses on the speaker's thread."""

    def __init__(self, announcer: Announcer, entities: Entities, fetcher: Fetcher,
                 controller: Callable[[], Controller | None]) -> None:
        self.announcer = announcer
        self.entities = entities
        self.fetcher = fetcher
        self.controller = controller
        """The connection that runs the voice assistant now (its fetches may take the last place)."""
        self._waiting: dict[str, tuple[Done, asyncio.AbstractEventLoop]] = {}
        """Announcement id -> told (final state, error) once it is final, and on which loop."""
        self._forget = announcer.observe(self._on_status)

    def close(self) -> None:
        self._forget()

    async def play_url(self, connection: Controller, urls: list[str], *, text: str, done: Done,
                       conversation_id: str | None = None) -> None:
        """Fetch `urls`, join them and queue them as one announcement (an answer of the turn
        `conversation_id`, if given); `done` is told its end, or at once why it failed."""
        kind = "answer" if conversation_id is not None else "announce"
        ann_id = f"esphome-{kind}-{uuid.uuid4().hex}"
        try:
            reservation = self.fetcher.admit(connection, kept=connection is self.controller())
        except MediaError as exc:
            log.warning("esphome: %s from %s refused: %s", kind, connection.peer, exc, extra={"id": ann_id})
            done("failed", str(exc))
            return
        try:
            try:
                parts = [await self.fetcher.fetch(url, reservation, connection,
                                                  max_seconds=self.announcer.speaking.settings.max_audio_s)
                         for url in urls]
            except MediaError as exc:
                log.warning("esphome: %s not played: %s", kind, exc, extra={"id": ann_id})
                done("failed", str(exc))
                return
            samples, rate = _join(parts)
            del parts
            await self.submit(samples, rate, ann_id=ann_id, done=done, text=text,
                              conversation_id=conversation_id, source=f"esphome {connection.peer}")
        finally:
            self.fetcher.done(connection)
            reservation.release()

    async def play_track(self, connection: Controller, player: TrackPlayer, url: str) -> None:
        """Fetch and decode `url`, then hand it to the player; its reservation is released when the
        track ends (played, stopped, replaced), or at once when it cannot be played."""
        track_id = f"esphome-media-{uuid.uuid4().hex[:12]}"
        player.stop()  # the track playing lets go of its memory before the next one is fetched
        try:
            reservation = self.fetcher.admit(connection, kept=connection is self.controller())
        except MediaError as exc:
            log.warning("esphome: media from %s refused: %s", connection.peer, exc,
                        extra={"stream": track_id})
            return
        handed = False
        try:
            try:
                fetched = await self.fetcher.fetch(url, reservation, connection, max_seconds=None)
            except MediaError as exc:
                log.warning("esphome: media not played: %s", exc, extra={"stream": track_id})
                return
            reservation.keep()  # the fetch's place is free; the samples stay counted while they play

            def ended(why: str) -> None:
                reservation.release()
                log.info("esphome: media %s", why, extra={"stream": track_id})

            player.play(Track(track_id, fetched.samples, fetched.sample_rate, on_end=ended))
            handed = True
        finally:
            self.fetcher.done(connection)
            if not handed:
                reservation.release()

    async def submit(self, samples: Samples, rate: int, *, ann_id: str, done: Done, text: str,
                     source: str, conversation_id: str | None = None, priority: int | None = None) -> None:
        """Queue `samples` as audio announcement `ann_id`; `done` is told its end (on this loop), or
        at once when it could not be stored."""
        self._waiting[ann_id] = (done, asyncio.get_running_loop())
        stored = await asyncio.to_thread(
            self.announcer.submit_audio, samples, rate, ann_id=ann_id, text=text, priority=priority,
            conversation_id=conversation_id, source=source)
        if not stored and self._waiting.pop(ann_id, None) is not None:
            done("failed", "not stored (is the state disk full?)")

    def _on_status(self, doc: dict[str, Any]) -> None:
        """The speaker thread: the media player shows the announcer playing; a final state is told."""
        state, ann_id = doc.get("state"), doc.get("id")
        if state == "speaking" or state in FINAL:
            self.entities.playing(state == "speaking")
        if state not in FINAL or not isinstance(ann_id, str):
            return
        waiting = self._waiting.pop(ann_id, None)
        if waiting is None:
            return
        told, loop = waiting
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody to tell
            loop.call_soon_threadsafe(told, str(state), doc.get("error"))


def _join(parts: list[Fetched]) -> tuple[Samples, int]:
    """Several WAVs (a pre-announcement chime, then the announcement) as one, at the first's rate."""
    if len(parts) == 1:
        return parts[0].samples, parts[0].sample_rate
    rate = parts[0].sample_rate
    joined = [p.samples if p.sample_rate == rate else resample(p.samples, p.sample_rate, rate) for p in parts]
    return np.concatenate(joined).astype(np.float32), rate
