"""Our own voice, told from a user's by the audio we played, not by the words of the announcement.

The wake detector runs a second time on the playback reference as the microphone hears it
(the front end's tap, aligned by the echo canceller's delay estimate), with every model's
cutoff lowered to `RATIO` of its own: the reference is clean, so it crosses that bar at
least as early as the microphone crosses the real one. A microphone detection is our own
when the reference fired the same model within `BEFORE_S` before it to `AFTER_S` after it.
That catches every spelling an announcement may use ("OK Nabu", "Okey Nabu", Home
Assistant's recorded audio) and lets a user who says the wake word over our playback
through: the reference never said it.

The reference is fed in the listener's thread, block by block, before the hearing loop
sees the same block, so a decision always has the reference up to the detection's time.
Silent reference blocks are counted but not run through the detector (no playback, no CPU).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import replace

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.wake import SAMPLE_RATE, Detection, WakeEngine, check_all
from edge_agent.wake.settings import WakeSettings

log = logging.getLogger(__name__)

RATIO = 0.6
"""The reference's detector fires at this fraction of each model's cutoff."""
BEFORE_S = 2.0
AFTER_S = 0.3
"""How far the reference's detection may lie before and after the microphone's (seconds)."""


class OwnVoice:
    """Feed `hear` the reference as heard, block by block; ask `is_own` about a detection."""

    def __init__(self, settings: WakeSettings) -> None:
        specs = [replace(s, probability_cutoff=s.probability_cutoff * RATIO) for s in check_all(settings)]
        self.engine = WakeEngine(specs, refractory_s=0.0)
        self._pos = 0
        """Samples of stream heard (fed or skipped as silent)."""
        self._fired: deque[tuple[str, float]] = deque(maxlen=64)
        self.fed_s = 0.0

    def hear(self, reference: Samples) -> None:
        """The reference for the next block of the microphone's stream (same length)."""
        start = self._pos
        self._pos += reference.size
        if reference.size == 0 or not np.any(reference):
            return
        before = self.engine.position
        self.fed_s += reference.size / SAMPLE_RATE
        for found in self.engine.feed(reference):
            at = start / SAMPLE_RATE + (found.time - before)
            self._fired.append((found.model, at))

    def is_own(self, detection: Detection) -> bool:
        """Whether the reference said the same wake word at that moment."""
        for model, at in self._fired:
            if model == detection.model and detection.time - BEFORE_S <= at <= detection.time + AFTER_S:
                log.info("wake word %s at %.2f s is our own playback (the reference fired at %.2f s)",
                         detection.model, detection.time, at)
                return True
        return False

    def close(self) -> None:
        self.engine.close()
