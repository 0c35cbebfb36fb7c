"""Wyoming's `info` over a real socket, its synthesizer the offload router of a real server on loopback."""

from __future__ import annotations

import asyncio

from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info

from edge_agent.config import OffloadSettings, Settings
from edge_agent.wyoming.server import Services, WyomingServer
from edge_agent.wyoming.tts import TtsService
from tests.integration.offload.offload_helpers import PIPER, make_router
from tests.waiting import wait_until
from tests.wyoming.wyoming_support import ServerThread

REMOTE = "joe-on-the-server"
"""The Piper voice under a server-only id, so it is told apart from the device's own."""


def _listed(wyoming: ServerThread) -> list[str]:
    async def go() -> Info:
        async with AsyncTcpClient(wyoming.host, wyoming.port) as client:
            await client.write_event(Describe().event())
            event = await asyncio.wait_for(client.read_event(), 5)
            assert event is not None
            return Info.from_event(event)

    return [v.name for v in asyncio.run(go()).tts[0].voices]


def test_info_lists_the_server_voice_while_a_server_offers_it_and_drops_it_when_the_server_goes(
        serve, piper_voice, local_synth):
    server = serve(voices={REMOTE: piper_voice})
    router = make_router(local_synth, server.uri, voice=REMOTE)
    settings = Settings(offload=OffloadSettings(server=server.uri, voice=REMOTE))
    tts = TtsService(lambda: router, settings.wyoming, settings.tts.voice, settings.offload.voice)
    wyoming = ServerThread(lambda: WyomingServer(Services(tts=tts), settings.wyoming))
    try:
        assert router.pool.wait_ready(30)
        assert _listed(wyoming) == [PIPER, REMOTE]
        server.stop()
        wait_until(lambda: _listed(wyoming) == [PIPER], 10, "the server's voice to leave info")
    finally:
        wyoming.close()
        router.close()
