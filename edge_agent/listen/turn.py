"""The conversation turn: what a wake word, a command and the end of a turn do around the hearing loop.

`Conversation` takes the hearing loop's events (`on_event`, on the listener thread)
and a remote side's transcripts (`remote_heard`, Home Assistant's), applies the turn
policy, and hands each event to its `HearObserver`s in the order they were given:

- a wake word while the device speaks is barge-in, or dropped when
  `wake.during_playback` is `ignore` (`accept_wake`, asked by the hearing loop);
- a turn holds the announcer (`TurnSpeaker.hold`: nothing is spoken over the
  command but its answer) and plays the chime (`wake.chime`) on a short-lived
  `chime` thread;
- the end of a turn waits `listen.answer_wait_s` for the answer (0 after a
  timeout), then releases the announcer; an answer's final status releases it
  at once (`on_announce_status`, the speaker thread), and so does the remote
  side saying its run ended without one (`unanswered`, before or after the end);
- an announcement that expects a reply opens a reply turn when it is over;
- in `listen.mode: always`, a transcript while the device speaks, or within
  `ECHO_TAIL_S` after, is taken for its own voice and dropped.

What happens outside (MQTT, Hermes, a remote turn taker) is the observers': this
module knows no transport. The threads are docs/architecture.md's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from edge_agent.listen.hearing import Event, Heard, Reopened, Streamed, TurnEnded, Woke
from edge_agent.listen.settings import ListenSettings
from edge_agent.metrics import Metrics
from edge_agent.wake.engine import Detection
from edge_agent.wake.settings import WakeSettings

log = logging.getLogger(__name__)

ECHO_TAIL_S = 1.0
"""Transcripts this soon after speech ended are taken for our own voice and dropped."""


@dataclass(frozen=True)
class RemoteHeard:
    """A streamed turn's command as the remote side (Home Assistant) transcribed it; it has no
    stream times."""

    text: str
    conversation_id: str
    wake_word: str


class HearObserver(Protocol):
    """Who is told what the device heard. Called on the listener thread (`remote_heard`: the remote
    side's); each must only publish or queue. Subclasses override what they care about."""

    def woke(self, event: Woke) -> None:
        """A wake word opened a turn."""
        return None  # not abstract: an observer overrides only what it cares about

    def reopened(self, event: Reopened) -> None:
        """A streamed turn opened without a wake word (Home Assistant continues the conversation)."""
        return None  # not abstract: an observer overrides only what it cares about

    def streamed(self, event: Streamed) -> None:
        """Audio of a streamed turn."""
        return None  # not abstract: an observer overrides only what it cares about

    def heard(self, event: Heard) -> None:
        """The device's own transcript (after the own-voice check)."""
        return None  # not abstract: an observer overrides only what it cares about

    def remote_heard(self, event: RemoteHeard) -> None:
        """A remote side's transcript of a streamed turn."""
        return None  # not abstract: an observer overrides only what it cares about

    def turn_ended(self, event: TurnEnded) -> None:
        """The turn is over."""
        return None  # not abstract: an observer overrides only what it cares about


class TurnSpeaker(Protocol):
    """What a turn needs of the announcer (`announce.pipeline.Announcer`)."""

    busy: threading.Event
    last_spoke: float

    @property
    def held(self) -> bool:
        ...

    def hold(self) -> None:
        ...

    def release(self) -> None:
        ...


class TurnSettings(Protocol):
    """The sections the turn policy reads (the daemon hands its whole, reloadable settings)."""

    @property
    def wake(self) -> WakeSettings: ...

    @property
    def listen(self) -> ListenSettings: ...


class Conversation:
    """The turn policy between the hearing loop, the announcer and the observers.

    `settings` is read at each use (a reload replaces it); `chime(name)` plays the wake chime
    (blocking; run on its own thread here); `open_turn(conversation_id)` asks the hearing loop
    for a reply turn and says whether it will come (not when no one listens for wake words).
    """

    def __init__(self, speaker: TurnSpeaker, settings: Callable[[], TurnSettings], metrics: Metrics,
                 observers: Sequence[HearObserver], *, chime: Callable[[str], None],
                 open_turn: Callable[[str], bool]) -> None:
        self._speaker = speaker
        self._settings = settings
        self._metrics = metrics
        self._observers = tuple(observers)
        self._chime = chime
        self._open_turn = open_turn
        self._release_timer: threading.Timer | None = None
        self._waiting_for: str | None = None
        """The conversation whose answer the pending release waits for."""
        self._unanswered: str | None = None
        """The last conversation the remote side ended without an answer."""
        self._lock = threading.Lock()

    def accept_wake(self, detection: Detection) -> bool:
        """Whether a wake word heard now starts a turn (the listener thread asks).

        While the device speaks: `wake.during_playback: ignore` drops it; otherwise it
        is barge-in. Our own voice saying the wake phrase never gets here: the front end
        cancels our playback from the microphone, and the own-voice guard
        (`listen.ownvoice`) drops a detection the playback reference fired at too.
        """
        if not self._speaker.busy.is_set():
            return True
        return self._settings().wake.during_playback != "ignore"

    def on_event(self, event: Event) -> None:
        """The hearing loop's callback (its thread)."""
        if isinstance(event, Streamed):
            for observer in self._observers:
                observer.streamed(event)
        elif isinstance(event, Woke):
            self._woke(event)
        elif isinstance(event, Reopened):
            with self._lock:  # nothing is spoken over the command but its answer
                self._cancel_release()
            self._speaker.hold()
            for observer in self._observers:
                observer.reopened(event)
        elif isinstance(event, Heard):
            self._heard(event)
        elif isinstance(event, TurnEnded):
            for observer in self._observers:
                observer.turn_ended(event)
            self._turn_ended(event)

    def remote_heard(self, text: str, conversation_id: str, wake_word: str) -> None:
        """A streamed turn's command as Home Assistant heard it: told like the device's own."""
        self._metrics.inc("transcripts")
        event = RemoteHeard(text, conversation_id, wake_word)
        for observer in self._observers:
            observer.remote_heard(event)

    def on_announce_status(self, doc: dict[str, Any]) -> None:
        """The speaker thread's statuses: an answer releases a hold; `expect_reply` opens a turn."""
        if doc.get("state") not in ("done", "failed", "expired"):
            return
        if doc.get("conversation_id") is not None and self._speaker.held:
            self._release()
        if doc.get("expect_reply"):
            conversation_id = str(doc.get("conversation_id") or doc.get("id"))
            if self._open_turn(conversation_id):
                log.info("listening for a reply",
                         extra={"conversation_id": conversation_id, "id": doc.get("id")})

    def unanswered(self, conversation_id: str) -> None:
        """The remote side (Home Assistant) ended the turn's run without an answer (any thread): no
        wait for one. Told before the hearing loop's end of the turn, that end releases at once;
        told after, the pending release happens now."""
        with self._lock:
            self._unanswered = conversation_id
            now = self._release_timer is not None and self._waiting_for == conversation_id
            if now:
                self._cancel_release()
        if now:
            log.info("no answer will come: announcements resume", extra={"conversation_id": conversation_id})
            self._release()

    def close(self) -> None:
        """Cancel a pending release (shutdown)."""
        with self._lock:
            self._cancel_release()

    def _woke(self, event: Woke) -> None:
        self._metrics.inc("wakes")
        with self._lock:  # nothing is spoken over the command but its answer
            self._cancel_release()
        self._speaker.hold()
        log.info("wake word %s", event.detection.wake_word,
                 extra={"conversation_id": event.conversation_id, "probability": event.detection.probability})
        for observer in self._observers:
            observer.woke(event)
        if self._settings().wake.chime:
            name = f"wake-{event.conversation_id}"
            threading.Thread(target=self._chime, args=(name,), name="chime", daemon=True).start()

    def _heard(self, event: Heard) -> None:
        if event.conversation_id is None:  # listen.mode always: everything the microphone hears
            quiet_s = time.monotonic() - self._speaker.last_spoke
            if self._speaker.busy.is_set() or quiet_s < ECHO_TAIL_S:
                # Most likely our own voice through the microphone.
                log.info("transcript while speaking ignored: %s", event.transcript.text)
                return
        self._metrics.inc("transcripts")
        if event.conversation_id is not None:
            self._metrics.observe("end_of_speech_to_transcript_s", event.transcript.latency_s)
        for observer in self._observers:
            observer.heard(event)

    def _turn_ended(self, event: TurnEnded) -> None:
        """A held announcement waits `listen.answer_wait_s` for the answer, then resumes."""
        if not self._speaker.held:
            return
        wait = self._settings().listen.answer_wait_s if event.reason in ("heard", "ended") else 0.0
        with self._lock:
            self._cancel_release()
            if self._unanswered == event.conversation_id:
                wait = 0.0  # the remote side already said no answer comes
            self._release_timer = threading.Timer(wait, self._release)
            self._release_timer.daemon = True
            self._waiting_for = event.conversation_id
            self._release_timer.start()

    def _cancel_release(self) -> None:
        if self._release_timer is not None:
            self._release_timer.cancel()
            self._release_timer = None
            self._waiting_for = None

    def _release(self) -> None:
        with self._lock:
            self._release_timer = None
            self._waiting_for = None
        self._speaker.release()
