"""A real Wyoming server on loopback, on its own event loop in a thread (as in the daemon).

Each test talks to it with the `wyoming` library's own client from `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from tests.mdns_support import browse as mdns_browse


class ServerThread:
    """Runs a started server's loop in a thread until `close`."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="wyoming-test", daemon=True)
        self.thread.start()
        self.server = self.call(_async(make))
        self.host, self.port = self.call(self.server.start("127.0.0.1", 0))

    def call(self, coro: Any, timeout: float = 30) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def _async(make: Callable[[], Any]) -> Any:
    return make()  # built on the server's loop (its locks belong to that loop)


def make_server(local_synth: Any, transcriber: Any, wake_models: tuple[str, ...] = (),
                **wyoming: Any) -> ServerThread:
    from edge_agent.config import Settings, WakeSettings, WyomingSettings
    from edge_agent.wake.models import check_all
    from edge_agent.wyoming.asr import AsrService
    from edge_agent.wyoming.server import Services, WyomingServer
    from edge_agent.wyoming.tts import TtsService
    from edge_agent.wyoming.wake import WakeService

    settings = Settings(wyoming=WyomingSettings(**wyoming),
                        wake=WakeSettings(models=wake_models) if wake_models else WakeSettings())

    def make() -> WyomingServer:
        wake = WakeService(check_all(settings.wake), settings.wyoming, settings.wake.refractory_s)
        services = Services(tts=TtsService(lambda: local_synth, settings.wyoming, settings.tts.voice),
                            asr=None if transcriber is None else AsrService(transcriber, settings.wyoming),
                            wake=wake if wake_models else None)
        return WyomingServer(services, settings.wyoming)

    return ServerThread(make)


async def browse(name: str, timeout: float) -> tuple[list[str], int]:
    """Zeroconf's own browser on loopback: the addresses and port advertised under `name`."""
    from edge_agent.wyoming.advertise import SERVICE_TYPE

    seen = await mdns_browse(SERVICE_TYPE, name, timeout)
    return seen.addresses, seen.port
