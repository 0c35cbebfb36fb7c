"""Hearing: wake word, one command, transcript (`listen.mode`), over any audio source.

`hearing` is the state machine, `loop` runs it over a `microphone` (the input behind the front
end), `transcribing` drives the VAD and Whisper for it, `endofturn` judges pauses, `turn` is the
conversation around it and `remote` the turns Home Assistant transcribes. The names below load on
first use (`edge_agent.lazy`: `config` reads `listen.settings`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_agent.lazy import exports

if TYPE_CHECKING:
    from edge_agent.listen.hearing import Event, Heard, Hearing, Reopened, Streamed, TurnEnded, Woke
    from edge_agent.listen.loop import HearingLoop, HearingModels, hearing_loop

__all__ = ["Event", "Heard", "Hearing", "HearingLoop", "HearingModels", "Reopened", "Streamed", "TurnEnded",
           "Woke", "hearing_loop"]

__getattr__ = exports(__name__, {name: "loop" if name in ("HearingLoop", "HearingModels", "hearing_loop")
                                 else "hearing" for name in __all__})
