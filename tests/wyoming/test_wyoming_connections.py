"""Connections and shutdown, with real sockets and the `wyoming` library's client.

Stopping the server ends every connection cleanly: its client sees the end of the
stream, nothing is logged as an error and no task is left behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping
from wyoming.tts import Synthesize, SynthesizeStart

from tests.wyoming.wyoming_support import ServerThread, make_server

SLOTS = 4
LONG_TEXT = " ".join(["The front door has been open for ten minutes, and the light is still on."] * 40)
"""About three minutes of speech: far more audio than the sockets' buffers hold."""


@pytest.fixture(scope="module")
def whole_synth(shared_cache: Path) -> Iterator[Any]:
    """Our voice with its vocoder unsplit: every model call runs in the request's own worker
    thread, so once the server has stopped a request no call of it is left running when the
    voice is closed. (A split voice's vocoder windows run on in its pool after the request is
    cancelled, and closing the voice under them crashes the process: a matter for tts/.)"""
    from edge_agent.config import TtsSettings
    from edge_agent.models import ModelStore, load_catalog
    from edge_agent.tts.local import LocalSynthesizer
    from edge_agent.tts.registry import VoiceRegistry

    settings = TtsSettings(threads=2, stream_vocoder=False)
    synth = LocalSynthesizer(VoiceRegistry(ModelStore(shared_cache, load_catalog()), settings), settings)
    yield synth
    synth.close()


async def _read(client: AsyncTcpClient, timeout: float = 10) -> Event | None:
    return await asyncio.wait_for(client.read_event(), timeout)


async def _ask(client: AsyncTcpClient, event: Event, answer: str) -> None:
    await client.write_event(event)
    got = await _read(client)
    assert got is not None and got.type == answer, got


async def _connect(server: ServerThread, first: Event | None = None, answer: str = "info") -> AsyncTcpClient:
    """A connection the server has counted (it answered `first`, `describe` by default)."""
    client = AsyncTcpClient(server.host, server.port)
    await client.connect()
    await _ask(client, first or Describe().event(), answer)
    return client


def test_stopping_the_server_closes_every_connection_without_an_error_or_a_task_left(
        whole_synth: Any, caplog: pytest.LogCaptureFixture) -> None:
    # Seen: SIGTERM with a client connected logged CancelledError in the server's accept at ERROR.
    running = make_server(whole_synth, None, max_connections=SLOTS)

    async def pending() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    async def go() -> list[list[Event]]:
        idle = await _connect(running)
        pinging = await _connect(running, Ping().event(), "pong")
        streaming = await _connect(running)
        await streaming.write_event(SynthesizeStart().event())
        await _ask(streaming, Ping().event(), "pong")
        speaking = AsyncTcpClient(running.host, running.port)
        await speaking.connect()
        await speaking.write_event(Synthesize(text=LONG_TEXT).event())
        first = await _read(speaking, 60)
        assert first is not None and first.type == "audio-start"
        await asyncio.to_thread(running.call, running.server.stop())
        seen = []
        for client in (idle, pinging, streaming, speaking):
            events = []
            while (event := await _read(client)) is not None:  # the end of the stream, not a reset
                events.append(event)
            seen.append(events)
            await client.disconnect()
        return seen

    try:
        seen = asyncio.run(go())
        left = running.call(pending())
    finally:
        running.close()
    assert seen[:3] == [[], [], []]
    assert all(e.type in ("audio-chunk", "audio-stop") for e in seen[3])  # what it was sent, then the end
    assert left == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
