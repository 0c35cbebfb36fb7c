"""The ESPHome API service inside `edge-agent run`: the server and its advertisement together.

Home Assistant's esphome integration discovers `_esphomelib._tcp.local.` and reads
the TXT record's `mac` (the device's unique id there), `friendly_name`, `version`
and `platform`; the device's MAC here is a locally administered one derived from
the device id, so it is the same after every restart and on every network.
"""

from __future__ import annotations

import hashlib
import logging

from edge_agent.esphome.assistant import Assistant
from edge_agent.esphome.entities import Entities
from edge_agent.esphome.frames import FrameLimits
from edge_agent.esphome.noise import check_key
from edge_agent.esphome.server import EsphomeServer
from edge_agent.esphome.settings import EsphomeSettings
from edge_agent.mdns import Advertisement, label

log = logging.getLogger(__name__)

SERVICE_TYPE = "_esphomelib._tcp.local."
ESPHOME_VERSION = "2025.9.0"
"""The firmware version we say we speak like (what linux-voice-assistant says)."""


def device_mac(device_id: str) -> str:
    """A stable, locally administered MAC for `device_id` (`02:xx:...`)."""
    digest = hashlib.sha256(device_id.encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


class EsphomeService:
    """Started and stopped with the daemon."""

    def __init__(self, settings: EsphomeSettings, device_id: str, assistant: Assistant,
                 entities: Entities) -> None:
        self.settings = settings
        self.name = settings.name or device_id
        self.mac = device_mac(device_id)
        limits = FrameLimits(settings.max_frame_bytes, settings.idle_timeout_s)
        self.assistant = assistant
        self.server = EsphomeServer(label(self.name), settings.host, settings.port, assistant, entities,
                                    mac=self.mac, limits=limits, max_connections=settings.max_connections,
                                    max_handshakes=settings.max_handshakes,
                                    handshake_timeout_s=settings.handshake_timeout_s,
                                    max_buffered_bytes=settings.max_buffered_bytes,
                                    psk=check_key(settings.encryption_key) or None)
        self._advert: Advertisement | None = None

    @property
    def port(self) -> int:
        return self.server.port

    async def start(self) -> None:
        await self.server.start()
        if self.assistant.player is not None:
            self.assistant.player.start()
        if not self.settings.zeroconf:
            return
        props = {"mac": self.mac.replace(":", ""), "version": ESPHOME_VERSION, "platform": "HOST",
                 "board": "host", "network": "ethernet", "friendly_name": self.name,
                 "project_name": "edge-speech.edge-agent"}
        advert = Advertisement(SERVICE_TYPE, self.name, self.settings.host, self.server.port, props,
                               hostname=f"{label(self.name)}.local.")
        try:
            await advert.start()
        except Exception as exc:  # the API still works when added by address
            log.warning("esphome: zeroconf advertisement failed (%s); add the device in Home "
                        "Assistant by its address and port %d", exc, self.server.port)
            return
        self._advert = advert

    async def stop(self) -> None:
        advert, self._advert = self._advert, None
        if advert is not None:
            await advert.stop()
        await self.server.stop()
        self.assistant.close()
