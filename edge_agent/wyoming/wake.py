"""Wyoming wake word detection: `detect`, then audio -> `detection` (or `not-detected` at its end).

Each audio stream gets its own `WakeEngine` (the engine keeps streaming state: a
second client's audio must not run through the first one's windows), over the
models `wake.models` names, checked once when the service starts. `detect` may
narrow the stream to some of those models by name. A detection is sent as soon
as the chunk that decided it has been fed; the stream goes on (a later phrase
can fire again after the engine's refractory period), and `audio-stop` with no
detection is answered `not-detected`.

A connection's wake audio is heard at most `wyoming.max_wake_speed` times real
time (`audio.pace.Pace`): a live microphone sends a second of audio a second, a client that
sends faster waits, chunk by chunk, and what it sends waits in the socket's
buffers (nothing is dropped). Unpaced, one client streaming as fast as it could
kept a core busy (11,984 s of audio in 40 s).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from wyoming.event import Event
from wyoming.info import WakeModel, WakeProgram
from wyoming.wake import Detection, NotDetected

from edge_agent import __version__
from edge_agent.audio.pace import Pace
from edge_agent.wake.engine import WakeEngine
from edge_agent.wake.models import WakeModelSpec
from edge_agent.wake.settings import WakeSettings
from edge_agent.wyoming.audio import Recording, Refused
from edge_agent.wyoming.settings import WyomingSettings
from edge_agent.wyoming.tts import ATTRIBUTION

log = logging.getLogger(__name__)

Send = Callable[[Event], Awaitable[None]]


PACE_BURST_S = 2.0
"""Seconds of audio a connection may send ahead of its pace (buffered audio after a stall)."""


class WakeService:
    """The wake word models every connection may ask for."""

    def __init__(self, specs: Sequence[WakeModelSpec], settings: WyomingSettings,
                 refractory_s: float = WakeSettings.refractory_s) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.settings = settings
        self.refractory_s = refractory_s
        """`wake.refractory_s`: how long a model stays quiet after it fired."""

    def program(self) -> WakeProgram:
        return WakeProgram(
            name="edge-speech", description="edge-speech wake word (microWakeWord)", attribution=ATTRIBUTION,
            installed=True, version=__version__,
            models=[WakeModel(name=spec.name, description=spec.wake_word, phrase=spec.wake_word,
                              attribution=ATTRIBUTION, installed=True, version=None, languages=["en"])
                    for spec in self.specs.values()],
        )

    def session(self, send: Send) -> WakeSession:
        return WakeSession(self, send)


class WakeSession:
    """The wake state of one connection: the models asked for and the stream being listened to."""

    def __init__(self, service: WakeService, send: Send) -> None:
        self.service = service
        self.send = send
        self._wanted = list(service.specs.values())
        self._engine: WakeEngine | None = None
        self._recording: Recording | None = None
        self._detected = False
        loop = asyncio.get_running_loop()
        self._clock = loop.time
        self._pace = Pace(service.settings.max_wake_speed, PACE_BURST_S, loop.time())

    @property
    def streaming(self) -> bool:
        """An audio stream is open (`audio-start` without its `audio-stop` yet)."""
        return self._recording is not None

    def detect(self, event: Event) -> None:
        names = event.data.get("names")
        if names is None:
            self._wanted = list(self.service.specs.values())
            return
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise Refused("detect 'names' must be a list of strings", "bad-request")
        wanted = [self.service.specs[n] for n in names if n in self.service.specs]
        if not wanted:
            raise Refused(f"no wake word model named {', '.join(names) or '(none)'} "
                          f"(known: {', '.join(self.service.specs)})", "unknown-wake-word")
        self._wanted = wanted

    async def audio_start(self, event: Event) -> None:
        # No length limit: a wake stream is a live microphone; what one chunk costs is capped by the framing.
        self._recording = Recording.begin(event, float("inf"), keep=False)
        await self._close_engine()
        self._engine = await asyncio.to_thread(WakeEngine, self._wanted,
                                               self.service.refractory_s)
        self._detected = False

    async def audio_chunk(self, event: Event) -> None:
        if self._recording is None or self._engine is None:
            raise Refused("audio-chunk before audio-start", "no-audio-start")
        samples = self._recording.push(event)
        if not samples.size:
            return
        wait_s = self._pace.wait_s(samples.size / self._recording.rate, self._clock())
        if wait_s > 0:
            await asyncio.sleep(wait_s)  # pacing, not synchronisation: the client's excess waits
        for found in await asyncio.to_thread(self._engine.feed, samples):
            self._detected = True
            log.info("wake word %s (p=%.2f) at %.2f s of a client's stream", found.model, found.probability,
                     found.time)
            await self.send(Detection(name=found.model, timestamp=round(found.time * 1000)).event())

    async def audio_stop(self) -> None:
        if self._recording is None:
            raise Refused("audio-stop before audio-start", "no-audio-start")
        self._recording = None
        await self._close_engine()
        if not self._detected:
            await self.send(NotDetected().event())

    async def close(self) -> None:
        await self._close_engine()

    async def _close_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.close)
