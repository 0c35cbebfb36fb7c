"""The Wyoming satellite: Home Assistant drives this device's microphone and speaker.

Home Assistant connects as a client, asks `describe` (our `info` has a `satellite`
section), sends `run-satellite` and pings every ~2 s. From then on that connection
is the satellite's controller; a newer `run-satellite` (Home Assistant reconnecting
while the old socket still looks open) replaces it, a closed connection ends it.
`pause-satellite` (Home Assistant's mute) pauses it: the wake word stays local, but
the connection is still the one Home Assistant announces on.

After a local wake word (the daemon's hearing loop, `listen.Hearing.stream_turns`):

    device -> HA   detection, run-pipeline {start_stage: asr, end_stage: tts},
                   audio-chunk (16 kHz s16le, the command as it is spoken)...
    HA -> device   voice-started, voice-stopped, transcript (or error): the turn ends here
                   (`Hearing.end_turn`) and the device sends audio-stop
    HA -> device   synthesize {text}, audio-start, audio-chunk..., audio-stop: the answer
    device -> HA   played, once the answer has been played

Home Assistant sends nothing when a run ends, so the device knows that no answer will
come only from an `error`, a pause or the controller going away: then `no_answer` tells
the conversation turn, which resumes announcements at once instead of after
`listen.answer_wait_s`. A run that ends without speech after its transcript (an empty
response: Home Assistant skips text-to-speech) looks like one still thinking, and waits.

No `audio-start` goes ahead of the microphone's chunks: Home Assistant's satellite
loop takes only chunks (each names its format) and logs anything else as an
unexpected event.

Audio Home Assistant sends outside a turn (`assist_satellite.announce`: 22050 Hz
s16le) is an announcement, whether or not the controller is paused: Home Assistant
announces on the connection it holds, muted or not, and waits for `played`. Both go
through the announcement queue (`Announcer.submit_audio`: priority, journal, one
playback at a time; an answer is spoken ahead of queued announcements) and `played`
is sent when the queue reports the id `done` (`error` if it is rejected or fails).
Only the controller's audio is buffered, checked at `audio-start` (the rate an audio
announcement may have, width, channels) and bounded in bytes while it arrives
(`wyoming.max_announce_bytes`); a replaced controller's buffer is dropped at once.

Staying in step with Home Assistant: a mute undone within a second can leave Home
Assistant's satellite loop running without a new `run-satellite` after its
`pause-satellite` (the loop only looks at the mute between events). That loop is the
only thing that pings, and it stops pinging once it has seen its own mute, so a
paused controller that goes on pinging (`PINGS_TO_RESUME`) runs again.

`timer-finished` plays the chime as an urgent announcement, one per timer id and at
most `MAX_TIMER_CHIMES` waiting; the other timer events are logged.

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
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from wyoming.audio import AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Satellite
from wyoming.ping import Pong
from wyoming.pipeline import PipelineStage, RunPipeline
from wyoming.snd import Played
from wyoming.wake import Detection

from edge_agent import __version__
from edge_agent.announce.message import implausible_rate
from edge_agent.announce.pipeline import Announcer
from edge_agent.announce.playout import CUE_RATE, chime
from edge_agent.announce.settings import AnnouncementSettings
from edge_agent.audio.frames import Samples
from edge_agent.errors import EdgeError
from edge_agent.wake.engine import SAMPLE_RATE
from edge_agent.wyoming.audio import Recording, Refused, chunk_events
from edge_agent.wyoming.settings import WyomingSettings
from edge_agent.wyoming.tts import ATTRIBUTION

log = logging.getLogger(__name__)

Send = Callable[[Event], Awaitable[None]]
Heard = Callable[[str, str, str], None]
"""(text, conversation_id, wake word) of a turn Home Assistant transcribed."""

CONTROL = frozenset({"run-satellite", "pause-satellite"})
"""Events any connection may send to become (or stop being) the controller."""
WHILE_RUNNING = frozenset({
    "audio-start", "audio-chunk", "audio-stop", "synthesize", "transcript", "transcribe", "detect",
    "detection", "error", "voice-started", "voice-stopped", "played", "pong", "ping",
    "timer-started", "timer-updated", "timer-cancelled", "timer-finished",
})
"""What a controller (running or paused) sends us: none of it is a service request (a
`synthesize` names the words of the audio that follows, a `transcribe` says Home Assistant
is listening)."""
TURN_EVENTS = frozenset({"detection", "run-pipeline", "audio-chunk", "audio-stop"})
"""What the device sends of a streamed turn: not sent any more once the controller pauses."""

MAX_PENDING = 1000
"""Events queued for the controller at most (~30 s of 30 ms microphone blocks)."""
TIMER_CHIMES = 3
"""Chimes played when a timer finishes."""
MAX_TIMER_CHIMES = 2
"""Timer chimes waiting to be played at most. A chime says "a timer finished"; more of them
in the queue say nothing more, and each is an urgent announcement (a WAV on disk, a place in
the queue ahead of everything else): 300 timers finishing at once are two chimes, not 300."""
PINGS_TO_RESUME = 2
"""Pings from a paused controller that make it run again. Home Assistant's satellite loop
pings every ~2 s while it runs and stops once it has seen its own mute, which leaves at most
the one ping already under way after its `pause-satellite`."""
FINAL = frozenset({"done", "expired", "failed", "rejected"})
SAMPLE_BYTES = np.dtype(np.float32).itemsize
"""What one buffered sample of audio to play costs (mono float32 at the stream's own rate)."""


@dataclass
class _Turn:
    conversation_id: str
    wake_word: str
    streaming: bool = True
    """Microphone audio still goes out (until Home Assistant's transcript or error)."""


class SatelliteService:
    """The device as Home Assistant's satellite: at most one controller at a time."""

    def __init__(self, settings: WyomingSettings, name: str, announcer: Announcer,
                 end_turn: Callable[[str], None], wake_words: Sequence[str] = (), *,
                 max_audio_s: float = AnnouncementSettings.max_audio_s, on_transcript: Heard | None = None,
                 no_answer: Callable[[str], None] | None = None,
                 on_change: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self.name = name
        """The device id, the satellite's name in Home Assistant."""
        self.max_audio_s = max_audio_s
        """`announcements.max_audio_s`: the longest announcement audio Home Assistant may send."""
        self.announcer = announcer
        self.end_hearing_turn = end_turn
        """Ends the hearing loop's streamed turn (any thread)."""
        self.on_transcript = on_transcript
        """Told Home Assistant's transcript of a turn (the daemon publishes it like its own)."""
        self.no_answer = no_answer
        """Told the conversation id of a turn whose answer will not come (the conversation turn
        releases the announcer)."""
        self.on_change = on_change
        """Told when a controller comes, goes, pauses or runs again (the daemon republishes its status)."""
        self.wake_words = list(wake_words)
        self.controller: SatelliteSession | None = None
        """The connection Home Assistant runs the satellite from (`running`) or paused it on."""
        self.turn: _Turn | None = None
        self.answer_for: str | None = None
        """The turn whose answer the next audio from the controller is."""
        self._lock = threading.Lock()
        self._waiting: dict[str, SatelliteSession] = {}
        """Announcement id -> the session to tell once it has been played."""
        self._chimes: dict[str, str] = {}
        """Announcement id -> the timer id of a chime not yet played."""
        self.chimes_dropped = 0
        """Timer chimes not queued: one of the same timer was waiting, or `MAX_TIMER_CHIMES` were."""
        self._forget = announcer.observe(self._on_status)

    def info(self) -> Satellite:
        return Satellite(name=self.name, attribution=ATTRIBUTION, installed=True,
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
        pipeline = RunPipeline(start_stage=PipelineStage.ASR, end_stage=PipelineStage.TTS,
                               wake_word_name=wake_model or None).event()
        if wake_model:  # a turn opened without a wake word (a conversation continued) has none
            controller.post(Detection(name=wake_model, timestamp=round(timestamp_s * 1000)).event(), pipeline)
        else:
            controller.post(pipeline)

    def audio(self, conversation_id: str, samples: Samples) -> None:
        turn, controller = self.turn, self.controller
        if turn is None or turn.conversation_id != conversation_id or not turn.streaming:
            return
        if controller is None or not controller.running \
                or not controller.post(*chunk_events(samples, SAMPLE_RATE, samples.size or 1)):
            turn.streaming = False
            self.end_hearing_turn(conversation_id)

    def end_turn(self, conversation_id: str) -> None:
        """The hearing loop's turn is over: stop streaming (audio-stop) if Home Assistant has not."""
        turn, controller = self.turn, self.controller
        if turn is None or turn.conversation_id != conversation_id:
            return
        self.turn = None
        if turn.streaming and controller is not None and controller.running:
            controller.post(AudioStop().event())

    # -- the server's loop ----------------------------------------------------------------------

    def attach(self, session: SatelliteSession) -> None:
        """`session` runs the satellite (`run-satellite`, or a paused controller still pinging)."""
        old, self.controller = self.controller, session
        if old is not None and old is not session:
            old.replace()
            self._stop_streaming()  # the turn's run-pipeline went to the replaced connection
            log.info("Home Assistant's satellite connection replaced by a newer one")
        self._changed()

    def pause(self, session: SatelliteSession) -> None:
        """`pause-satellite`: wake words stay local; the session stays the one that announces."""
        if self.controller is not session:
            return
        self._stop_streaming()
        self._no_answer()
        log.info("Home Assistant paused this satellite")
        self._changed()

    def detach(self, session: SatelliteSession) -> None:
        if self.controller is not session:
            return
        self.controller = None
        self._stop_streaming()
        self._no_answer()
        log.info("Home Assistant no longer runs this satellite")
        self._changed()

    def _stop_streaming(self) -> None:
        turn = self.turn
        if turn is not None and turn.streaming:
            turn.streaming = False
            self.end_hearing_turn(turn.conversation_id)

    def _no_answer(self) -> None:
        """The turn awaiting an answer will get none: later audio is an announcement, and the
        conversation turn stops waiting."""
        conversation_id, self.answer_for = self.answer_for, None
        if conversation_id is not None and self.no_answer is not None:
            log.info("Home Assistant's run ended without an answer",
                     extra={"conversation_id": conversation_id})
            self.no_answer(conversation_id)

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
            self._no_answer()  # a failed pipeline sends no answer: later audio is an announcement
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

    async def play(self, session: SatelliteSession, samples: Samples, rate: int, text: str) -> None:
        """Queue audio from the controller: the answer to the turn awaiting one, or an
        announcement. `played` (or `error`) goes back to `session`."""
        conversation_id = self.answer_for
        if conversation_id is not None:
            self.answer_for = None
        kind = "answer" if conversation_id is not None else "announce"
        ann_id = f"ha-{kind}-{uuid.uuid4().hex}"
        with self._lock:  # before submitting: a rejection is reported at once
            self._waiting[ann_id] = session
        stored = await asyncio.to_thread(
            self.announcer.submit_audio, samples, rate, ann_id=ann_id, text=text or "(audio)",
            conversation_id=conversation_id, source=f"wyoming {session.peer}")
        if not stored:
            with self._lock:
                self._waiting.pop(ann_id, None)
            raise Refused("the audio could not be stored (is the state disk full?); send it again",
                          "not-stored")

    async def timer_finished(self, session: SatelliteSession, timer_id: str) -> None:
        """The chime as an urgent announcement: one per timer id, `MAX_TIMER_CHIMES` waiting at most.

        Home Assistant waits for no `played` after a timer event, so nothing is sent back."""
        ann_id = f"ha-timer-{uuid.uuid4().hex}"
        with self._lock:
            waiting = len(self._chimes)
            if timer_id in self._chimes.values() or waiting >= MAX_TIMER_CHIMES:
                self.chimes_dropped += 1
                why = "its chime is waiting" if timer_id in self._chimes.values() else \
                    f"{waiting} chimes are waiting"
                log.info("timer finished: no further chime (%s)", why, extra={"timer": timer_id})
                return
            self._chimes[ann_id] = timer_id
        log.info("timer finished", extra={"timer": timer_id, "id": ann_id})
        tones = np.tile(chime(CUE_RATE), TIMER_CHIMES)
        stored = await asyncio.to_thread(
            self.announcer.submit_audio, tones, CUE_RATE, ann_id=ann_id, text="(timer finished)",
            priority=9, source=f"wyoming {session.peer}")
        if not stored:
            with self._lock:
                self._chimes.pop(ann_id, None)
            raise Refused("the timer chime could not be stored (is the state disk full?)", "not-stored")

    @property
    def chimes_waiting(self) -> int:
        with self._lock:
            return len(self._chimes)

    def _on_status(self, doc: dict[str, Any]) -> None:
        """The speaker thread's statuses (or the submitting thread's, for a rejection)."""
        state, ann_id = doc.get("state"), doc.get("id")
        if state not in FINAL or not isinstance(ann_id, str):
            return
        with self._lock:
            self._chimes.pop(ann_id, None)
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
        """Home Assistant runs the satellite from here: wake words stream their turn to it."""
        self.ran = False
        """It has sent `run-satellite`: a satellite connection from then on (paused or replaced)."""
        self.replaced = False
        """A newer connection runs the satellite: this one's audio is refused."""
        self.closed = False
        self._pings = 0
        """Pings since `pause-satellite`."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: asyncio.Queue[Event] | None = None
        self._writer: asyncio.Task[None] | None = None
        self.recording: Recording | None = None
        """The audio stream arriving from Home Assistant (only while this is the controller)."""
        self._discarding = False
        self._text = ""
        """The words of the audio that follows (`synthesize`)."""

    def takes(self, kind: str) -> bool:
        return kind in CONTROL or (self.ran and kind in WHILE_RUNNING)

    async def handle(self, event: Event) -> None:
        kind = event.type
        if kind == "run-satellite":
            self._run()
        elif kind == "pause-satellite":
            self._pause()
        elif kind == "ping":
            self._pinged()  # before the pong: once it is read, the status is what the ping made it
            pong = Pong(text=event.data.get("text")).event()
            if self._outbox is None:
                await self.send(pong)
            elif self._outbox.qsize() < MAX_PENDING:  # else it is not reading: no pong is its answer
                # Behind what the hearing loop queued before the ping (a turn's audio), so a
                # pong read means those were sent; written directly it could overtake them.
                self._outbox.put_nowait(pong)
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
            await self.service.timer_finished(self, str(event.data.get("id"))[:128])
        else:
            log.debug("satellite: %s from Home Assistant", kind)

    def post(self, *events: Event) -> bool:
        """Queue events for Home Assistant from any thread; False when it is gone or not reading."""
        loop, outbox = self._loop, self._outbox
        if loop is None or outbox is None or self.closed or outbox.qsize() + len(events) > MAX_PENDING:
            return False
        for event in events:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to send to
                loop.call_soon_threadsafe(outbox.put_nowait, event)
        return True

    def replace(self) -> None:
        """A newer connection runs the satellite: stop, and free the audio this one was buffering."""
        self.running = False
        self.replaced = True
        self._drop_audio()

    async def close(self) -> None:
        """The connection is closing: stop being the controller and free what it held."""
        self.running = False
        self.closed = True
        self._drop_audio()
        self.service.detach(self)
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
        self._outbox = None

    # -- internals ------------------------------------------------------------------------------

    def _run(self) -> None:
        if self._writer is None and not self.closed:
            self._loop = asyncio.get_running_loop()
            self._outbox = asyncio.Queue()
            self._writer = asyncio.create_task(self._write())
        self.running = self.ran = True
        self.replaced = False
        self._pings = 0
        self.service.attach(self)
        log.info("Home Assistant runs this satellite (%s)", self.peer or "a client")

    def _pause(self) -> None:
        self.running = False
        self._pings = 0
        self._drop_turn_events()
        self.service.pause(self)

    def _pinged(self) -> None:
        if self.running or self.replaced or self.service.controller is not self:
            return
        self._pings += 1
        if self._pings >= PINGS_TO_RESUME:
            # Home Assistant's loop still runs: its mute was undone before it saw it.
            log.info("Home Assistant still pings after pause-satellite: the satellite runs again")
            self._run()

    def _drop_turn_events(self) -> None:
        """A turn's events still queued are not sent after a pause (announcements' `played` are)."""
        outbox = self._outbox
        if outbox is None:
            return
        kept = []
        while not outbox.empty():
            event = outbox.get_nowait()
            if event.type not in TURN_EVENTS:
                kept.append(event)
        for event in kept:
            outbox.put_nowait(event)

    def _drop_audio(self) -> None:
        self.recording = None
        self._discarding = True  # the rest of the stream, until its audio-stop

    async def _write(self) -> None:
        outbox = self._outbox
        assert outbox is not None
        try:
            while True:
                event = await outbox.get()
                await self.send(event)  # bounded by the server's write deadline
        except (ConnectionError, EdgeError) as exc:
            # Home Assistant stopped reading: it notices the missing pongs and reconnects.
            log.warning("satellite: Home Assistant (%s) takes no more events: %s", self.peer, exc)
            self.running = False
            self.closed = True
            self._drop_audio()
            self.service.detach(self)

    async def _audio(self, event: Event) -> None:
        """Audio to play: gathered whole (bounded in bytes and by `announcements.max_audio_s`),
        then queued."""
        if event.type == "audio-start":
            self.recording, self._discarding = None, False
            self.recording = self._begin(event)
            return
        if self._discarding:
            if event.type == "audio-stop":
                self._discarding = False
            return
        recording = self.recording
        if recording is None:
            raise Refused(f"{event.type} before audio-start", "no-audio-start")
        if event.type == "audio-chunk":
            try:
                self._push(recording, event)
            except Refused:
                self._drop_audio()
                raise
            return
        self.recording = None
        samples = recording.finish()
        text, self._text = self._text, ""
        if samples.size:
            await self.service.play(self, samples, recording.rate, text)
        else:
            self.post(Played().event())  # nothing to play is played at once

    def _begin(self, event: Event) -> Recording:
        """A new stream to play, checked before anything of it is buffered."""
        self._discarding = True  # until it is accepted: a refused stream's chunks are dropped quietly
        if self.service.controller is not self:
            raise Refused("this connection does not run the satellite (a newer run-satellite replaced "
                          "it); send audio on the newest connection", "not-controller")
        recording = Recording.begin(event, self.service.max_audio_s, native=True)
        bad_rate = implausible_rate(recording.rate)
        if bad_rate is not None:
            raise Refused(f"audio-start: {bad_rate}", "bad-audio-format")
        self._discarding = False
        return recording

    def _push(self, recording: Recording, event: Event) -> None:
        """One chunk, refused before it is buffered if the stream would outgrow its byte bound."""
        _, width, channels = recording.format
        frames = len(event.payload or b"") // (width * channels)
        limit = self.service.settings.max_announce_bytes
        if (recording.samples + frames) * SAMPLE_BYTES > limit:
            raise Refused(f"audio to play larger than {limit} bytes once decoded "
                          f"(wyoming.max_announce_bytes: {limit / recording.rate / SAMPLE_BYTES:.0f} s "
                          f"at {recording.rate} Hz)", "audio-too-large")
        recording.push(event)
