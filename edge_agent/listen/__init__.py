"""Hearing: wake word, one command, transcript (`listen.mode`), over any audio source.

`hearing` is the state machine, `loop` runs it over a `microphone` (the input behind the front
end), `transcribing` drives the VAD and Whisper for it, `endofturn` judges pauses, `turn` is the
conversation around it and `remote` the turns Home Assistant transcribes.
"""

from __future__ import annotations

from edge_agent.listen.hearing import Event, Heard, Hearing, Reopened, Streamed, TurnEnded, Woke
from edge_agent.listen.loop import HearingLoop, HearingModels, hearing_loop

__all__ = ["Event", "Heard", "Hearing", "HearingLoop", "HearingModels", "Reopened", "Streamed", "TurnEnded",
           "Woke", "hearing_loop"]
