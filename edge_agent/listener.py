"""The daemon's microphone: the hearing loop started, muted, restarted and reported.

`Listener` owns the one `HearingLoop` the daemon runs (`loop`, None while it does not listen)
and what the status topic says about it (`state`: mode, state, error, wake words, channels). The
loop's events go to the conversation turn; its input's trouble (a command that exits, a pipe that
hears noise) and its beamformer's fallback come back here. Mute and restart run one at a time
(the last request wins); a mute closes the input at once (`close`), from any thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from edge_agent.asr.manifest import EXPORT_HINT
from edge_agent.audio.reference import PlaybackReference
from edge_agent.audio.sources import CommandSource, PipeSource
from edge_agent.config import Settings
from edge_agent.errors import EdgeError
from edge_agent.listen.hearing import WakeFilter
from edge_agent.listen.loop import HearingLoop
from edge_agent.listen.turn import Conversation
from edge_agent.parts import asr_present, build_hearing, model_store
from edge_agent.threads import in_own_thread

log = logging.getLogger(__name__)

HearingFactory = Callable[[Settings, WakeFilter], HearingLoop | None]


def hearing_loop(settings: Settings, accept_wake: WakeFilter,
                 reference: PlaybackReference | None = None) -> HearingLoop | None:
    """Microphone -> wake word -> VAD -> Whisper, when an exported ASR model is present (None otherwise).

    A missing microphone is an `AudioError`, a broken export or wake model a `ModelError`:
    both leave the daemon announcing without listening, with the reason logged once and on
    its status (a wake-mode device never falls back to transcribing everything). The microphone
    hears through the front end, `reference` (what the loudspeaker plays) cancelled.
    """
    if not asr_present(settings):
        return None
    # The configured input, opened once the models load.
    return build_hearing(settings, model_store(settings), None, accept_wake, reference)


class Listener:
    """The hearing loop as the daemon runs it."""

    def __init__(self, make: HearingFactory, settings: Callable[[], Settings], muted: Callable[[], bool],
                 on_status: Callable[[], None]) -> None:
        self._make = make
        self._settings = settings
        self._muted = muted
        self._on_status = on_status
        """Told when `state` changed outside a call of ours (the input's trouble, a failed loop)."""
        self.turns: Conversation | None = None
        """Where the loop's events go, and which wake words it accepts (set before `start`)."""
        self.streaming: Callable[[], bool] | None = None
        """Asked at each wake word whether the turn streams out (`RemoteRouter.streaming`)."""
        self.loop: HearingLoop | None = None
        self.state: dict[str, Any] = {"mode": "off", "state": "off"}
        """What the microphone does, on the status topic: mode, state (listening, muted,
        unavailable, off), error."""
        self._lock = asyncio.Lock()

    def mode(self) -> str:
        settings = self._settings()
        return settings.listen.mode if settings.daemon.listen else "off"

    def start(self) -> None:
        """Build the loop and start it (or say on `state` why not); blocks while the models load."""
        settings, mode = self._settings(), self.mode()
        if mode == "off":
            log.info("not listening: listen.mode is off")
            return
        if self._muted():
            log.info("not listening: the microphone is muted")
            self.state = {"mode": mode, "state": "muted"}
            return
        assert self.turns is not None
        try:
            loop = self._make(settings, self.turns.accept_wake)
        except EdgeError as exc:
            log.error("not listening: %s", exc)
            self.state = {"mode": mode, "state": "unavailable", "error": str(exc)}
            return
        if loop is None:
            # A device set to listen that cannot is a fault to fix, not a mode: say how.
            log.warning("not listening: no ASR model present; %s", EXPORT_HINT)
            self.state = {"mode": mode, "state": "unavailable",
                          "error": f"no ASR model present; {EXPORT_HINT}"}
            return
        self.loop = loop
        self.state = {"mode": mode, "state": "listening"}
        if mode == "wake":
            self.state["wake_words"] = list(settings.wake.models)
        # The factory may hand another pump (tests and benchmarks do): only a hearing loop streams
        # turns and has an input of its own to watch.
        hears = isinstance(loop, HearingLoop)
        if hears:
            loop.hearing.stream_turns = self.streaming
        source = loop.microphone.input if hears else None
        if isinstance(source, (CommandSource, PipeSource)):
            source.on_trouble = lambda problem: self._input_trouble(loop, problem)
        if self._muted():  # muted while the loop was being built: its input closes unheard
            loop.halt()
            self.loop = None
            self.state = {"mode": mode, "state": "muted"}
            return
        beamformer = loop.microphone.beamformer if hears else None
        if beamformer is not None:
            beamformer.on_problem = lambda problem: self._input_channels(loop, problem)
            if beamformer.problem:
                self.state["channels"] = beamformer.problem

        def on_error(exc: BaseException) -> None:
            log.error("listener stopped: %s", exc)
            self.state = {"mode": mode, "state": "unavailable", "error": str(exc)}
            self._on_status()

        loop.start(self.turns.on_event, on_error=on_error,
                   on_end=lambda: log.info("listener ended (its source closed)"))
        log.info("listening", extra={"mode": mode})

    def muted_before_start(self) -> None:
        """The status on connecting, before anything listens: a muted microphone says so."""
        mode = self.mode()
        if self._muted() and mode != "off":
            self.state = {"mode": mode, "state": "muted"}

    def close(self) -> None:
        """Close the input now (any thread), whatever else the daemon is waiting for; `apply_mute`
        then waits for the loop's thread."""
        loop = self.loop
        if loop is not None:
            loop.halt()

    async def apply_mute(self) -> None:
        """Follow the mute switch: stop the loop, or start it again."""
        async with self._lock:  # one switch at a time; the last request wins
            if self._muted() and self.loop is not None:
                loop, self.loop = self.loop, None
                await in_own_thread(loop.stop)
                self.state = {"mode": self.state.get("mode", "off"), "state": "muted"}
                self._on_status()
            elif not self._muted() and self.loop is None:
                await in_own_thread(self.start)
                self._on_status()

    async def restart(self) -> None:
        """A new loop with the settings as they are now (the user chose other wake words)."""
        async with self._lock:
            loop, self.loop = self.loop, None
            if loop is not None:
                await in_own_thread(loop.stop)
            if not self._muted():
                await in_own_thread(self.start)

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.stop()

    # -- turns without a wake word ---------------------------------------------------------

    def open_turn(self, conversation_id: str, *, stream: bool) -> bool:
        """A turn without a wake word (any thread); False when the microphone does not listen for
        wake words."""
        if self.loop is not None and self.state.get("mode") == "wake":
            self.loop.hearing.open_turn(conversation_id, stream=stream)
            return True
        return False

    def end_turn(self, conversation_id: str) -> None:
        """Home Assistant has the command (or is gone): the hearing loop ends the streamed turn."""
        if isinstance(self.loop, HearingLoop):
            self.loop.hearing.end_turn(conversation_id)

    # -- the input's health ---------------------------------------------------------------

    def _input_trouble(self, loop: HearingLoop, problem: str | None) -> None:
        """`audio.input_command` exited (and is being started again), `audio.input_pipe` hears garbage,
        or either hears again: on the status."""
        if self.loop is not loop:
            return  # muted or stopped since
        state = {k: v for k, v in self.state.items() if k != "error"}
        state.update({"state": "unavailable", "error": problem} if problem else {"state": "listening"})
        self.state = state
        self._on_status()

    def _input_channels(self, loop: HearingLoop, problem: str | None) -> None:
        """The beamformer fell back to one channel (a dead one, a count the geometry lacks), or
        hears them all again: `channels` on the status; the device still listens."""
        if self.loop is not loop:
            return
        state = {k: v for k, v in self.state.items() if k != "channels"}
        if problem:
            state["channels"] = problem
        self.state = state
        self._on_status()
