"""The hearing loop as a push/flush stage: wake word -> one command -> transcript (or everything).

Modes (`listen.mode`):

- `wake`: every block goes to the wake engine; nothing reaches the VAD or Whisper
  until a wake word fires. Then a turn opens: the audio after the detection is
  segmented, and the first utterance Whisper hears speech in is the command; the
  turn ends with it, or `listen.command_timeout_s` after it opened (speech still
  going on then is cut there and transcribed). `open_turn` opens a turn without a
  wake word (an announcement that expects a reply).
- `always`: every utterance is transcribed; there are no turns.

Streamed turns (a Wyoming satellite: Home Assistant transcribes). `stream_turns` is
asked at each wake word; when it says yes the turn's audio is not segmented or
transcribed here but handed on as `Streamed` blocks until `end_turn` (the remote side
has its transcript) or `listen.command_timeout_s` after the wake word.

A turn starts `listen.lookback_ms` before its wake word (`listen.lookback`). An utterance of the turn
that ends by `WAKE_TAIL_S` after the detection is the wake phrase itself, never the command: a
person who waits for the chime after "Okay Nabu" pauses long enough for the VAD to end the phrase's
tail on its own, and Whisper makes "Okay, now boo" of it.

Decoding during the pause: once the speech has paused for `TAIL_MS` (the tail the VAD
keeps after speech, so the utterance can no longer change unless speech resumes) it is
transcribed while the VAD's hangover runs; if the utterance then ends without more
speech that transcript is the command, so Whisper's time overlaps the hangover instead
of following it. The turn still ends only where the VAD ends the utterance: a pause
between two sentences shorter than `vad.hangover_ms` never cuts the command.

End of turn (`listen.end_of_turn: model`, the default, with the `smart-turn` model present): at
a pause of `listen.turn_pause_ms` the end-of-turn model (`listen.endofturn`) judges the last 8 s
of the turn while Whisper decodes the speech so far, both at once. A complete turn's transcript
goes out there; an incomplete one goes on: the VAD still ends its utterance after its
hangover, but the turn then waits `listen.turn_incomplete_wait_ms` of silence for more speech
(a mid-command pause: "Turn off the oven... and start the dishwasher"), and speech that resumes
joins the command and makes the decoded text stale. A complete verdict is not the last word:
a first sentence that is complete by itself ("Dinner is ready.") may be followed by a second one,
so its transcript goes out at once but the turn stays open until the VAD's hangover ends the
utterance; speech that resumes before then continues it, and the whole command goes out again
(a second `Heard`, `continued`, that replaces the first) when that is judged complete or ended:
the model never loses a sentence the VAD-only end would have kept. A pause the model is still
busy for (slower than real time under load) or does not answer in time is left to the VAD.
A streamed turn is heard the same way (VAD and model, no Whisper): a complete turn ends the
stream there, so Home Assistant hears "end of speech" at once instead of after its own VAD's
wait (and a streamed turn has no continuation: what follows the verdict is not sent).

Ending early (`listen.early_end_ms`, off by default; `listen.end_of_turn: vad` only): at the
first pause of that length the speech so far is transcribed and, if Whisper hears a complete sentence
(it ends with `.`, `?` or `!`), the turn ends there instead of after the VAD's
hangover. Faster, but it drops whatever follows a pause between sentences (Whisper
punctuates what it has heard so far as complete): 150 ms cut "Dinner is ready.
Please come to the table." after "ready." at a slow speaking rate.

A pure state machine like `vad.segmenter`: no I/O, and no thread but the end-of-turn
model's one worker (so Whisper decodes while the model judges); `listen.loop` runs it over
the microphone. It drives the VAD and Whisper through one stage (`listen.transcribing`).
Times are seconds of stream time.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from edge_agent.asr.transcriber import Transcript
from edge_agent.audio.frames import Samples
from edge_agent.listen.endofturn import EndOfTurn, TurnAudio
from edge_agent.listen.lookback import Lookback
from edge_agent.listen.settings import ListenSettings
from edge_agent.listen.transcribing import Transcribing
from edge_agent.vad.segmenter import TAIL_MS, Utterance
from edge_agent.wake.engine import SAMPLE_RATE, Detection

log = logging.getLogger(__name__)

COMPLETE = (".", "?", "!")
"""Sentence ends that let a turn end at the first pause."""
WAKE_TAIL_S = 0.2
"""A turn's utterance whose speech ended no later than this after the wake word's detection is the
wake phrase itself, which the lookback (or a detection mid-phrase) let into the turn, not the
command: the detection comes 0.05-0.2 s after the phrase's end and the VAD puts that end 0.07-0.18 s
late, while a command's speech, however short, ends 0.3 s or more after the detection."""


@dataclass(frozen=True)
class Woke:
    """A wake word opened a turn."""

    detection: Detection
    conversation_id: str
    streamed: bool = False
    """The turn's audio goes out as `Streamed` blocks instead of to Whisper."""


@dataclass(frozen=True)
class Reopened:
    """A turn opened without a wake word (`open_turn(..., stream=True)`) whose audio streams out as
    `Streamed` blocks: Home Assistant continues or starts a conversation."""

    conversation_id: str


@dataclass(frozen=True)
class Streamed:
    """Audio of a streamed turn (16 kHz), in stream order."""

    samples: Samples
    conversation_id: str


@dataclass(frozen=True)
class Heard:
    """A transcript: the command of a turn, or (mode `always`) any utterance."""

    transcript: Transcript
    conversation_id: str | None = None
    wake_word: str | None = None
    early: bool = False
    """Decided at the first pause rather than after the VAD's hangover."""
    continued: bool = False
    """The whole command again, longer: speech resumed after the end-of-turn model had judged the
    turn complete (and its transcript had gone out), before the VAD's hangover. It replaces the
    turn's earlier transcript."""
    time: float | None = None
    """Stream time the transcript was decided (None: not in a turn)."""


@dataclass(frozen=True)
class TurnEnded:
    """A turn is over."""

    conversation_id: str
    reason: Literal["heard", "timeout", "ended"]
    """`ended`: a streamed turn the remote side closed (`end_turn`) or the end-of-turn model
    judged complete."""
    time: float


Event = Woke | Reopened | Heard | Streamed | TurnEnded
WakeFilter = Callable[[Detection], bool]


class Wake(Protocol):
    """The wake words as the loop hears them: a `WakeEngine`, or a bank (`listen.beams`)."""

    def feed(self, samples: Samples) -> list[Detection]: ...


@dataclass
class _Turn:
    conversation_id: str
    wake_word: str | None
    deadline: int
    """Stream sample at which the turn times out."""
    offset: float
    """Stream time minus segmenter time (the segmenter only hears turns)."""
    tried_early: bool = False
    streamed: bool = False
    speculative: tuple[Utterance, Transcript | None] | None = None
    """The utterance decoded during the current pause and what Whisper made of it."""
    audio: TurnAudio | None = None
    """The turn's last 8 s, for the end-of-turn model (None without one)."""
    judged: bool = False
    """The end-of-turn model was asked about the current pause."""
    incomplete: bool = False
    """The model judged the current pause incomplete: the turn waits longer for more speech."""
    held: list[Transcript] = field(default_factory=list)
    """Utterances of the command that ended while the turn waited for more speech."""
    hold_until: int | None = None
    """Stream sample at which the wait for more speech ends the turn."""
    published: tuple[Utterance, str] | None = None
    """The utterance whose transcript went out when the turn was judged complete, and its text."""
    wake_end: float | None = None
    """Stream time up to which speech is the wake phrase's own (`WAKE_TAIL_S` after the detection;
    None: a turn opened without a wake word)."""

    def is_wake_phrase(self, utterance: Utterance) -> bool:
        """The utterance is the wake phrase (or its tail), not the command: someone who waits for the
        chime after "Okay Nabu" pauses long enough for the VAD to end it on its own."""
        return self.wake_end is not None and utterance.end + self.offset <= self.wake_end

    def may_be_command(self, utterance: Utterance, min_ms: int) -> bool:
        """The utterance is worth decoding as the command: `min_ms` of speech, and not the wake phrase."""
        return utterance.speech_ms >= min_ms and not self.is_wake_phrase(utterance)

    def wait_for_more(self, utterance: Utterance, now: int, wait_ms: int, hangover_ms: int) -> bool:
        """The VAD ended an utterance (at stream sample `now`) the model judged incomplete: whether
        the turn waits on for more speech (until `wait_ms`, `listen.turn_incomplete_wait_ms`, after
        the speech), rather than ending now."""
        if not self.incomplete or wait_ms <= hangover_ms:
            return False
        speech_end = round((utterance.end + self.offset) * SAMPLE_RATE)
        self.hold_until = speech_end + round(wait_ms * SAMPLE_RATE / 1000)
        self.incomplete = False
        log.info("turn goes on: the pause after %.2f s sounded incomplete", utterance.end + self.offset,
                 extra={"conversation_id": self.conversation_id})
        return now < self.hold_until

    def heard(self, transcripts: list[Transcript], early: bool, now: int) -> Heard:
        """One transcript of `transcripts` (the utterances of the command, in order), in stream
        times, decided at stream sample `now`."""
        first, last = transcripts[0], transcripts[-1]
        transcript = Transcript(text=_text(transcripts), start=first.start + self.offset,
                                end=last.end + self.offset, tokens=first.tokens,
                                no_speech_prob=first.no_speech_prob, avg_logprob=first.avg_logprob,
                                asr_s=sum(t.asr_s for t in transcripts), latency_s=last.latency_s,
                                cut=last.cut)
        return Heard(transcript, self.conversation_id, self.wake_word, early,
                     continued=self.published is not None, time=now / SAMPLE_RATE)


class Hearing:
    """Feed 16 kHz blocks with `push`; get the events they caused."""

    def __init__(self, mode: Literal["wake", "always"], transcribing: Transcribing,
                 wake: Wake | None, settings: ListenSettings,
                 accept_wake: WakeFilter | None = None, *, end_of_turn: EndOfTurn | None = None) -> None:
        if mode == "wake" and wake is None:
            raise ValueError("wake mode needs a wake engine")
        self.mode = mode
        self.transcribing = transcribing
        self.wake = wake
        self.settings = settings
        self.accept_wake = accept_wake
        """Asked for each detection; False drops it (the daemon's playback policy)."""
        self.end_of_turn = end_of_turn
        """The end-of-turn model (None: turns end at the VAD's hangover)."""
        self.stream_turns: Callable[[], bool] | None = None
        """Asked for each accepted detection; True streams the turn out (see the module)."""
        self._frame = transcribing.frame
        self._pos = 0
        self._now = 0
        """Stream sample up to which the current turn has been segmented."""
        self._turn: _Turn | None = None
        self._lookback = Lookback(round(settings.lookback_ms * SAMPLE_RATE / 1000))
        self._requested: tuple[str, bool] | None = None
        self._end_requested: str | None = None
        self._lock = threading.Lock()

    @property
    def position(self) -> float:
        return self._pos / SAMPLE_RATE

    @property
    def in_turn(self) -> bool:
        return self._turn is not None

    def open_turn(self, conversation_id: str, stream: bool = False) -> None:
        """Open a turn without a wake word at the next block (any thread; wake mode only); with
        `stream` its audio goes out as `Streamed` blocks (after a `Reopened`) if `stream_turns`
        still says yes then, else it is transcribed here."""
        with self._lock:
            self._requested = (conversation_id, stream)

    def end_turn(self, conversation_id: str) -> None:
        """End the streamed turn `conversation_id` at the next block (any thread); a turn
        that has already ended, or another one, is left alone."""
        with self._lock:
            self._end_requested = conversation_id

    # -- stage -------------------------------------------------------------------

    def push(self, block: Samples) -> list[Event]:
        if self.mode == "always":
            self._pos += block.size
            return [Heard(t) for t in self.transcribing.push(block)]
        assert self.wake is not None
        start = self._pos
        self._pos += block.size
        events: list[Event] = []
        with self._lock:
            requested, self._requested = self._requested, None
            end, self._end_requested = self._end_requested, None
        if requested is not None and self._turn is None:
            conversation_id, stream = requested
            streamed = stream and self.stream_turns is not None and self.stream_turns()
            self._open(conversation_id, None, start, streamed)
            if streamed:
                events.append(Reopened(conversation_id))
        detections = self.wake.feed(block)
        if self._turn is not None:
            events += self._continue(block, start, end)
            self._lookback.remember_after(block, start, self._now if self._turn is None else None)
            return events
        for detection in detections:
            if self.accept_wake is not None and not self.accept_wake(detection):
                log.info("wake word %s at %.2f s ignored", detection.model, detection.time)
                continue
            at = start + min(max(0, round(detection.time * SAMPLE_RATE) - start), block.size)
            begin, audio = self._lookback.take(block, start, at)
            conversation_id = uuid.uuid4().hex
            streamed = self.stream_turns is not None and self.stream_turns()
            self._open(conversation_id, detection.wake_word, begin, streamed, deadline_from=at)
            events.append(Woke(detection, conversation_id, streamed))
            events += self._continue(audio, begin, None)
            self._lookback.remember_after(block, start, self._now if self._turn is None else None)
            break
        else:
            self._lookback.remember(block, start)
        return events

    def flush(self) -> list[Event]:
        if self.mode == "always":
            return [Heard(t) for t in self.transcribing.flush()]
        if self._turn is None:
            return []
        self._now = self._pos
        if self._turn.streamed:
            return self._finish([], "timeout")
        return self._finish(self._turn.held + self.transcribing.flush(), "timeout")

    # -- the turn ----------------------------------------------------------------

    def _open(self, conversation_id: str, wake_word: str | None, at: int, streamed: bool = False,
              deadline_from: int | None = None) -> None:
        self.transcribing.discard()
        self._lookback.clear()
        deadline = (at if deadline_from is None else deadline_from) + round(
            self.settings.command_timeout_s * SAMPLE_RATE)
        offset = at / SAMPLE_RATE - self.transcribing.position
        audio = TurnAudio() if self.end_of_turn is not None else None
        wake_end = None if deadline_from is None else deadline_from / SAMPLE_RATE + WAKE_TAIL_S
        self._turn = _Turn(conversation_id, wake_word, deadline, offset, streamed=streamed, audio=audio,
                           wake_end=wake_end)

    def _continue(self, samples: Samples, start: int, end: str | None) -> list[Event]:
        turn = self._turn
        assert turn is not None
        if not turn.streamed:
            return self._command(samples, start)
        if end == turn.conversation_id:
            self._now = start
            return self._finish([], "ended")
        # The deadline falls inside this block: what lies after it is not the command's.
        keep = min(samples.size, max(0, turn.deadline - start))
        heard = self._hear_streamed(samples[:keep], start) if self.end_of_turn is not None else None
        if heard is not None:
            keep = heard
        self._now = start + keep
        events: list[Event] = [Streamed(samples[:keep], turn.conversation_id)] if keep else []
        if heard is not None:
            events += self._finish([], "ended")
        elif self._now >= turn.deadline:
            events += self._finish([], "timeout")
        return events

    def _hear_streamed(self, samples: Samples, start: int) -> int | None:
        """Run a streamed turn's audio through the VAD and the end-of-turn model: how much of it
        belongs to the turn when the model judged it complete, else None (the stream goes on)."""
        turn = self._turn
        assert turn is not None and turn.audio is not None
        speech = self.transcribing
        for offset in range(0, samples.size, self._frame):
            piece = samples[offset:offset + self._frame]
            self._now = start + offset + piece.size
            turn.audio.add(piece)
            speech.segment(piece)  # Home Assistant transcribes: only the pauses matter here
            if speech.in_speech and speech.silence_ms == 0:
                turn.judged = turn.incomplete = False
            elif speech.in_speech and self._judge(turn) is not None:
                return offset + piece.size
        return None

    def _command(self, samples: Samples, start: int) -> list[Event]:
        """Segment `samples` frame by frame (so a pause or the deadline is seen where it happens)."""
        speech = self.transcribing
        for offset in range(0, samples.size, self._frame):
            turn = self._turn
            if turn is None:
                return []
            piece = samples[offset:offset + self._frame]
            self._now = start + offset + piece.size
            if turn.audio is not None:
                turn.audio.add(piece)
            ended = [u for u in speech.segment(piece) if not turn.is_wake_phrase(u)]
            if ended:
                if turn.published is not None and _same_audio(turn.published[0], ended[-1]):
                    return self._finish([], "heard")  # out already: no speech came after the verdict
                heard = [t for t in map(self._transcribe, ended) if t is not None]
                if not turn.wait_for_more(ended[-1], self._now, self.settings.turn_incomplete_wait_ms,
                                           self.transcribing.vad.hangover_ms):
                    return self._finish(turn.held + heard, "heard")
                turn.held += heard
            elif speech.in_speech and speech.silence_ms == 0:
                turn.tried_early = False  # speech goes on: its next pause may end the turn
                turn.speculative = None
                turn.judged = turn.incomplete = False
                turn.hold_until = None
            elif speech.in_speech:
                early = self._at_pause(turn)
                if early:
                    return early
            elif turn.hold_until is not None:
                if self._now >= turn.hold_until:
                    return self._finish(turn.held, "heard")
            elif turn.held:
                # Speech resumed during a wait but was too short for an utterance (a click, a cough):
                # the turn ends now rather than at its deadline.
                return self._finish(turn.held, "heard")
            if self._now >= turn.deadline:
                return self._finish(turn.held + self.transcribing.flush(), "timeout")
        return []

    def _at_pause(self, turn: _Turn) -> list[Event]:
        """A pause in the speech: the end-of-turn model's verdict (with Whisper's decode), or, without
        the model, the decode during the hangover and `listen.early_end_ms`."""
        if self.end_of_turn is None:
            return self._try_early(turn)
        judged = self._judge(turn)
        if judged is None:
            return []
        transcript = judged[1]
        heard = turn.held + ([transcript] if transcript is not None else [])
        if not heard:
            return []  # Whisper heard no words: the VAD decides
        # A sentence complete by itself ("Dinner is ready.") may still be followed by a second one:
        # the transcript goes out now, but the utterance stays open until the VAD ends it, and speech
        # resuming before then makes the whole command go out again, longer (`continued`).
        said = _text(heard)
        if turn.published is not None and said == turn.published[1]:
            turn.published = (judged[0], said)  # a click or a breath: nothing new was said
            return []
        events: list[Event] = [turn.heard(heard, True, self._now)]
        turn.published = (judged[0], said)
        return events

    def _judge(self, turn: _Turn) -> tuple[Utterance, Transcript | None] | None:
        """At `listen.turn_pause_ms` into a pause, once: ask the model and (unless the turn is streamed)
        decode the speech so far meanwhile. The utterance and its transcript when the model judged the
        turn complete; None otherwise (incomplete, not judged, or not yet at the pause)."""
        speech = self.transcribing
        assert self.end_of_turn is not None and turn.audio is not None
        silence_ms = speech.silence_ms
        if turn.judged or silence_ms < self.settings.turn_pause_ms:
            return None
        turn.judged = True
        utterance = speech.peek()
        if utterance is None or not turn.may_be_command(utterance, speech.vad.min_utterance_ms):
            return None
        # The model hears exactly `turn_pause_ms` after the VAD's last speech frame, whatever frame the
        # pause was noticed at: its verdict moves with the length of the silence it is given.
        audio = turn.audio.last()
        audio = audio[:audio.size - round((silence_ms - self.settings.turn_pause_ms) * SAMPLE_RATE / 1000)]
        started = time.perf_counter()
        future = self.end_of_turn.ask(audio)
        transcript = None if turn.streamed else self.transcribing.transcribe(utterance)
        if not turn.streamed:
            turn.speculative = (utterance, transcript)
        # Past the VAD's hangover the verdict is worth nothing: the VAD ends the utterance then.
        budget_s = (speech.vad.hangover_ms - silence_ms) / 1000
        verdict = self.end_of_turn.verdict(future, started, budget_s - (time.perf_counter() - started))
        log.info("pause at %.2f s: end of turn p=%s, judged in %.0f ms", utterance.end + turn.offset,
                 "-" if verdict.probability is None else f"{verdict.probability:.2f}", verdict.seconds * 1000,
                 extra={"conversation_id": turn.conversation_id})
        if verdict.probability is None:
            return None
        turn.incomplete = not verdict.complete
        if not verdict.complete:
            return None
        if transcript is not None:
            # Whisper and the model ran during the pause: the transcript was ready once both were.
            waited = utterance.ended_at - utterance.end
            transcript = replace(transcript, latency_s=waited + time.perf_counter() - started)
        return utterance, transcript

    def _transcribe(self, utterance: Utterance) -> Transcript | None:
        """The utterance's transcript: the one decoded during its pause when the audio is the same."""
        turn = self._turn
        decoded = turn.speculative if turn is not None else None
        if decoded is None or not _same_audio(decoded[0], utterance):
            return self.transcribing.transcribe(utterance)
        transcript = decoded[1]
        if transcript is None:
            return None
        # Whisper ran during the hangover: the transcript was ready when the decode ended or when
        # the VAD ended the utterance, whichever came later.
        waited = utterance.ended_at - utterance.end
        return replace(transcript, latency_s=max(waited, transcript.latency_s))

    def _try_early(self, turn: _Turn) -> list[Event]:
        early_ms = self.settings.early_end_ms
        speech = self.transcribing
        pause_ms = early_ms if early_ms > 0 else TAIL_MS
        if turn.tried_early or speech.silence_ms < pause_ms:
            return []
        turn.tried_early = True
        utterance = speech.peek()
        if utterance is None or not turn.may_be_command(utterance, speech.vad.min_utterance_ms):
            return []
        transcript = self.transcribing.transcribe(utterance)
        turn.speculative = (utterance, transcript)
        if early_ms <= 0 or transcript is None or not transcript.text.rstrip().endswith(COMPLETE):
            return []
        speech.discard()
        return self._finish([transcript], "heard", early=True)

    def _finish(self, transcripts: list[Transcript], reason: Literal["heard", "timeout", "ended"],
                early: bool = False) -> list[Event]:
        turn = self._turn
        assert turn is not None
        self._turn = None
        self._lookback.idle_since = self._now
        self.transcribing.discard()
        events: list[Event] = []
        if transcripts and (turn.published is None or _text(transcripts) != turn.published[1]):
            events.append(turn.heard(transcripts, early, self._now))
        if transcripts or turn.published is not None:
            reason = "heard"
        events.append(TurnEnded(turn.conversation_id, reason, self._now / SAMPLE_RATE))
        return events


def _text(transcripts: list[Transcript]) -> str:
    return " ".join(t.text.strip() for t in transcripts)


def _same_audio(decoded: Utterance, final: Utterance) -> bool:
    """The final utterance is the speech decoded during its pause: no speech frame came since, so at
    most the silent tail after it is longer (the end-of-turn model's pause is shorter than `TAIL_MS`)."""
    return (decoded.audio_start == final.audio_start and decoded.end == final.end
            and decoded.samples.size <= final.samples.size)
