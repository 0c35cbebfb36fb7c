"""The Wyoming satellite: Home Assistant drives this device's microphone and speaker.

Home Assistant connects as a client, asks `describe` (our `info` has a `satellite`
section), sends `run-satellite` and pings every few seconds. From then on that
connection is the satellite's controller; a newer `run-satellite` (Home Assistant
reconnecting while the old socket still looks open) replaces it, `pause-satellite`
or a closed connection ends it.

After a local wake word (the daemon's hearing loop, `listen.Hearing.stream_turns`):

    device -> HA   detection, run-pipeline {start_stage: asr, end_stage: tts},
                   audio-start, audio-chunk (16 kHz s16le, the command as it is spoken)...
    HA -> device   voice-started, voice-stopped, transcript (or error): the turn ends here
                   (`Hearing.end_turn`) and the device sends audio-stop
    HA -> device   synthesize {text}, audio-start, audio-chunk..., audio-stop: the answer
    device -> HA   played, once the answer has been played

Audio Home Assistant sends outside a turn (`assist_satellite.announce`: 22050 Hz
s16le) is an announcement. Both go through the announcement queue
(`Announcer.submit_audio`: priority, journal, one playback at a time; an answer is
spoken ahead of queued announcements) and `played` is sent when the queue reports
the id `done` (`error` if it is rejected or fails). `timer-finished` plays the
chime as an urgent announcement; the other timer events are logged.

Threads: the hearing loop calls `begin_turn`, `audio` and `end_turn` from its own
thread; they only queue events for the controller's writer task on the server's
loop, which is bounded (`MAX_PENDING` events: a controller that stops reading
loses the turn, not the device's memory). The speaker thread's status observer
hands `played` back to the loop the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from wyoming.audio import AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Satellite
from wyoming.pipeline import PipelineStage, RunPipeline
from wyoming.snd import Played
from wyoming.wake import Detection

from edge_agent import __version__
from edge_agent.announce.pipeline import Announcer
from edge_agent.announce.playout import CUE_RATE, chime
from edge_agent.audio.frames import Samples
from edge_agent.config import Settings
from edge_agent.errors import EdgeError
from edge_agent.wake.engine import SAMPLE_RATE
from edge_agent.wyoming.audio import Recording, Refused, chunk_events, start_event
from edge_agent.wyoming.tts import ATTRIBUTION

log = logging.getLogger(__name__)

Send = Callable[[Event], Awaitable[None]]
Heard = Callable[[str, str, str], None]
"""(text, conversation_id, wake word) of a turn Home Assistant transcribed."""

CONTROL = frozenset({"run-satellite", "pause-satellite"})
"""Events any connection may send to become (or stop being) the controller."""
WHILE_RUNNING = frozenset({
    "audio-start", "audio-chunk", "audio-stop", "synthesize", "transcript", "transcribe", "detect",
    "detection", "error", "voice-started", "voice-stopped", "played", "pong",
    "timer-started", "timer-updated", "timer-cancelled", "timer-finished",
})
"""What the controller sends us: none of it is a service request (a `synthesize` names the
words of the audio that follows, a `transcribe` says Home Assistant is listening)."""

MAX_PENDING = 1000
"""Events queued for the controller at most (~30 s of 30 ms microphone blocks)."""
TIMER_CHIMES = 3
"""Chimes played when a timer finishes."""
FINAL = frozenset({"done", "expired", "failed", "rejected"})


@dataclass
class _Turn:
    conversation_id: str
    wake_word: str
    streaming: bool = True
    """Microphone audio still goes out (until Home Assistant's transcript or error)."""


class SatelliteService:
    """The device as Home Assistant's satellite: at most one controller at a time."""

    def __init__(self, settings: Settings, announcer: Announcer, end_turn: Callable[[str], None],
                 wake_words: Sequence[str] = (), *, on_transcript: Heard | None = None,
                 on_change: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self.announcer = announcer
        self.end_hearing_turn = end_turn
        """Ends the hearing loop's streamed turn (any thread)."""
        self.on_transcript = on_transcript
        """Told Home Assistant's transcript of a turn (the daemon publishes it like its own)."""
        self.on_change = on_change
        """Told when a controller comes or goes (the daemon republishes its status)."""
        self.wake_words = list(wake_words)
        self.controller: SatelliteSession | None = None
        self.turn: _Turn | None = None
        self.answer_for: str | None = None
        """The turn whose answer the next audio from the controller is."""
        self._waiting: dict[str, SatelliteSession] = {}
        """Announcement id -> the session to tell once it has been played."""
        self._forget = announcer.observe(self._on_status)

    def info(self) -> Satellite:
        return Satellite(name=self.settings.device.resolved_id, attribution=ATTRIBUTION, installed=True,
                         description="edge-speech satellite", version=__version__,
                         has_vad=False, active_wake_words=self.wake_words,
                         max_active_wake_words=len(self.wake_words), supports_trigger=False)

    def session(self, send: Send, peer: str) -> SatelliteSession:
        return SatelliteSession(self, send, peer)

    def close(self) -> None:
        self._forget()

    def status(self) -> dict[str, Any]:
        """For the device status: whether Home Assistant runs the satellite, and from where."""
        controller = self.controller
        if controller is None or not controller.running:
            return {"connected": False, "peer": None}
        return {"connected": True, "peer": controller.peer}

    @property
    def streaming(self) -> bool:
        """A controller is running: a wake word now streams its turn to it (any thread)."""
        controller = self.controller
        return controller is not None and controller.running

    # -- the hearing loop's thread ---------------------------------------------------------

    def begin_turn(self, conversation_id: str, wake_model: str, wake_word: str, timestamp_s: float) -> None:
        controller = self.controller
        if controller is None or not controller.running:
            self.end_hearing_turn(conversation_id)  # nobody to stream to any more
            return
        self.turn = _Turn(conversation_id, wake_word)
        self.answer_for = conversation_id
        log.info("streaming the command to Home Assistant", extra={"conversation_id": conversation_id})
        controller.post(Detection(name=wake_model, timestamp=round(timestamp_s * 1000)).event(),
                        RunPipeline(start_stage=PipelineStage.ASR, end_stage=PipelineStage.TTS,
                                    wake_word_name=wake_model).event(),
                        start_event(SAMPLE_RATE))

    def audio(self, conversation_id: str, samples: Samples) -> None:
        turn, controller = self.turn, self.controller
        if turn is None or turn.conversation_id != conversation_id or not turn.streaming:
            return
        if controller is None or not controller.post(*chunk_events(samples, SAMPLE_RATE, samples.size or 1)):
            turn.streaming = False
            self.end_hearing_turn(conversation_id)

    def end_turn(self, conversation_id: str) -> None:
        """The hearing loop's turn is over: stop streaming (audio-stop) if Home Assistant has not."""
        turn, controller = self.turn, self.controller
        if turn is None or turn.conversation_id != conversation_id:
            return
        self.turn = None
        if turn.streaming and controller is not None:
            controller.post(AudioStop().event())

    # -- the server's loop ----------------------------------------------------------------------

    def attach(self, session: SatelliteSession) -> None:
        old, self.controller = self.controller, session
        if old is not None and old is not session:
            old.running = False
            log.info("Home Assistant's satellite connection replaced by a newer one")
        self._changed()

    def detach(self, session: SatelliteSession) -> None:
        if self.controller is not session:
            return
        self.controller = None
        self.answer_for = None
        turn = self.turn
        if turn is not None and turn.streaming:
            turn.streaming = False
            self.end_hearing_turn(turn.conversation_id)
        log.info("Home Assistant no longer runs this satellite")
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:  # a status that cannot be published must not break the connection
                log.exception("satellite status change not published")

    def heard(self, session: SatelliteSession, text: str | None) -> None:
        """Home Assistant has the command (`transcript`) or gave up on the turn (`error`)."""
        if session is not self.controller:
            return
        if text is None:
            self.answer_for = None  # a failed pipeline sends no answer: later audio is an announcement
        turn = self.turn
        if turn is None or not turn.streaming:
            return
        turn.streaming = False
        self.end_hearing_turn(turn.conversation_id)
        if text:
            log.info("Home Assistant heard: %s", text, extra={"conversation_id": turn.conversation_id})
            if self.on_transcript is not None:
                self.on_transcript(text, turn.conversation_id, turn.wake_word)
        session.post(AudioStop().event())

    async def play(self, session: SatelliteSession, samples: Samples, rate: int, text: str,
                   *, timer: bool = False) -> None:
        """Queue audio from the controller: the answer to the turn awaiting one, an announcement,
        or (`timer`) an urgent chime. `played` (or `error`) goes back to `session`."""
        conversation_id = None if timer else self.answer_for
        if conversation_id is not None:
            self.answer_for = None
        kind = "timer" if timer else "answer" if conversation_id is not None else "announce"
        ann_id = f"ha-{kind}-{uuid.uuid4().hex}"
        if not timer:  # Home Assistant waits for `played` after audio it sent, not after a chime
            self._waiting[ann_id] = session  # before submitting: a rejection is reported at once
        stored = await asyncio.to_thread(
            self.announcer.submit_audio, samples, rate, ann_id=ann_id, text=text or "(audio)",
            priority=9 if timer else None, conversation_id=conversation_id, source=f"wyoming {session.peer}")
        if not stored:
            self._waiting.pop(ann_id, None)
            raise Refused("the audio could not be stored (is the state disk full?); send it again",
                          "not-stored")

    def _on_status(self, doc: dict[str, Any]) -> None:
        """The speaker thread's statuses (or the submitting thread's, for a rejection)."""
        state, ann_id = doc.get("state"), doc.get("id")
        if state not in FINAL or not isinstance(ann_id, str):
            return
        session = self._waiting.pop(ann_id, None)
        if session is None:
            return
        if state == "done":
            session.post(Played().event())
        else:
            reason = doc.get("error") or state
            session.post(Error(text=f"audio not played: {reason}", code=f"audio-{state}").event())


class SatelliteSession:
    """One connection's satellite side."""

    def __init__(self, service: SatelliteService, send: Send, peer: str = "") -> None:
        self.service = service
        self.send = send
        self.peer = peer
        self.running = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: asyncio.Queue[Event] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._recording: Recording | None = None
        self._discarding = False
        self._text = ""
        """The words of the audio that follows (`synthesize`)."""

    def takes(self, kind: str) -> bool:
        return kind in CONTROL or (self.running and kind in WHILE_RUNNING)

    async def handle(self, event: Event) -> None:
        kind = event.type
        if kind == "run-satellite":
            self._start()
        elif kind == "pause-satellite":
            await self.close()
        elif kind == "transcript":
            text = event.data.get("text")
            self.service.heard(self, text if isinstance(text, str) else "")
        elif kind == "error":
            log.warning("Home Assistant: %s (%s)", event.data.get("text"), event.data.get("code"))
            self.service.heard(self, None)
        elif kind == "synthesize":
            text = event.data.get("text")
            self._text = text[:200] if isinstance(text, str) else ""
        elif kind in ("audio-start", "audio-chunk", "audio-stop"):
            await self._audio(event)
        elif kind == "timer-finished":
            log.info("timer finished", extra={"timer": event.data.get("id")})
            tones = np.tile(chime(CUE_RATE), TIMER_CHIMES)
            await self.service.play(self, tones, CUE_RATE, "(timer finished)", timer=True)
        else:
            log.debug("satellite: %s from Home Assistant", kind)

    def post(self, *events: Event) -> bool:
        """Queue events for the controller from any thread; False when it is gone or not reading."""
        loop = self._loop
        if loop is None or not self.running or self._outbox.qsize() + len(events) > MAX_PENDING:
            return False
        for event in events:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to send to
                loop.call_soon_threadsafe(self._outbox.put_nowait, event)
        return True

    async def close(self) -> None:
        """Stop being the controller (`pause-satellite`, or the connection is closing)."""
        self.running = False
        self.service.detach(self)
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        self._outbox = asyncio.Queue()  # a turn's leftovers are not sent after a later run-satellite

    # -- internals ------------------------------------------------------------------------------

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.running = True
        if self._writer is None:
            self._writer = asyncio.create_task(self._write())
        self.service.attach(self)
        log.info("Home Assistant runs this satellite (%s)", self.peer or "a client")

    async def _write(self) -> None:
        try:
            while True:
                event = await self._outbox.get()
                await self.send(event)  # bounded by the server's write deadline
        except (ConnectionError, EdgeError) as exc:
            # Home Assistant stopped reading: it notices the missing pongs and reconnects.
            log.warning("satellite: Home Assistant (%s) takes no more events: %s", self.peer, exc)
            self.running = False
            self.service.detach(self)

    async def _audio(self, event: Event) -> None:
        """Audio to play: gathered whole (bounded by `announcements.max_audio_s`), then queued."""
        if event.type == "audio-start":
            self._discarding = False
            self._recording = Recording.begin(event, self.service.settings.announcements.max_audio_s,
                                              native=True)
            return
        if self._discarding:
            if event.type == "audio-stop":
                self._discarding = False
            return
        recording = self._recording
        if recording is None:
            raise Refused(f"{event.type} before audio-start", "no-audio-start")
        if event.type == "audio-chunk":
            try:
                recording.push(event)
            except Refused:
                self._recording, self._discarding = None, True  # the rest of this stream is dropped
                raise
            return
        self._recording = None
        samples = recording.finish()
        text, self._text = self._text, ""
        if samples.size:
            await self.service.play(self, samples, recording.rate, text)
        else:
            self.post(Played().event())  # nothing to play is played at once
