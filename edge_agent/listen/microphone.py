"""The microphone as the hearing loop hears it: the input, behind the front end, built in one place.

The front end (`audio.frontend`: echo cancellation against what the device plays, gain, noise
suppression) is built here, where the input is opened, and nowhere else. With a playback
reference and wake words, the own-voice guard (`listen.ownvoice`) taps the front end and stands
in front of the wake filter: our own playback never opens a turn. `Microphone` keeps the input
itself too (`input`): its trouble (a command that exits, a pipe that hears noise) and its
channels (the beamformer's fallback) are the daemon's to report, and it never unwraps the
front end to find them.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.audio.beamform import Beamformer
from edge_agent.audio.frontend import FrontEnd, FrontEndSource
from edge_agent.audio.reference import PlaybackReference
from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.sources import AudioSource, open_source
from edge_agent.listen.hearing import WakeFilter
from edge_agent.listen.ownvoice import OwnVoice
from edge_agent.wake.engine import Detection
from edge_agent.wake.settings import WakeSettings


@dataclass(frozen=True)
class Microphone:
    """What the hearing loop reads, and what it was built from."""

    source: AudioSource
    """The blocks the loop hears: `input` behind the front end, or `input` itself."""
    input: AudioSource
    """The input as opened (a command, a pipe, a file, the sound card)."""
    accept_wake: WakeFilter | None = None
    """Asked about each detection (the own-voice guard first, where there is one)."""
    steer_by_wake: bool = False
    """The beamformer's fixed beams are each heard by the wake word (`audio.steering: wake`)."""

    @property
    def beamformer(self) -> Beamformer | None:
        """The input's beamformer, where it mixes several channels into one."""
        mixer = getattr(self.input, "mixer", None)
        return mixer if isinstance(mixer, Beamformer) else None


def open_microphone(audio: AudioSettings, *, source: AudioSource | None = None,
                    reference: PlaybackReference | None = None, wake: WakeSettings | None = None,
                    accept_wake: WakeFilter | None = None, front_end: bool = True) -> Microphone:
    """`source` (default: the configured input, `audio.open_source`) behind the configured front end
    (`audio.*`; none with `front_end` False); with `reference` (what the device plays) and `wake`
    (the wake words heard), `accept_wake` behind the own-voice guard."""
    opened = open_source(audio) if source is None else source
    front = FrontEnd(audio, reference) if front_end else None
    steer = audio.steering == "wake"
    if front is None or not front.active:
        return Microphone(opened, opened, accept_wake, steer)
    if reference is None or wake is None:
        return Microphone(FrontEndSource(opened, front), opened, accept_wake, steer)
    own = OwnVoice(wake)
    front.taps.append(own.hear)

    def accept(detection: Detection) -> bool:
        if own.is_own(detection):
            return False
        return accept_wake is None or accept_wake(detection)

    return Microphone(FrontEndSource(opened, front), opened, accept, steer)
