"""The wake word heard on every fixed beam of a microphone array as well as on the steered one.

A beam steered at the loudest voice (`audio.beamform`) turns toward whoever is talking, and
before the wake word that is someone else: with other people talking it reaches the talker
within a quarter of a second of speech, most of "Alexa". A bank of fixed beams does not have to
turn. With `audio.steering: wake` each of the beamformer's fixed beams (`Beamformer.open_bank`)
has a wake engine of its own; the stream the hearing loop hears (the steered output, behind the
echo canceller and the rest of the front end) keeps its own engine, so a wake word the device
hears today is heard as before, and every beam is one more chance. The command is heard on the
steered output all the same: by the end of the wake phrase the tracking has turned to the talker,
and a fixed beam held for the command, up to half a beam's width off the talker, lost more of
its words (`bench hear --real-commands`, in docs/listening.md).

The beams come from the beamformer's `tap` as the input is read, before the front end has the
same samples: their detections wait here, by stream time, until the hearing loop's stream
reaches them (`feed`), merged with its own engine's under one refractory period, so one wake
word is one detection however many beams heard it. The beams are heard without the echo
canceller (it has the output's echo path, not theirs): a wake word in the device's own playback
is refused by the own-voice guard as on the output.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from edge_agent.audio.beamform import Beamformer
from edge_agent.audio.frames import Samples
from edge_agent.audio.resample import StreamResampler
from edge_agent.listen.microphone import Microphone
from edge_agent.wake.engine import SAMPLE_RATE, Detection, WakeEngine, WakeStats

log = logging.getLogger(__name__)


class WakeBank:
    """`engine` on the hearing loop's stream and a copy of it on each of `beamformer`'s fixed beams;
    fed like a `WakeEngine` (`feed`), the beams by the beamformer's `tap`."""

    def __init__(self, engine: WakeEngine, beamformer: Beamformer) -> None:
        self.engine = engine
        self.beamformer = beamformer
        beams = beamformer.open_bank()
        refractory_s = engine.refractory / SAMPLE_RATE
        # Each beam at the model's own cutoff. A cutoff raised for the beams (0.9 for alexa's 0.85)
        # gave back most of what they find with two microphones (0.71 against 0.79 of held-out
        # people under three other talkers) for 0.6 false wakes an hour fewer in that babble
        # (1.1 against 1.7; with four microphones 0.87 against 0.89, 1.1 against 2.8 an hour).
        self._beams = [WakeEngine(engine.specs, refractory_s) for _ in range(beams)]
        self._resamplers = [StreamResampler(beamformer.rate, SAMPLE_RATE) for _ in range(beams)]
        self._heard: list[tuple[Detection, int]] = []
        """The beams' detections the stream has not reached yet, with the beam's index."""
        self._lock = threading.Lock()
        self._pos = 0
        self._quiet_until = 0
        self._beams_quiet_until = 0
        self.detections = 0
        self.by_beam = [0] * beams
        """Detections first heard on each beam (the output's own are not counted here)."""
        beamformer.tap = self.hear

    @property
    def stats(self) -> WakeStats:
        """The output's engine's counts, with the bank's detections and every beam's peaks."""
        peak = dict(self.engine.stats.peak)
        for beam in self._beams:
            for model, p in beam.stats.peak.items():
                peak[model] = max(p, peak.get(model, 0.0))
        return WakeStats(self.engine.stats.audio_s, self.detections, self.engine.stats.suppressed, peak)

    def hear(self, beams: np.ndarray) -> None:
        """The fixed beams of the input's next samples, (beams, n) at the beamformer's rate (its `tap`)."""
        found: list[tuple[Detection, int]] = []
        for k, (engine, resampler) in enumerate(zip(self._beams, self._resamplers, strict=True)):
            found += [(d, k) for d in engine.feed(resampler.push(beams[k]))
                      if round(d.time * SAMPLE_RATE) >= self._beams_quiet_until]
        if not found:
            return
        # The first beam to hear it; the others that hear the same wake word a little later (within
        # the refractory period) do not wake the device again.
        detection, beam = min(found, key=lambda f: (f[0].time, -f[0].probability))
        self._beams_quiet_until = round(detection.time * SAMPLE_RATE) + self.engine.refractory
        with self._lock:
            self._heard.append((detection, beam))

    def feed(self, samples: Samples) -> list[Detection]:
        """The hearing loop's next block (after the front end): the detections up to its end, its own
        engine's and the beams', one per wake word."""
        own = self.engine.feed(samples)
        self._pos += samples.size
        with self._lock:
            ready = [d for d in self._heard if d[0].time * SAMPLE_RATE <= self._pos]
            self._heard = [d for d in self._heard if d[0].time * SAMPLE_RATE > self._pos]
        out = []
        for detection, beam in sorted([(d, -1) for d in own] + ready, key=lambda f: f[0].time):
            at = round(detection.time * SAMPLE_RATE)
            if at < self._quiet_until:
                continue
            self._quiet_until = at + self.engine.refractory
            self.detections += 1
            if beam >= 0:
                self.by_beam[beam] += 1
                log.debug("wake word %s at %.2f s on fixed beam %d", detection.model, detection.time, beam)
            out.append(detection)
        return out

    def close(self) -> None:
        self.beamformer.tap = None
        for engine in self._beams:
            engine.close()


def heard_by(engine: WakeEngine, microphone: Microphone) -> WakeEngine | WakeBank:
    """`engine`, or a bank around it where `microphone`'s array is steered by the wake word and has
    fixed beams to hear (not with a channel count its geometry lacks)."""
    beamformer = microphone.beamformer
    if beamformer is not None and not microphone.steer_by_wake:
        beamformer.tap = None  # a bank an earlier loop opened on a source kept across loops
    if not microphone.steer_by_wake or beamformer is None:
        return engine
    bank = WakeBank(engine, beamformer)
    if not bank.by_beam:
        bank.close()
        return engine
    log.info("the wake word is heard on %d fixed beams and on the steered one", len(bank.by_beam))
    return bank
