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

What is played is fetched and handed over by `requests` (`MediaRequests`); the fetches'
limits and threads are `fetcher`'s: a request beyond them is refused at once and its
announcement finishes unsuccessfully with the reason logged. A connection that closes has
its transfer cut, and closing the assistant cuts every one, so a stalled server delays
nothing.

Threads: the hearing loop calls `begin_turn`, `audio` and `end_turn` from its own
thread and the speaker thread reports statuses; both only hand work to the server's
loop (`call_soon_threadsafe`), where every message is written.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from aioesphomeapi import api_pb2 as pb
from aioesphomeapi.model import VoiceAssistantEventType, VoiceAssistantFeature, VoiceAssistantTimerEventType
from google.protobuf.message import Message

from edge_agent.announce.pipeline import Announcer
from edge_agent.announce.playout import CUE_RATE, chime
from edge_agent.audio.frames import Samples
from edge_agent.audio.wav import to_pcm16
from edge_agent.errors import EdgeError
from edge_agent.esphome.entities import Entities
from edge_agent.esphome.fetcher import Fetcher, MediaLimits
from edge_agent.esphome.player import TrackPlayer
from edge_agent.esphome.requests import Controller, MediaRequests

__all__ = ["MAX_PENDING_CHIMES", "TIMER_CHIMES", "Assistant", "Controller", "MediaLimits"]

log = logging.getLogger(__name__)

TIMER_CHIMES = 3
MAX_PENDING_CHIMES = 4
"""Timer chimes queued at most: a flood of finished timers is a few chimes, not a WAV each."""
EV = VoiceAssistantEventType


@dataclass
class _Turn:
    conversation_id: str
    wake_word: str
    streaming: bool = True
    continue_conversation: bool = False
    answered: bool = False


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
        self._chimes: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.fetcher = Fetcher(media)
        self.budget = self.fetcher.budget
        """What every fetch holds at once, and how many run."""
        self.requests = MediaRequests(announcer, entities, self.fetcher, lambda: self.controller)

    def close(self) -> None:
        self.requests.close()
        if self.player is not None:
            self.player.close()
        for task in self._tasks:
            task.cancel()
        self.fetcher.close()

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
        self.fetcher.cut(connection)
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
            self._spawn(self.requests.play_url(connection, [url], text="(media)", done=lambda *_: None))
        else:
            self._spawn(self.requests.play_track(connection, self.player, url))

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

        await self.requests.play_url(connection, [url], text="(answer)", done=done,
                                     conversation_id=conversation_id)

    async def _announce(self, connection: Controller, request: pb.VoiceAssistantAnnounceRequest) -> None:
        urls = [u for u in (request.preannounce_media_id, request.media_id) if u]

        def done(state: str, error: str | None) -> None:
            connection.post(pb.VoiceAssistantAnnounceFinished(success=state == "done"))
            if state == "done" and request.start_conversation:
                self.open_hearing_turn(f"esphome-{uuid.uuid4().hex}")

        await self.requests.play_url(connection, urls, text=request.text[:200] or "(announcement)", done=done)

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
        tones: Samples = np.tile(chime(CUE_RATE), TIMER_CHIMES)
        self._spawn(self.requests.submit(tones, CUE_RATE, ann_id=f"esphome-timer-{uuid.uuid4().hex}",
                                         done=lambda *_: self._chimes.discard(timer_id),
                                         text="(timer finished)", priority=9, source="esphome timer"))

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("esphome: %s", exc, exc_info=exc if not isinstance(exc, EdgeError) else None)
