"""The Wyoming service as one unit: services built from settings, the server, its advertisement.

`edge-agent wyoming` runs it alone; `edge-agent run` runs it inside the daemon
(`wyoming.enabled`), handing it the daemon's synthesizer and recogniser so no
model is loaded twice, with the satellite on an endpoint of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edge_agent.asr.transcriber import Transcriber
from edge_agent.asr.whisper import WhisperOnnx, resolve_export_dir
from edge_agent.config import Settings
from edge_agent.endpoints import parse_uri
from edge_agent.errors import EdgeError
from edge_agent.mdns import Advertisement
from edge_agent.providers import for_use
from edge_agent.tts.voice import Synthesizer
from edge_agent.wyoming.advertise import advertisement
from edge_agent.wyoming.asr import AsrService
from edge_agent.wyoming.satellite import SatelliteService
from edge_agent.wyoming.server import Services, WyomingServer
from edge_agent.wyoming.tts import TtsService
from edge_agent.wyoming.wake import WakeService

log = logging.getLogger(__name__)


def load_transcriber(settings: Settings) -> Transcriber | None:
    """Whisper as configured, or None (said once in the log) when no export is present."""
    directory = resolve_export_dir(settings.asr, settings.models)
    if not (directory / "manifest.json").is_file():
        log.warning("wyoming: no speech to text (no ASR export in %s; see `edge-export whisper`)", directory)
        return None
    model = WhisperOnnx.from_settings(settings.asr, settings.models, for_use(settings, "asr"))
    return Transcriber(model, settings.asr)


def load_wake(settings: Settings) -> WakeService | None:
    """The wake word models of `wake.models`, or None (said once in the log) when one is unusable."""
    try:
        return WakeService.load(settings)
    except EdgeError as exc:
        log.warning("wyoming: no wake word detection: %s", exc)
        return None


class Endpoint:
    """One server on one URI and (optionally) its zeroconf advertisement, started and stopped together."""

    def __init__(self, services: Services, settings: Settings, uri: str, suffix: str = "") -> None:
        self.settings = settings
        self.uri = uri
        self.suffix = suffix
        """Added to the advertised name (the device id), so two endpoints of a device differ."""
        self.server = WyomingServer(services, settings.wyoming)
        self.address: tuple[str, int] | None = None
        self.advertisement: Advertisement | None = None

    async def start(self) -> tuple[str, int]:
        """Listen, then advertise (an advertisement that fails is logged: the server still runs)."""
        endpoint = parse_uri(self.uri, ("tcp",))
        self.address = host, port = await self.server.start(endpoint.host, endpoint.port)
        if self.settings.wyoming.zeroconf:
            advertised = advertisement(self.settings.device.resolved_id, endpoint.host, port, self.suffix)
            try:
                await advertised.start()
                self.advertisement = advertised
            except Exception as exc:
                log.warning("wyoming: zeroconf advertisement failed (%s); add the device in Home "
                            "Assistant by host and port %d", exc, port)
        return host, port

    async def stop(self) -> None:
        if self.advertisement is not None:
            await self.advertisement.stop()
        await self.server.stop()


class WyomingService:
    """What the device offers over Wyoming: its services (text to speech, speech to text, wake word)
    and, inside the daemon, its satellite.

    Home Assistant loads no services from an endpoint whose `info` has a satellite
    (homeassistant/components/wyoming/data.py), so with a satellite there are two
    endpoints, both advertised: `wyoming.uri` is the satellite's (its `info` also lists
    the wake words, which Home Assistant reads to name a detection) and
    `wyoming.services_uri` the services'. Both share one voice, one Whisper and one set
    of wake models: the objects handed in here.
    """

    def __init__(self, settings: Settings, synth: Callable[[], Synthesizer],
                 transcriber: Transcriber | None, wake: WakeService | None = None,
                 satellite: SatelliteService | None = None) -> None:
        self.settings = settings
        offered = Services(tts=TtsService(synth, settings),
                           asr=AsrService(transcriber, settings) if transcriber is not None else None,
                           wake=wake)
        if satellite is None:
            self.services = Endpoint(offered, settings, settings.wyoming.uri)
            self.endpoints = [self.services]
            self._satellite: Endpoint | None = None
        else:
            self._satellite = Endpoint(Services(wake=wake, satellite=satellite), settings,
                                       settings.wyoming.uri)
            self.services = Endpoint(offered, settings, settings.wyoming.services_uri, suffix="-services")
            self.endpoints = [self._satellite, self.services]

    async def start(self) -> tuple[str, int]:
        """Start every endpoint (none stays open when one cannot); the address of the first: the
        satellite's, or the services' where there is no satellite."""
        started: list[Endpoint] = []
        try:
            for endpoint in self.endpoints:
                await endpoint.start()
                started.append(endpoint)
        except BaseException:
            for endpoint in started:
                await endpoint.stop()
            raise
        assert self.address is not None
        return self.address

    @property
    def address(self) -> tuple[str, int] | None:
        """Where the first endpoint listens (the satellite's where there is one)."""
        return self.endpoints[0].address

    @property
    def services_address(self) -> tuple[str, int] | None:
        """Where text to speech, speech to text and wake word detection are served."""
        return self.services.address

    @property
    def satellite(self) -> SatelliteService | None:
        return self._satellite.server.services.satellite if self._satellite is not None else None

    async def stop(self) -> None:
        for endpoint in self.endpoints:
            await endpoint.stop()
        if self.satellite is not None:
            self.satellite.close()
