"""The Wyoming service as one unit: its services, the server, its advertisement.

`edge-agent wyoming` runs it alone; `edge-agent run` runs it inside the daemon
(`wyoming.enabled`), with the satellite on an endpoint of its own. Either way it is handed
what it serves (the synthesizer, Whisper, the checked wake models): it loads no model itself,
so nothing is loaded twice.
"""

from __future__ import annotations

import logging

from edge_agent.asr.transcriber import Transcriber
from edge_agent.endpoints import parse_uri
from edge_agent.mdns import Advertisement
from edge_agent.wyoming.advertise import advertisement
from edge_agent.wyoming.asr import AsrService
from edge_agent.wyoming.satellite import SatelliteService
from edge_agent.wyoming.server import Services, WyomingServer
from edge_agent.wyoming.settings import WyomingSettings
from edge_agent.wyoming.tts import TtsService
from edge_agent.wyoming.wake import WakeService

log = logging.getLogger(__name__)


class Endpoint:
    """One server on one URI and (optionally) its zeroconf advertisement, started and stopped together."""

    def __init__(self, services: Services, settings: WyomingSettings, name: str, uri: str,
                 suffix: str = "") -> None:
        self.settings = settings
        self.name = name
        """The advertised name (the device id)."""
        self.uri = uri
        self.suffix = suffix
        """Added to the advertised name, so two endpoints of a device differ."""
        self.server = WyomingServer(services, settings)
        self.address: tuple[str, int] | None = None
        self.advertisement: Advertisement | None = None

    async def start(self) -> tuple[str, int]:
        """Listen, then advertise (an advertisement that fails is logged: the server still runs)."""
        endpoint = parse_uri(self.uri, ("tcp",))
        self.address = host, port = await self.server.start(endpoint.host, endpoint.port)
        if self.settings.zeroconf:
            advertised = advertisement(self.name, endpoint.host, port, self.suffix)
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

    def __init__(self, settings: WyomingSettings, name: str, tts: TtsService, *,
                 transcriber: Transcriber | None = None, wake: WakeService | None = None,
                 satellite: SatelliteService | None = None) -> None:
        self.settings = settings
        asr = AsrService(transcriber, settings) if transcriber is not None else None
        offered = Services(tts=tts, asr=asr, wake=wake)
        if satellite is None:
            self.services = Endpoint(offered, settings, name, settings.uri)
            self.endpoints = [self.services]
            self._satellite: Endpoint | None = None
        else:
            self._satellite = Endpoint(Services(wake=wake, satellite=satellite), settings, name, settings.uri)
            self.services = Endpoint(offered, settings, name, settings.services_uri, suffix="-services")
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
