"""The device as Home Assistant's voice assistant over the ESPHome native API.

Home Assistant subscribes to the voice assistant (`SubscribeVoiceAssistantRequest`);
that connection is the controller, and a newer subscriber replaces it. A turn:

    device -> HA   VoiceAssistantRequest {start, conversation_id, wake_word_phrase}
                   VoiceAssistantAudio {data: 16 kHz s16le}... (from the end of the wake phrase)
    HA -> device   VoiceAssistantEventResponse: run-start, stt-start, stt-vad-start/-end,
                   stt-end {text} (the turn's listening ends here), intent-end
                   {continue_conversation}, tts-start {text}, tts-end {url}, run-end, or error
    device         fetches the answer's URL (WAV: `media`), plays it through the
                   announcement queue as the turn's answer (ahead of queued announcements)
    device -> HA   VoiceAssistantAnnounceFinished once it has been played

A run that ends (run-end) without an answer's URL (an error, an empty response) or a
controller that goes away mid-turn has no answer to wait for: `no_answer` tells the
conversation turn, which resumes announcements at once instead of after
`listen.answer_wait_s`.

`VoiceAssistantAnnounceRequest` (assist_satellite.announce / start_conversation) and a
media player's `play_media` with the announcement flag are fetched and queued as
announcements the same way; `play_media` without it is a track for the media player's
own `TrackPlayer` (one at a time: a new one stops the old before it is fetched, and the
track's samples stay counted in the `MediaBudget` until it ends);
`start_conversation` opens a turn once its announcement has played. A finished timer
plays the chime as an urgent announcement (one pending chime per timer id).

Fetches: one at a time per connection and `media.MAX_FETCHES` on the device (the last
place kept for the controller, so other connections cannot hold up an answer), in the
assistant's own threads (never the loop's shared pool, which the mute, Wyoming and
shutdown use), their memory counted in one `MediaBudget`; a request beyond these is
refused at once and its announcement finishes unsuccessfully with the reason logged.
A connection that closes has its transfer cut, and closing the assistant cuts every
one, so a stalled server delays nothing.

Threads: the hearing loop calls `begin_turn`, `audio` and `end_turn` from its own
thread and the speaker thread reports statuses; both only hand work to the server's
loop (`call_soon_threadsafe`), where every message is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from aioesphomeapi import api_pb2 as pb
from aioesphomeapi.model import VoiceAssistantEventType, VoiceAssistantFeature, VoiceAssistantTimerEventType
from google.protobuf.message import Message

from edge_agent.announce.pipeline import Announcer
from edge_agent.announce.playout import CUE_RATE, chime
from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import resample
from edge_agent.audio.wav import to_pcm16
from edge_agent.errors import EdgeError
from edge_agent.esphome.entities import Entities
from edge_agent.esphome.media import Fetched, MediaBudget, MediaError, Reservation, Transfer, fetch_audio
from edge_agent.esphome.player import Track, TrackPlayer

log = logging.getLogger(__name__)

FINAL = frozenset({"done", "expired", "failed", "rejected"})
TIMER_CHIMES = 3
MAX_PENDING_CHIMES = 4
"""Timer chimes queued at most: a flood of finished timers is a few chimes, not a WAV each."""
EV = VoiceAssistantEventType


class Controller(Protocol):
    """One API connection, as the assistant sees it (the server's `ApiConnection`)."""

    peer: str

    def send(self, *messages: Message) -> bool:
        """Write now (the server's loop); False when the connection is gone or not reading."""
        ...

    def post(self, *messages: Message) -> None:
        """Write from any thread."""
        ...


@dataclass
class _Turn:
    conversation_id: str
    wake_word: str
    streaming: bool = True
    continue_conversation: bool = False
    answered: bool = False


@dataclass(frozen=True)
class MediaLimits:
    max_bytes: int
    timeout_s: float


class Assistant:
    """The voice-assistant side of the ESPHome API: at most one controller at a time."""

    def __init__(self, announcer: Announcer, entities: Entities, media: MediaLimits, *,
                 end_turn: Callable[[str], None], open_turn: Callable[[str], object],
                 on_transcript: Callable[[str, str, str], None] | None = None,
                 no_answer: Callable[[str], None] | None = None,
                 wake_words: Sequence[str] = (), player: TrackPlayer | None = None) -> None:
        self.announcer = announcer
        self.entities = entities
        self.player = player
        """Plays `play_media`'s tracks (None: they are announcements, as before it existed)."""
        if player is not None:
            entities.player = player
            player.on_change = entities.media_changed
        self.media = media
        self.end_hearing_turn = end_turn
        self.open_hearing_turn = open_turn
        self.on_transcript = on_transcript
        self.no_answer = no_answer
        """Told the conversation id of a turn whose run ended without an answer (any thread)."""
        self.wake_words = list(wake_words)
        self.controller: Controller | None = None
        self.turn: _Turn | None = None
        self._waiting: dict[str, Callable[[str, str | None], None]] = {}
        """Announcement id -> told (final state, error) once it is final (any thread)."""
        self._chimes: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._forget = announcer.observe(self._on_status)
        self._tasks: set[asyncio.Task[None]] = set()
        self.budget = MediaBudget.for_limit(media.max_bytes)
        """What every fetch holds at once, and how many run."""
        self._fetcher = ThreadPoolExecutor(self.budget.max_fetches, thread_name_prefix="esphome-media")
        self._fetching: set[int] = set()
        """Connections (their `id`) with a fetch running."""
        self._transfers: dict[Transfer, int] = {}
        """Transfers running -> the connection (its `id`) they are for."""

    def close(self) -> None:
        self._forget()
        if self.player is not None:
            self.player.close()
        for task in self._tasks:
            task.cancel()
        for transfer in list(self._transfers):
            transfer.abort()  # a stalled read returns now: nothing waits for the server
        self._fetcher.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def features() -> int:
        """What `DeviceInfoResponse` says the device does: a wake word here, the microphone over the
        API, announcements, conversations Home Assistant starts, timers; answers come as URLs to
        the media player (no `SPEAKER`: Home Assistant would stream 16 kHz audio instead)."""
        F = VoiceAssistantFeature  # noqa: N806
        return int(F.VOICE_ASSISTANT | F.API_AUDIO | F.ANNOUNCE | F.START_CONVERSATION | F.TIMERS)

    @property
    def pending_chimes(self) -> int:
        """Timer chimes queued and not played yet."""
        return len(self._chimes)

    @property
    def streaming(self) -> bool:
        """A controller is subscribed: a wake word now streams its turn to it (any thread)."""
        return self.controller is not None

    # -- the server's loop: the controller comes and goes ---------------------------------

    def subscribe(self, connection: Controller, subscribe: bool) -> None:
        self._loop = asyncio.get_running_loop()
        if subscribe:
            if self.controller is not None and self.controller is not connection:
                log.info("esphome: Home Assistant's voice connection replaced by a newer one")
            self.controller = connection
            log.info("esphome: Home Assistant (%s) runs the voice assistant", connection.peer)
        elif self.controller is connection:
            self.detach(connection)

    def detach(self, connection: Controller) -> None:
        """`connection` closed (every connection comes here): its fetches are cut, and if it ran the
        voice assistant, its turn ends."""
        for transfer, owner in list(self._transfers.items()):
            if owner == id(connection):
                transfer.abort()
        if self.controller is not connection:
            return
        self.controller = None
        turn, self.turn = self.turn, None
        if turn is not None and turn.streaming:
            self.end_hearing_turn(turn.conversation_id)
        if turn is not None and not turn.answered:
            self._unanswered(turn)
        log.info("esphome: Home Assistant no longer runs the voice assistant")

    # -- the hearing loop's thread --------------------------------------------------------

    def begin_turn(self, conversation_id: str, wake_model: str, wake_word: str, timestamp_s: float) -> None:
        controller = self.controller
        if controller is None:
            self.end_hearing_turn(conversation_id)
            return
        self.turn = _Turn(conversation_id, wake_word)
        log.info("esphome: streaming the command to Home Assistant",
                 extra={"conversation_id": conversation_id})
        controller.post(pb.VoiceAssistantRequest(start=True, conversation_id=conversation_id,
                                                 wake_word_phrase=wake_word))

    def audio(self, conversation_id: str, samples: Samples) -> None:
        turn, controller = self.turn, self.controller
        if turn is None or turn.conversation_id != conversation_id or not turn.streaming:
            return
        if controller is None:
            turn.streaming = False
            self.end_hearing_turn(conversation_id)
            return
        controller.post(pb.VoiceAssistantAudio(data=to_pcm16(samples)))

    def end_turn(self, conversation_id: str) -> None:
        """The hearing loop's turn is over: the audio ends if Home Assistant has not ended it."""
        turn, controller = self.turn, self.controller
        if turn is None or turn.conversation_id != conversation_id:
            return
        if turn.streaming and controller is not None:
            turn.streaming = False
            controller.post(pb.VoiceAssistantAudio(end=True))

    # -- the server's loop: what Home Assistant sends ------------------------------------

    def handle(self, connection: Controller, message: Message) -> None:
        if isinstance(message, pb.SubscribeVoiceAssistantRequest):
            self.subscribe(connection, message.subscribe)
        elif isinstance(message, pb.VoiceAssistantResponse):
            if message.error:
                log.warning("esphome: Home Assistant could not start the pipeline")
                self._stop_listening()
        elif isinstance(message, pb.VoiceAssistantEventResponse):
            if connection is self.controller:
                self._event(connection, message)
        elif isinstance(message, pb.VoiceAssistantAnnounceRequest):
            self._spawn(self._announce(connection, message))
        elif isinstance(message, pb.VoiceAssistantTimerEventResponse):
            self._timer(message)
        elif isinstance(message, pb.VoiceAssistantConfigurationRequest):
            connection.send(self.configuration())
        elif isinstance(message, pb.VoiceAssistantSetConfiguration):
            self.entities.set_wake_words(list(message.active_wake_words))

    def configuration(self) -> pb.VoiceAssistantConfigurationResponse:
        available = self.entities.available_wake_words()
        return pb.VoiceAssistantConfigurationResponse(
            available_wake_words=[pb.VoiceAssistantWakeWord(id=name, wake_word=name.replace("_", " ").title(),
                                                            trained_languages=["en"]) for name in available],
            active_wake_words=self.entities.wake_words(), max_active_wake_words=len(available) or 1)

    def play_media(self, connection: Controller, url: str, *, announcement: bool = False) -> None:
        """A media player's `play_media`: an announcement (no answer expected), or a track."""
        if announcement or self.player is None:
            self._spawn(self._play_url(connection, [url], text="(media)", done=lambda *_: None))
        else:
            self._spawn(self._play_track(connection, self.player, url))

    async def _play_track(self, connection: Controller, player: TrackPlayer, url: str) -> None:
        """Fetch and decode `url`, then hand it to the player; its reservation is released when the
        track ends (played, stopped, replaced), or at once when it cannot be played."""
        track_id = f"esphome-media-{uuid.uuid4().hex[:12]}"
        player.stop()  # the track playing lets go of its memory before the next one is fetched
        try:
            reservation = self._admit(connection)
        except MediaError as exc:
            log.warning("esphome: media from %s refused: %s", connection.peer, exc,
                        extra={"stream": track_id})
            return
        handed = False
        try:
            try:
                fetched = await self._fetch(url, reservation, connection, spoken=False)
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
            self._fetching.discard(id(connection))
            if not handed:
                reservation.release()

    def _event(self, connection: Controller, message: pb.VoiceAssistantEventResponse) -> None:
        kind = message.event_type
        data = {item.name: item.value for item in message.data}
        turn = self.turn
        log.debug("esphome: pipeline event %s %s", kind, data)
        if kind in (EV.VOICE_ASSISTANT_STT_VAD_END, EV.VOICE_ASSISTANT_STT_END):
            self._stop_listening()
            text = data.get("text", "")
            if kind == EV.VOICE_ASSISTANT_STT_END and text and turn is not None and self.on_transcript:
                self.on_transcript(text, turn.conversation_id, turn.wake_word)
        elif kind == EV.VOICE_ASSISTANT_INTENT_END and turn is not None:
            turn.continue_conversation = data.get("continue_conversation") == "1"
        elif kind == EV.VOICE_ASSISTANT_TTS_END and data.get("url"):
            if turn is not None:
                turn.answered = True
            self._spawn(self._answer(connection, turn, data["url"]))
        elif kind == EV.VOICE_ASSISTANT_ERROR:
            log.warning("esphome: Home Assistant: %s (%s)", data.get("message"), data.get("code"))
            self._stop_listening()
        elif kind == EV.VOICE_ASSISTANT_RUN_END and turn is not None and not turn.answered:
            self._stop_listening()
            self.turn = None
            self._unanswered(turn)

    def _unanswered(self, turn: _Turn) -> None:
        log.info("esphome: no answer to wait for", extra={"conversation_id": turn.conversation_id})
        if self.no_answer is not None:
            self.no_answer(turn.conversation_id)

    def _stop_listening(self) -> None:
        turn = self.turn
        if turn is not None and turn.streaming:
            turn.streaming = False
            self.end_hearing_turn(turn.conversation_id)

    async def _answer(self, connection: Controller, turn: _Turn | None, url: str) -> None:
        conversation_id = turn.conversation_id if turn is not None else None

        def done(state: str, error: str | None) -> None:
            connection.post(pb.VoiceAssistantAnnounceFinished(success=state == "done"))
            if turn is not None and state != "done":
                self._unanswered(turn)  # not fetched, say: its status may never have been queued
            if turn is not None and self.turn is turn:
                self.turn = None
                if state == "done" and turn.continue_conversation:
                    self.open_hearing_turn(turn.conversation_id)

        await self._play_url(connection, [url], text="(answer)", done=done, conversation_id=conversation_id)

    async def _announce(self, connection: Controller, request: pb.VoiceAssistantAnnounceRequest) -> None:
        urls = [u for u in (request.preannounce_media_id, request.media_id) if u]

        def done(state: str, error: str | None) -> None:
            connection.post(pb.VoiceAssistantAnnounceFinished(success=state == "done"))
            if state == "done" and request.start_conversation:
                self.open_hearing_turn(f"esphome-{uuid.uuid4().hex}")

        await self._play_url(connection, urls, text=request.text[:200] or "(announcement)", done=done)

    async def _play_url(self, connection: Controller, urls: list[str], *, text: str,
                        done: Callable[[str, str | None], None], conversation_id: str | None = None) -> None:
        kind = "answer" if conversation_id is not None else "announce"
        ann_id = f"esphome-{kind}-{uuid.uuid4().hex}"
        try:
            reservation = self._admit(connection)
        except MediaError as exc:
            log.warning("esphome: %s from %s refused: %s", kind, connection.peer, exc, extra={"id": ann_id})
            done("failed", str(exc))
            return
        try:
            try:
                parts = [await self._fetch(url, reservation, connection) for url in urls]
            except MediaError as exc:
                log.warning("esphome: %s not played: %s", kind, exc, extra={"id": ann_id})
                done("failed", str(exc))
                return
            samples, rate = _join(parts)
            del parts
            self._waiting[ann_id] = done
            stored = await asyncio.to_thread(
                self.announcer.submit_audio, samples, rate, ann_id=ann_id, text=text,
                conversation_id=conversation_id, source=f"esphome {connection.peer}")
            if not stored and self._waiting.pop(ann_id, None) is not None:
                done("failed", "not stored (is the state disk full?)")
        finally:
            self._fetching.discard(id(connection))
            reservation.release()

    def _admit(self, connection: Controller) -> Reservation:
        """A place for one more fetch from `connection`, or `MediaError` saying why there is none."""
        if id(connection) in self._fetching:
            raise MediaError("this connection's previous URL is still being fetched (one at a time)")
        reservation = self.budget.admit(kept=connection is self.controller)
        self._fetching.add(id(connection))
        return reservation

    async def _fetch(self, url: str, reservation: Reservation, connection: Controller, *,
                     spoken: bool = True) -> Fetched:
        """`url` fetched in the assistant's own threads, cut at `media.timeout_s` whatever it sends
        (or when `connection` closes); when `spoken` (an announcement, an answer), no longer than an
        announcement may last (a track is bounded by its decoded size alone)."""
        max_seconds = self.announcer.speaking.settings.max_audio_s if spoken else None
        loop = asyncio.get_running_loop()
        transfer = Transfer()
        self._transfers[transfer] = id(connection)
        cut = loop.call_later(self.media.timeout_s, transfer.abort)
        work = functools.partial(fetch_audio, url, max_bytes=self.media.max_bytes,
                                 timeout_s=self.media.timeout_s, max_seconds=max_seconds,
                                 reservation=reservation, transfer=transfer)
        try:
            return await loop.run_in_executor(self._fetcher, work)
        except RuntimeError as exc:  # the assistant closed: its pool takes nothing new
            raise MediaError(f"not fetched: {exc}") from None
        finally:
            cut.cancel()
            self._transfers.pop(transfer, None)

    def _timer(self, message: pb.VoiceAssistantTimerEventResponse) -> None:
        if message.event_type != VoiceAssistantTimerEventType.VOICE_ASSISTANT_TIMER_FINISHED:
            log.debug("esphome: timer %s: %s", message.timer_id, message.event_type)
            return
        timer_id = message.timer_id[:64]
        if timer_id in self._chimes or len(self._chimes) >= MAX_PENDING_CHIMES:
            log.info("esphome: timer %s finished (a chime is already pending)", timer_id)
            return
        self._chimes.add(timer_id)
        log.info("esphome: timer %s finished", timer_id)
        ann_id = f"esphome-timer-{uuid.uuid4().hex}"
        self._waiting[ann_id] = lambda *_: self._chimes.discard(timer_id)
        tones = np.tile(chime(CUE_RATE), TIMER_CHIMES)
        self._spawn(self._submit_chime(ann_id, tones, timer_id))

    async def _submit_chime(self, ann_id: str, tones: Samples, timer_id: str) -> None:
        stored = await asyncio.to_thread(self.announcer.submit_audio, tones, CUE_RATE, ann_id=ann_id,
                                         text="(timer finished)", priority=9, source="esphome timer")
        if not stored:
            self._waiting.pop(ann_id, None)
            self._chimes.discard(timer_id)

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("esphome: %s", exc, exc_info=exc if not isinstance(exc, EdgeError) else None)

    # -- the speaker thread -----------------------------------------------------------------

    def _on_status(self, doc: dict[str, Any]) -> None:
        state, ann_id = doc.get("state"), doc.get("id")
        if state == "speaking" or state in FINAL:
            self.entities.playing(state == "speaking")
        if state not in FINAL or not isinstance(ann_id, str):
            return
        told = self._waiting.pop(ann_id, None)
        if told is None:
            return
        loop = self._loop
        error = doc.get("error")
        if loop is None:
            told(str(state), error)
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody to tell
            loop.call_soon_threadsafe(told, str(state), error)


def _join(parts: list[Fetched]) -> tuple[Samples, int]:
    """Several WAVs (a pre-announcement chime, then the announcement) as one, at the first's rate."""
    if len(parts) == 1:
        return parts[0].samples, parts[0].sample_rate
    rate = parts[0].sample_rate
    joined = [p.samples if p.sample_rate == rate else resample(p.samples, p.sample_rate, rate) for p in parts]
    return np.concatenate(joined).astype(np.float32), rate
