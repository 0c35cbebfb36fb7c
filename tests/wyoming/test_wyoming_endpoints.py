"""`WyomingService` with a satellite: two endpoints, two advertisements, one set of models.

Home Assistant loads no services from an endpoint whose `info` has a satellite
(homeassistant/components/wyoming/data.py), so the satellite and the services each get one.
The browser is zeroconf's own, on loopback.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info

from edge_agent.announce.journal import Journal
from edge_agent.announce.pipeline import Announcer, Speaking
from edge_agent.announce.playout import DirOpener
from edge_agent.config import AnnouncementSettings, DeviceSettings, Settings, WyomingSettings
from edge_agent.parts import wyoming_service
from edge_agent.wyoming.advertise import SERVICE_TYPE, service_name
from edge_agent.wyoming.satellite import SatelliteService
from tests.mqtt_support import ToneSynth
from tests.wyoming.wyoming_support import browse


async def describe(port: int) -> Info:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        event = await asyncio.wait_for(client.read_event(), 5)
        assert event is not None
        return Info.from_event(event)


def test_the_satellite_and_the_services_are_two_endpoints_each_advertised(tmp_path: Path) -> None:
    device = f"kitchen-{uuid.uuid4().hex[:6]}"
    announcements = AnnouncementSettings(state_dir=tmp_path / "state")
    settings = Settings(device=DeviceSettings(id=device), announcements=announcements,
                        wyoming=WyomingSettings(uri="tcp://127.0.0.1:0", services_uri="tcp://127.0.0.1:0"))
    synth = ToneSynth(rate=22050)
    announcer = Announcer(Speaking(announcements, synth, DirOpener(tmp_path / "out"), frozenset()),
                          Journal(announcements.state_dir, announcements))

    async def run() -> tuple[list[tuple[list[str], int]], list[Info], list[tuple[str, int] | None]]:
        satellite = SatelliteService(settings.wyoming, device, announcer, lambda _id: None)
        service = wyoming_service(settings, lambda: synth, None, None, satellite)
        await service.start()
        try:
            addresses = [service.address, service.services_address]
            ports = [a[1] for a in addresses if a is not None]
            found = [await browse(f"{device}.{SERVICE_TYPE}", 10),
                     await browse(f"{device}-services.{SERVICE_TYPE}", 10)]
            return found, [await describe(port) for port in ports], addresses
        finally:
            await service.stop()

    found, (sat_info, services_info), addresses = asyncio.run(run())
    assert found == [(["127.0.0.1"], address[1]) for address in addresses if address is not None]
    assert addresses[0] != addresses[1]
    assert sat_info.satellite is not None and sat_info.satellite.name == device
    assert not sat_info.tts and not sat_info.asr
    assert services_info.satellite is None and services_info.tts


def test_a_long_device_id_still_gives_two_names() -> None:
    device = "x" * 80
    satellite, services = service_name(device), service_name(device, "-services")
    assert satellite != services and services.startswith("x" * (63 - len("-services")) + "-services.")
    assert all(len(name.split(".")[0].encode()) <= 63 for name in (satellite, services))


def test_services_on_the_satellites_own_endpoint_are_refused() -> None:
    with pytest.raises(ValueError, match="services_uri"):
        WyomingSettings(uri="tcp://0.0.0.0:10300", services_uri="tcp://0.0.0.0:10300")
    WyomingSettings(uri="tcp://0.0.0.0:10300", services_uri="tcp://0.0.0.0:10300", satellite=False)
