"""The microphone front end: echo cancellation, automatic gain, noise suppression, in that order.
As shipped only the canceller is on (`audio.echo_cancel`); the gain and the suppressor wait for
`audio.auto_gain_dbfs` and `audio.noise_suppression`.

One stage ahead of everything that hears (wake word, VAD, Whisper, the Wyoming satellite's
stream): `FrontEndSource` wraps any `AudioSource`, so each consumer gets the cleaned blocks
without knowing. The work is done in 10 ms frames:

1. echo cancellation (`audio.echo`) against the playback reference (`audio.reference`),
   for live sources only (a file shares no clock with our loudspeaker) and only while
   something has played within the canceller's reach;
2. automatic gain (`AutoGain`): our own, because `pyspeex-noise`'s gain control returned
   silence here at every level tried. It comes before the suppressor: measured by `bench hear`
   (12 clips), gain after suppression chased the suppressor's residue (a quiet talker over a -70
   dBFS floor: 3 of 12 found, gain before it 9). It rises slowly (2 dB a second of speech) and
   takes a level within 18 dB of the recent noise floor for noise, so a fan or babble is not
   lifted into the wake word (in `bench hear --room` the faster gain cost 12 of the 14 detections
   the chain now finds in fan noise at 10 dB);
3. noise suppression, whose `audio.noise_suppressor` says: WebRTC's (`webrtc-noise-gain`,
   wyoming-satellite's) by default, or speex's spectral suppressor (`pyspeex-noise`, Home
   Assistant's pipeline's; a 145 kB wheel against WebRTC's 8.9 MB). In `bench hear --room`
   WebRTC's found as many wake words in noise as speex's behind a gain and lost fewer words in the
   quiet room (figures in `AudioSettings.noise_suppressor`); at a true 10 dB SNR without a room it
   did as well or a little better (pink 12 of 12 against 10 behind our gain); neither helps in
   babble. Alone, speex removes speech quieter than about -40 dBFS with the noise (0 of 12 found):
   hence the gain first, and a warning when speex suppresses without it.

A live source whose consumer has fallen more than `BEHIND_S` behind the microphone passes
blocks through unprocessed until it has caught up (counted in `skipped`): the front end
drops its own work, never audio.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from edge_agent.audio.echo import FRAME, EchoCanceller
from edge_agent.audio.frames import Samples
from edge_agent.audio.reference import PlaybackReference
from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.sources import TARGET_RATE, AudioSource
from edge_agent.audio.wav import from_pcm16, to_pcm16
from edge_agent.errors import AudioError

log = logging.getLogger(__name__)

SUPPRESSION_DB = {1: -10, 2: -20, 3: -30, 4: -40}
"""`audio.noise_suppression` level -> how far speex pulls steady noise down."""
BEHIND_S = 1.0
"""A live consumer this far behind the microphone skips the front end's work until it catches up."""
ANCHOR_PERIOD_S = 10.0
"""How often the microphone's sample clock may move on to the least late block's time."""

ReferenceTap = Callable[[Samples], None]
"""Called with the playback reference as the microphone hears it, for each block the source yields."""


class NoiseSuppressor(Protocol):
    """Noise suppression on 10 ms frames (`audio.noise_suppressor`)."""

    level: int

    def process(self, frame: Samples) -> Samples: ...


class SpeexSuppressor:
    """Speex's spectral suppressor (`pyspeex-noise`, what Home Assistant's pipeline uses)."""

    def __init__(self, level: int) -> None:
        from pyspeex_noise import AudioProcessor

        self.level = level
        self._speex = AudioProcessor(0, SUPPRESSION_DB[level])

    def process(self, frame: Samples) -> Samples:
        return from_pcm16(self._speex.process_10ms(to_pcm16(frame)))


class WebRtcSuppressor:
    """WebRTC's suppressor (`webrtc-noise-gain`, what wyoming-satellite uses), its gain control off
    (ours comes first when `audio.auto_gain_dbfs` is set)."""

    def __init__(self, level: int) -> None:
        try:
            from webrtc_noise_gain import AudioProcessor
        except ImportError as exc:  # no wheel for this platform (Linux x86_64 and aarch64 have one)
            raise AudioError(f"audio.noise_suppressor webrtc: webrtc-noise-gain is not installed ({exc}); "
                             "install it or set audio.noise_suppressor: speex") from None

        self.level = level
        self._webrtc = AudioProcessor(0, level)  # its levels 1..4 are WebRTC's low .. very high

    def process(self, frame: Samples) -> Samples:
        return from_pcm16(self._webrtc.Process10ms(to_pcm16(frame)).audio)


def make_suppressor(settings: AudioSettings) -> NoiseSuppressor | None:
    """The configured suppressor, None when `audio.noise_suppression` is 0."""
    level = settings.noise_suppression
    if not level:
        return None
    if settings.noise_suppressor == "speex":
        return SpeexSuppressor(level)
    return WebRtcSuppressor(level)


FLOOR_PART_FRAMES = 25
FLOOR_PARTS = 6
"""The gain's noise floor is the quietest 10 ms frame of the last 1.25-1.5 s (six quarter seconds):
it follows a fan switched on, or the room's noise at start, within 1.5 s. It used to fall at once
and rise 3 dB a second: started in a quiet moment, it took 10 s to reach a fan 30 dB louder, and
until then took the fan for speech, pumped the gain up on it and pulled it down by 12 dB within the
wake word; in `bench hear --room` that made the gain alone cost okay_nabu most of its detections in
fan noise at 10 dB SNR."""
STALE_LEVEL = 8.0
"""A speech level (peaks) less than 18 dB above the floor (frame RMS) is the noise's: a 10 ms frame of
steady noise peaks about 9 dB above its RMS, one taken for speech is 12 dB above the floor in RMS."""


class AutoGain:
    """Brings speech peaks to `target_dbfs` below full scale, by at most `max_gain_db`.

    A noise floor follows the quietest frames; frames well above it are taken for speech
    and move the level estimate. The gain moves slowly, 2 dB a second up and 10 down, and a
    limiter takes off, frame by frame, what would clip meanwhile (a shout).

    Slowly because the wake models take a level that moves within the wake word worse than
    no gain at all. Measured in `bench hear --room`'s scenes (mean peak probability of 9-15
    clips, babble at 10 dB SNR): at 10 dB a second up and 200 down the gain, which cannot tell
    the talker from other voices, rose on the babble and fell inside the wake word: okay_nabu
    0.45 raw, 0.33 through the gain; hey_jarvis, alexa, hey_mycroft 0.46 raw, 0.08. At 2 and
    10 dB a second: 0.52 and 0.45. The price: a quiet talker is lifted by 30 dB over 15 s of
    speech, not 3 s (the gain keeps its level between utterances).
    """

    RISE_DB = 0.02
    FALL_DB = 0.1
    """Largest gain change per 10 ms frame, up and down (short of clipping)."""

    def __init__(self, target_dbfs: int, max_gain_db: float = 30.0) -> None:
        self.target = 10 ** (-target_dbfs / 20)
        self.max_gain = 10 ** (max_gain_db / 20)
        self.gain = 1.0
        self._floor: float | None = None
        self._parts: deque[float] = deque(maxlen=FLOOR_PARTS - 1)
        """The quietest frame of each finished quarter second, newest last."""
        self._part = math.inf
        self._part_frames = 0
        self._level = 0.0

    def process(self, frame: Samples) -> Samples:
        rms = float(np.sqrt(np.mean(frame.astype(np.float64) ** 2)))
        peak = float(np.max(np.abs(frame))) if frame.size else 0.0
        # Only frames 12 dB above the noise floor are speech (a gain that followed the noise would
        # lift the noise).
        self._floor = max(1e-6, self._track_floor(rms))
        if rms > 4 * self._floor and peak > 1e-4:
            self._level = peak if peak > self._level else 0.99 * self._level + 0.01 * peak
        if self._level <= STALE_LEVEL * self._floor:
            # Taken before the floor knew the noise (a fan switched on, the first second): it was
            # the noise's, so the gain goes back to unity rather than keep the noise lifted.
            self._level = 0.0
        want = min(self.max_gain, self.target / self._level) if self._level > 0 else 1.0
        if want != self.gain:
            step_db = 20 * math.log10(want / self.gain)
            step_db = max(-self.FALL_DB, min(self.RISE_DB, step_db))
            self.gain *= 10 ** (step_db / 20)
        out = frame * np.float32(self.gain)
        top = float(np.max(np.abs(out))) if out.size else 0.0
        if top > 0.99:
            out = out * np.float32(0.99 / top)
        result: Samples = out.astype(np.float32, copy=False)
        return result

    def _track_floor(self, rms: float) -> float:
        """The quietest frame over the current quarter second and the finished ones kept."""
        self._part = min(self._part, rms)
        self._part_frames += 1
        floor = min(self._part, *self._parts) if self._parts else self._part
        if self._part_frames == FLOOR_PART_FRAMES:
            self._parts.append(self._part)
            self._part, self._part_frames = math.inf, 0
        return floor


class FrontEnd:
    """Microphone blocks in, cleaned blocks out (10 ms frames; up to 159 samples wait for the next
    block)."""

    def __init__(self, settings: AudioSettings, reference: PlaybackReference | None = None) -> None:
        self.settings = settings
        self.reference = reference
        self.echo: EchoCanceller | None = None
        if reference is not None and settings.echo_cancel:
            try:
                self.echo = EchoCanceller(settings.echo_tail_ms, settings.echo_max_delay_ms)
            except AudioError as exc:
                log.warning("no echo cancellation: %s", exc)
        self.suppressor = make_suppressor(settings)
        self.gain = AutoGain(settings.auto_gain_dbfs) if settings.auto_gain_dbfs else None
        if isinstance(self.suppressor, SpeexSuppressor) and self.gain is None:
            log.warning("audio.noise_suppression without audio.auto_gain_dbfs: speech quieter than "
                        "about -40 dBFS is suppressed with the noise (set auto_gain_dbfs, e.g. 10)")
        self.taps: list[ReferenceTap] = []
        """Told the reference as heard, block by block (the own-voice guard)."""
        self._carry = np.zeros(0, dtype=np.float32)
        self._position: int | None = None
        """Timeline sample (`PlaybackReference.index`) of the first carried microphone sample."""
        self._slack: int | None = None
        self._period = 0
        self.skipped = 0
        """Frames passed through unprocessed because the consumer was behind."""
        self.cpu_s = 0.0

    @property
    def active(self) -> bool:
        """Whether it does anything (else the source is used as it is)."""
        return bool(self.reference is not None or self.suppressor or self.gain)

    def process(self, block: Samples, captured: float | None = None,
                lost: bool = False) -> tuple[Samples, Samples]:
        """Cleaned samples and the reference as heard at them; `captured` is the monotonic time the
        block arrived less its duration (None: a file, with no playback to cancel); `lost`: audio
        was dropped before this block."""
        started = time.thread_time()
        if captured is not None and self.reference is not None:
            self._anchor(captured, block.size, lost)
        data = np.concatenate([self._carry, block]) if self._carry.size else block
        usable = data.size - data.size % FRAME
        self._carry = data[usable:].copy()
        out = np.empty(usable, dtype=np.float32)
        heard = np.zeros(usable, dtype=np.float32)
        behind = self._behind(usable)
        for i in range(0, usable, FRAME):
            frame = data[i:i + FRAME]
            if behind:
                self.skipped += 1
                out[i:i + FRAME] = frame
                continue
            out[i:i + FRAME], heard[i:i + FRAME] = self._frame(frame, i)
        if self._position is not None:
            self._position += usable
        self.cpu_s += time.thread_time() - started
        return out, heard

    def flush(self) -> Samples:
        """What waits for a full frame, unprocessed (the source ended)."""
        tail, self._carry = self._carry, np.zeros(0, dtype=np.float32)
        return tail

    def _frame(self, frame: Samples, offset: int) -> tuple[Samples, Samples]:
        heard = _SILENT
        if self.reference is not None and self._position is not None:
            ref = self.reference.read(self._position + offset, FRAME)
            if self.echo is not None:
                frame = self.echo.process(frame, ref)
                heard = self.echo.aligned(FRAME)
            else:
                heard = ref
        if self.gain is not None:
            frame = self.gain.process(frame)
        if self.suppressor is not None:
            frame = self.suppressor.process(frame)
        return frame, heard

    def _anchor(self, captured: float, size: int, lost: bool) -> None:
        """Keep the microphone's sample clock on the timeline.

        A block arrives no earlier than it was recorded, and later by however long its consumer
        was busy: the least late block is the truth. So an earlier arrival than the sample clock
        predicts moves the clock back at once, while a later one (a busy consumer, a sound card
        running slower than the monotonic clock) moves it on only by the least lateness of a
        whole `ANCHOR_PERIOD_S`. Lost audio (the source's overflow count rose) re-anchors at once.
        """
        assert self.reference is not None
        measured = self.reference.index(captured) - self._carry.size
        if self._position is None or lost:
            self._position, self._slack, self._period = measured, None, 0
            return
        late = measured - self._position
        if late < -FRAME:  # within a frame is the clocks' rounding, not news
            self._position, late = measured, 0
        self._slack = late if self._slack is None else min(self._slack, late)
        self._period += size
        if self._period >= ANCHOR_PERIOD_S * TARGET_RATE:
            if self._slack > FRAME:
                log.info("microphone clock moved on by %.0f ms", self._slack / TARGET_RATE * 1000)
                self._position += self._slack
            self._slack, self._period = None, 0

    def _behind(self, usable: int) -> bool:
        if self.reference is None or self._position is None:
            return False
        now = self.reference.index(self.reference.clock())
        return now - (self._position + usable) > BEHIND_S * TARGET_RATE

    def close(self) -> None:
        if self.echo is not None:
            self.echo.close()


_SILENT = np.zeros(FRAME, dtype=np.float32)


class FrontEndSource:
    """An `AudioSource` whose blocks went through a `FrontEnd`."""

    def __init__(self, source: AudioSource, front_end: FrontEnd,
                 clock: Callable[[], float] | None = None) -> None:
        self.source = source
        self.front_end = front_end
        self.sample_rate = source.sample_rate
        self.live = source.live
        ref = front_end.reference
        self._clock = clock or (ref.clock if ref is not None else time.monotonic)

    def blocks(self) -> Iterator[Samples]:
        front = self.front_end
        overflows = getattr(self.source, "overflows", 0)
        for block in self.source.blocks():
            # A live block arrives as its last sample is recorded, or later.
            captured = self._clock() - block.size / TARGET_RATE if self.live else None
            dropped = getattr(self.source, "overflows", 0)
            out, heard = front.process(block, captured, lost=dropped != overflows)
            overflows = dropped
            for tap in front.taps:
                tap(heard)
            if out.size:
                yield out
        tail = front.flush()
        for tap in front.taps:
            tap(np.zeros(tail.size, dtype=np.float32))
        if tail.size:
            yield tail

    def close(self) -> None:
        # The front end itself is left to the garbage collector: `close` may come from another
        # thread while a block is still being processed.
        self.source.close()

    def __getattr__(self, name: str) -> Any:
        # Whatever else the wrapped source offers (a device name, overflow counts).
        return getattr(self.source, name)
