"""The one listening loop: a block of audio to events, front end -> wake -> VAD -> turn -> transcript.

`hearing_loop` puts the hearing state machine (`listen.hearing`) over the microphone
(`listen.microphone`, the front end already in front of the input) with the models it is handed
(`HearingModels`): `edge-agent listen`, `edge-agent transcribe`, the daemon (and through it the
Wyoming satellite and the ESPHome voice assistant, which take its streamed turns) all run this
loop. A `HearingLoop` is a `Pump` (`audio.pump`): iterate it, `start(on_event)` / `stop()`, or
`async for event in loop.stream()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edge_agent.asr.transcriber import Transcriber
from edge_agent.audio.pump import Pump
from edge_agent.listen.beams import heard_by
from edge_agent.listen.endofturn import EndOfTurn
from edge_agent.listen.hearing import Event, Hearing
from edge_agent.listen.microphone import Microphone
from edge_agent.listen.settings import ListenSettings
from edge_agent.listen.transcribing import Transcribing, TranscribingStats
from edge_agent.vad.segmenter import Segmenter
from edge_agent.wake.engine import WakeEngine


@dataclass(frozen=True)
class HearingModels:
    """What the loop hears with, loaded before the microphone opens (a bad model fails first)."""

    segmenter: Segmenter
    transcriber: Transcriber
    wake: WakeEngine | None = None
    """The wake words (mode `wake` only)."""
    end_of_turn: EndOfTurn | None = None
    """The end-of-turn model (None: turns end at the VAD's hangover)."""


class HearingLoop(Pump[Event]):
    """`Hearing` pumped over a microphone (see `audio.pump.Pump` for the ways to consume it)."""

    thread_name = "listener"

    def __init__(self, microphone: Microphone, hearing: Hearing) -> None:
        super().__init__(microphone.source, hearing)
        self.microphone = microphone
        self.hearing = hearing

    @property
    def transcriber(self) -> Transcriber:
        """Whisper as this loop uses it (the Wyoming service shares it)."""
        return self.hearing.transcribing.transcriber

    @property
    def stats(self) -> TranscribingStats:
        """Audio heard, utterances found and transcribed since the loop started."""
        return self.hearing.transcribing.stats

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop, then the end-of-turn model's worker (a muted device starts a new loop)."""
        super().stop(timeout)
        if self.hearing.end_of_turn is not None:
            self.hearing.end_of_turn.close()


def hearing_loop(mode: Literal["wake", "always"], settings: ListenSettings, models: HearingModels,
                  microphone: Microphone) -> HearingLoop:
    """The hearing loop in `mode` over `microphone`, with `models`; a wake-mode loop without a wake
    engine is never built (nothing falls back to transcribing everything)."""
    transcribing = Transcribing(models.segmenter, models.transcriber)
    wake = heard_by(models.wake, microphone) if mode == "wake" and models.wake is not None else models.wake
    hearing = Hearing(mode, transcribing, wake, settings, microphone.accept_wake,
                      end_of_turn=models.end_of_turn if mode == "wake" else None)
    return HearingLoop(microphone, hearing)
