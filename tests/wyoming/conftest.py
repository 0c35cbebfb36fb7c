"""A real Wyoming server on loopback (our voice, our Whisper export), shared by a module's tests.

The server runs on its own event loop in a thread, as in the daemon; each test
talks to it with the `wyoming` library's own client from `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from speech_fixtures import *  # noqa: F403


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


@pytest.fixture(scope="session")
def local_synth(shared_cache: Path) -> Iterator[Any]:
    from edge_agent.config import TtsSettings
    from edge_agent.models import ModelStore, load_catalog
    from edge_agent.tts.local import LocalSynthesizer
    from edge_agent.tts.registry import VoiceRegistry

    settings = TtsSettings(threads=2)
    synth = LocalSynthesizer(VoiceRegistry(ModelStore(shared_cache, load_catalog()), settings), settings)
    yield synth
    synth.close()


@pytest.fixture(scope="session")
def transcriber(whisper: Any) -> Any:
    from edge_agent.asr.listener import Transcriber
    from edge_agent.config import AsrSettings

    return Transcriber(whisper, AsrSettings())


def make_server(local_synth: Any, transcriber: Any, **wyoming: Any) -> ServerThread:
    from edge_agent.config import Settings, WyomingSettings
    from edge_agent.wyoming.asr import AsrService
    from edge_agent.wyoming.server import Services, WyomingServer
    from edge_agent.wyoming.tts import TtsService

    settings = Settings(wyoming=WyomingSettings(**wyoming))

    def make() -> WyomingServer:
        services = Services(tts=TtsService(lambda: local_synth, settings),
                            asr=AsrService(transcriber, settings) if transcriber is not None else None)
        return WyomingServer(services, settings.wyoming)

    return ServerThread(make)
