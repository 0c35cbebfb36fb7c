"""Two or more microphones into one channel, steered at the loudest talker: superdirective
(MVDR against a diffuse field) by default, or delay-and-sum.

A board with several microphones (`audio.input_channels` 2 or 4 and `audio.mic_geometry`)
hears a talker a little earlier on one microphone than on another. Summing the channels
with those differences undone adds the talker in phase and other sounds (babble, a TV, a
fan, the room's reverberation) out of phase, so the talker stands out; averaging them
without the alignment, as a source without a geometry still does, buys nothing. Boards this
small (58-81 mm) are nearly omnidirectional as a plain sum below 2 kHz, where most of speech's
energy is: the superdirective weights (`audio.beamformer`) trade a little of the microphones'
own noise for much of a diffuse field (babble and reverberation from everywhere), keeping the
talker's direction undistorted. A dead channel leaves the rest to delay-and-sum.

The differences are measured, not computed from a direction: each channel's delay against
the reference channel (the loudest healthy one) is the peak of a GCC-PHAT cross-correlation
accumulated over recent speech-like frames (frames well above the noise floor), searched
only over the lags the geometry allows plus `OUT_OF_STEP` samples. So a board mounted
either way round, channels swapped, or channels a few samples out of step (an ADC that
starts one channel late) are all steered alike, and the geometry says only how far apart
the microphones can be.

The work is done in 32 ms frames, hop 16 ms, square-root Hann windows (the overlap-add
reconstructs a single channel exactly), so the output lags the input by 16 ms whichever
way it is mixed, and never depends on how the input was cut into blocks.

A bank of fixed beams (`open_bank`, `audio.steering: wake`): beams from evenly spread directions
(a half circle for microphones on a line, which cannot tell front from back; all round
otherwise), each made by the same weights from its own fixed direction and handed to `tap` beside
the steered output, which they leave as it is. The wake word listens to each (`listen.beams`):
one of them points near whoever says it, before the tracking has turned to them.

Bad input falls back to the best single channel, with the reason in `problem` (and told
to `on_problem`, which the daemon puts on the device's `listen.state`): a channel count the
geometry does not have, a dead channel (digital silence or 30 dB below the others), a delay
beyond the search (channels far out of step). Never silence: with every channel quiet the
loudest is passed on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol

import numpy as np

from edge_agent.audio.frames import Samples

log = logging.getLogger(__name__)

SPEED_OF_SOUND = 343.0
"""Metres a second, at about 20 degrees C."""
FRAME = 512
HOP = FRAME // 2
OUT_OF_STEP = 6
"""Samples beyond the geometry's largest delay searched for (channels a few samples out of step)."""
UPSAMPLE = 4
"""Delays are found to a quarter of a sample (the cross-correlation is interpolated)."""
TRACK_FORGET = 0.93
"""Per speech hop: the cross-spectra remember the last ~0.25 s of speech (a talker turning or
moving is followed within a word)."""
DIAGONAL_LOADING = 0.01
"""The superdirective beamformer's loading. In the simulated room of `tests/audio/test_beamform.py`
(three voices of ours as babble at 10 dB) 0.01 raised the talker-to-babble ratio by 2.5 dB (two
microphones) and 4.3 dB (four) over averaging, 0.1 by 1.9 and 3.1 dB, 1.0 by 0.7 and 1.5; white
noise on each microphone came out 0.6 dB (two) and 0.0 dB (four) above one microphone's at 0.01."""
METHODS = ("superdirective", "delay_sum")
BANK_LINE = 5
BANK_ROUND = 8
"""Fixed beams for microphones on a line (over its half circle: 0, 45, ... 180 degrees from it) and
for any other layout (all round, 45 degrees apart). A pair 58 mm apart tells about five directions
apart below 4 kHz; in `bench hear --real --oracle` five and eight found as much as the beam held on
the talker, or more."""
PHAT_BETA = 0.7
"""Partial PHAT weighting: 1 whitens every bin alike (the sharpest peak, but bins the talker leaves
to the babble count as much as the talker's); 0.7 keeps some weight on the strong bins."""
SPEECH_ABOVE_FLOOR = 4.0
"""A hop whose power is this many times the noise floor's (6 dB) steers; quieter ones do not."""
FLOOR_RISE = 10 ** (3 / 10 * HOP / 16000)
"""The noise floor follows the quietest hops down at once and rises 3 dB a second."""
HEALTH_FORGET = 0.97
"""Per hop: channel powers over about half a second, for the dead-channel check."""
DEAD_DB = 30.0
"""A channel this far below the loudest (or digitally silent) is dead."""
SILENT_POWER = 1e-12
"""Mean square of digital silence (below -120 dBFS)."""

PRESETS: dict[str, tuple[tuple[float, float], ...]] = {
    # Two microphones at either side of the HAT, 58 mm apart (measured on the board by users of
    # it; Seeed's wiki gives no figure).
    "respeaker_2mic": ((-0.029, 0.0), (0.029, 0.0)),
    # ODAS's configuration for the HAT: four microphones on a circle of 40.5 mm radius.
    "respeaker_4mic": ((-0.0405, 0.0), (0.0, 0.0405), (0.0405, 0.0), (0.0, -0.0405)),
    # ODAS's configuration for the USB Mic Array v2.0 (raw channels 1-4 of its 6-channel firmware):
    # a circle of 32 mm radius.
    "respeaker_usb_4mic": ((-0.032, 0.0), (0.0, -0.032), (0.032, 0.0), (0.0, 0.032)),
}
"""`audio.mic_geometry` presets: microphone positions (x, y) in metres, in channel order."""


def parse_geometry(text: str) -> tuple[tuple[float, float], ...]:
    """A preset's name, or positions in metres as `x,y x,y ...` (at least two, at most eight)."""
    if text in PRESETS:
        return PRESETS[text]
    points: list[tuple[float, float]] = []
    for part in text.replace(";", " ").split():
        try:
            coords = [float(v) for v in part.split(",")]
        except ValueError:
            coords = []
        if len(coords) != 2 or not all(math.isfinite(c) and abs(c) <= 1.0 for c in coords):
            raise ValueError(f"mic_geometry: {text!r} is neither a preset ({', '.join(PRESETS)}) nor "
                             "positions in metres like '-0.029,0 0.029,0'")
        points.append((coords[0], coords[1]))
    if not 2 <= len(points) <= 8:
        raise ValueError(f"mic_geometry: {len(points)} microphone(s); give 2 to 8")
    return tuple(points)


def bank_delays(positions: tuple[tuple[float, float], ...], rate: int) -> tuple[np.ndarray, ...]:
    """Each fixed beam's delays (samples behind microphone 0) for a plane wave from its direction
    (see `BANK_LINE`)."""
    pos = np.asarray(positions, dtype=np.float64)
    centred = pos - pos.mean(axis=0)
    _, spread, axes = np.linalg.svd(centred)
    on_a_line = spread[1] < 1e-6 * max(spread[0], 1e-12)
    if on_a_line:
        base = math.atan2(axes[0][1], axes[0][0])
        angles = [base + math.pi * k / (BANK_LINE - 1) for k in range(BANK_LINE)]
    else:
        angles = [2 * math.pi * k / BANK_ROUND for k in range(BANK_ROUND)]
    out = []
    for angle in angles:
        arrival = -(pos @ np.array([math.cos(angle), math.sin(angle)])) / SPEED_OF_SOUND * rate
        out.append(arrival - arrival[0])
    return tuple(out)


class Mixer(Protocol):
    """Frames of several channels in, mono out (`PcmConverter`'s channel stage)."""

    def process(self, frames: Samples) -> Samples: ...

    def flush(self) -> Samples: ...


class Beamformer:
    """`channels` microphones at `positions` into one, superdirective or delay-and-sum, steered by
    GCC-PHAT; with a bank of fixed beams beside it once asked (see the module)."""

    def __init__(self, positions: tuple[tuple[float, float], ...], channels: int, rate: int,
                 name: str = "audio.mic_geometry", method: str = "superdirective") -> None:
        self.channels = channels
        self.rate = rate
        self.name = name
        pos = np.asarray(positions, dtype=np.float64)
        self.method = method
        self.positions = tuple((float(x), float(y)) for x, y in pos)
        self._diffuse_inv = np.zeros(0, dtype=np.float64)
        if method == "superdirective" and channels == len(pos):
            # A diffuse field's coherence between microphones d apart is sinc(2 f d / c); the loading
            # bounds what the weights may lift the microphones' own noise by.
            dist = np.linalg.norm(pos[:, None, :] - pos[None, :, :], axis=2)
            freqs = np.fft.rfftfreq(FRAME) * rate
            coherence = np.sinc(2 * freqs[:, None, None] * dist[None] / SPEED_OF_SOUND)
            self._diffuse_inv = np.linalg.inv(coherence + DIAGONAL_LOADING * np.eye(len(pos))[None])
        spread = max(float(np.linalg.norm(a - b)) for a in pos for b in pos)
        self.max_lag = spread / SPEED_OF_SOUND * rate
        """Largest delay between two microphones the geometry allows (samples)."""
        self.search = math.ceil(self.max_lag) + OUT_OF_STEP
        self.on_problem: Callable[[str | None], None] | None = None
        self.problem: str | None = None
        self.track = True
        """Measure the steering from what is heard; False holds `delays` as they are."""
        self.delays = np.zeros(channels)
        self._beyond = np.zeros(channels, dtype=bool)
        """Each channel's measured delay behind the reference channel (samples)."""
        self.reference = 0
        self.alive = np.ones(channels, dtype=bool)
        self.beaming = channels == len(pos) and channels > 1
        self._mismatch = None if channels == len(pos) else (
            f"{name}: {channels} channel(s) but the geometry has {len(pos)} microphones")
        self._window = np.sqrt(np.hanning(FRAME + 1)[:FRAME]).astype(np.float64)
        self._omega = 2 * np.pi * np.fft.rfftfreq(FRAME)  # radians per sample, per bin
        self._input = np.zeros((FRAME - HOP, channels), dtype=np.float64)
        self._overlap = np.zeros((1, FRAME - HOP), dtype=np.float64)
        self._cross = np.zeros((channels, FRAME // 2 + 1), dtype=np.complex128)
        self._speech = 0.0
        self._floor: float | None = None
        self._power = np.zeros(channels)
        self._hops = 0
        self.cpu_hops = 0
        self.tap: Callable[[np.ndarray], None] | None = None
        """Given each call's fixed beams, (beams, n) float32 at `rate`, once a bank is open."""
        self._bank = np.zeros((0, FRAME // 2 + 1, channels), dtype=np.complex128)
        """The fixed beams' weights, conjugated: (beams, bins, channels)."""
        if self._mismatch:
            self._report(f"{self._mismatch}: hearing the loudest channel alone")

    @classmethod
    def from_geometry(cls, geometry: str, channels: int, rate: int, method: str = "superdirective",
                      ) -> Beamformer:
        return cls(parse_geometry(geometry), channels, rate, method=method)

    def process(self, frames: Samples) -> Samples:
        """Interleaved frames as (n, channels) -> mono, 16 ms later (256 samples at 16 kHz)."""
        data = np.concatenate([self._input, frames.astype(np.float64, copy=False)])
        hops = (data.shape[0] - (FRAME - HOP)) // HOP
        if hops <= 0:
            self._input = data
            return np.zeros(0, dtype=np.float32)
        out = np.empty((1 + len(self._bank), hops * HOP), dtype=np.float64)
        for h in range(hops):
            frame = data[h * HOP:h * HOP + FRAME]
            spectrum = np.fft.rfft(frame.T * self._window, axis=1)
            self._health(frame)
            if self.track:
                self._track(spectrum)
            mixed = np.fft.irfft(self._outputs(spectrum), FRAME, axis=1) * self._window
            mixed[:, :FRAME - HOP] += self._overlap
            out[:, h * HOP:(h + 1) * HOP] = mixed[:, :HOP]
            self._overlap = mixed[:, HOP:].copy()
        self._input = data[hops * HOP:]
        if self.tap is not None and len(self._bank):
            self.tap(out[1:].astype(np.float32))
        result: Samples = out[0].astype(np.float32)
        return result

    def open_bank(self) -> int:
        """Make the fixed beams (`bank_delays`), handed to `tap` from the next call on; their count
        (0 where the channels do not match the geometry: there is nothing to beam)."""
        if self._mismatch or len(self._bank):
            return len(self._bank)
        directions = bank_delays(self.positions, self.rate)
        steer = np.stack([np.exp(-1j * np.outer(self._omega, d)) for d in directions])  # (beams, bins, ch)
        # The same weights as the steered beam's, each from its own fixed direction (delay-and-sum
        # is the superdirective's with no diffuse field: the identity in place of its inverse).
        inverse = self._diffuse_inv if self._diffuse_inv.size else np.eye(self.channels)[None]
        solved = np.einsum("fij,kfj->kfi", np.broadcast_to(inverse, (steer.shape[1], self.channels,
                                                                    self.channels)), steer)
        weights = solved / np.einsum("kfi,kfi->kf", steer.conj(), solved)[:, :, None]
        self._bank = weights.conj()
        self._overlap = np.vstack([self._overlap, np.zeros((len(self._bank), FRAME - HOP))])
        return len(self._bank)

    def _outputs(self, spectrum: np.ndarray) -> np.ndarray:
        """(1 + beams, bins): the output, then each fixed beam (the output too where a channel is
        dead or the channels are out of step: the fallback is the same for all)."""
        if not len(self._bank):
            return self._mix(spectrum)[None]
        if not (self.beaming and self.alive.all()):
            return np.broadcast_to(self._mix(spectrum), (1 + len(self._bank), spectrum.shape[1]))
        beams = np.einsum("kfi,if->kf", self._bank, spectrum)
        return np.vstack([self._mix(spectrum)[None], beams])

    def flush(self) -> Samples:
        """The rest (the input ended): what waits for a hop and the last 16 ms, padded to a hop."""
        waiting = self._input.shape[0] - (FRAME - HOP)
        pad = FRAME - HOP + (-waiting) % HOP
        return self.process(np.zeros((pad, self.channels), dtype=np.float32))

    def _mix(self, spectrum: np.ndarray) -> np.ndarray:
        if not self.beaming:
            picked: np.ndarray = spectrum[self.reference]
            return picked
        if self.method == "superdirective" and self.alive.all():
            return self._superdirective(spectrum)
        weights = self.alive / max(1, int(self.alive.sum()))
        # Advance each channel by its delay behind the reference, then average.
        steer = np.exp(1j * np.outer(self.delays, self._omega)) * weights[:, None]
        mixed: np.ndarray = (spectrum * steer).sum(axis=0)
        return mixed

    def _superdirective(self, spectrum: np.ndarray) -> np.ndarray:
        """MVDR against a diffuse field: the weights that keep the talker (by its measured delays)
        and let through least of a sound arriving from everywhere at once."""
        steer = np.exp(-1j * np.outer(self.delays, self._omega)).T  # (bins, channels)
        solved = np.einsum("fij,fj->fi", self._diffuse_inv, steer)
        weights = solved / np.einsum("fi,fi->f", steer.conj(), solved)[:, None]
        mixed: np.ndarray = np.einsum("fi,if->f", weights.conj(), spectrum)
        return mixed

    def _health(self, frame: np.ndarray) -> None:
        """Channel powers, the reference (loudest live) channel, the dead ones."""
        self._hops += 1
        power = np.mean(frame[HOP:] ** 2, axis=0)  # the hop's new samples
        self._power = HEALTH_FORGET * self._power + (1 - HEALTH_FORGET) * power
        loudest = float(self._power.max())
        if self._hops < 8 or loudest <= SILENT_POWER:
            return  # nothing heard yet: no channel can be told dead
        alive = (self._power > SILENT_POWER) & (self._power > loudest * 10 ** (-DEAD_DB / 10))
        if not alive[self.reference] or self._power[self.reference] < 0.5 * loudest:
            # The reference is the loudest live channel (within 3 dB: it does not flap).
            self.reference = int(np.argmax(self._power))
            self._cross[:] = 0
            self._speech = 0.0
            self._beyond[:] = False
        if (alive != self.alive).any():
            self.alive = alive
            dead = [str(i) for i in np.flatnonzero(~alive)]
            if self._mismatch:
                pass
            elif dead:
                self._report(f"{self.name}: channel {', '.join(dead)} is dead (silent or "
                             f"{DEAD_DB:.0f} dB below the others): "
                             + ("hearing the others" if alive.sum() > 1 else
                                f"hearing channel {self.reference} alone"))
            else:
                self._report(None)
        if not self._mismatch:
            self.beaming = int(self.alive.sum()) > 1 and not self._far_out_of_step()

    def _track(self, spectrum: np.ndarray) -> None:
        """Steer: accumulate PHAT-weighted cross-spectra against the reference over speech."""
        if not self.beaming and self._mismatch:
            return
        ref = spectrum[self.reference]
        power = float(np.mean(np.abs(ref) ** 2))
        self._floor = power if self._floor is None else min(power, self._floor * FLOOR_RISE)
        if power <= SPEECH_ABOVE_FLOOR * max(self._floor, SILENT_POWER):
            return
        cross = spectrum * np.conj(ref)[None, :]
        cross /= np.maximum(np.abs(cross), 1e-12) ** PHAT_BETA
        # Louder hops weigh more: in babble the talker the device should hear is the loudest voice,
        # and the hops where it speaks stand furthest above the floor.
        weight = min(power / max(self._floor, SILENT_POWER), 1000.0)
        self._cross = TRACK_FORGET * self._cross + weight * cross
        self._speech += 1
        if self._speech >= 4 and self._hops % 2 == 0:
            self._estimate()

    def _estimate(self) -> None:
        """The delays: each channel's GCC-PHAT peak within the search, and whether a stronger one
        lies beyond it (channels out of step by more than the search allows)."""
        n = FRAME * UPSAMPLE
        corr = np.fft.irfft(self._cross, n, axis=1)
        wide = (FRAME // 4) * UPSAMPLE
        window = np.concatenate([corr[:, -wide:], corr[:, :wide + 1]], axis=1)
        reach = self.search * UPSAMPLE
        near = window[:, wide - reach:wide + reach + 1]
        self.delays = (np.argmax(near, axis=1) - reach) / UPSAMPLE
        self.delays[self.reference] = 0.0
        far = np.abs(np.argmax(window, axis=1) - wide) > reach
        self._beyond = far & (near.max(axis=1) < 0.8 * window.max(axis=1))

    def _far_out_of_step(self) -> bool:
        edge = self._beyond & self.alive
        if edge.any():
            if self.problem is None or "out of step" not in self.problem:
                self._report(f"{self.name}: channel(s) {', '.join(map(str, np.flatnonzero(edge)))} "
                             f"out of step by more than {self.search} samples: hearing channel "
                             f"{self.reference} alone")
            return True
        if self.problem is not None and "out of step" in self.problem:
            self._report(None)
        return False

    def _report(self, problem: str | None) -> None:
        if problem == self.problem:
            return
        self.problem = problem
        if problem:
            log.warning("%s", problem)
        else:
            log.info("%s: every channel heard again", self.name)
        if self.on_problem is not None:
            self.on_problem(problem)


def make_mixer(geometry: str | None, channels: int, rate: int, method: str = "superdirective",
               ) -> Beamformer | None:
    """The channel stage for `channels` at `rate` Hz: a beamformer where a geometry is set and
    there are several channels, else None (the channels are averaged)."""
    if geometry is None or channels < 2:
        return None
    return Beamformer.from_geometry(geometry, channels, rate, method)
