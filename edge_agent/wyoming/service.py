"""The Wyoming service as one unit: services built from settings, the server, its advertisement.

`edge-agent wyoming` runs it alone; `edge-agent run` runs it inside the daemon
(`wyoming.enabled`), handing it the daemon's synthesizer and recogniser so no
model is loaded twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edge_agent.asr.listener import Transcriber
from edge_agent.asr.whisper import WhisperOnnx, resolve_export_dir
from edge_agent.config import Settings, parse_uri
from edge_agent.errors import EdgeError
from edge_agent.providers import for_use
from edge_agent.tts.voice import Synthesizer
from edge_agent.wyoming.advertise import Advertisement
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


class WyomingService:
    """The server and (optionally) its zeroconf advertisement, started and stopped together."""

    def __init__(self, settings: Settings, synth: Callable[[], Synthesizer],
                 transcriber: Transcriber | None, wake: WakeService | None = None,
                 satellite: SatelliteService | None = None) -> None:
        self.settings = settings
        services = Services(tts=TtsService(synth, settings),
                            asr=AsrService(transcriber, settings) if transcriber is not None else None,
                            wake=wake, satellite=satellite)
        self.server = WyomingServer(services, settings.wyoming)
        self.address: tuple[str, int] | None = None
        self.advertisement: Advertisement | None = None

    async def start(self) -> tuple[str, int]:
        """Listen, then advertise (an advertisement that fails is logged: the server still runs)."""
        endpoint = parse_uri(self.settings.wyoming.uri, ("tcp",))
        self.address = host, port = await self.server.start(endpoint.host, endpoint.port)
        if self.settings.wyoming.zeroconf:
            advertisement = Advertisement(self.settings.device.resolved_id, endpoint.host, port)
            try:
                await advertisement.start()
                self.advertisement = advertisement
            except Exception as exc:
                log.warning("wyoming: zeroconf advertisement failed (%s); add the device in Home "
                            "Assistant by host and port %d", exc, port)
        return host, port

    @property
    def satellite(self) -> SatelliteService | None:
        return self.server.services.satellite

    async def stop(self) -> None:
        if self.advertisement is not None:
            await self.advertisement.stop()
        await self.server.stop()
        if self.satellite is not None:
            self.satellite.close()
