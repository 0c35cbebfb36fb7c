"""Connection slots and shutdown, with real sockets and the `wyoming` library's client.

When `max_connections` are open, a newcomer displaces the connection idle the longest
with nothing in flight, so clients that only hold a slot (silent, or pinging) cannot
lock Home Assistant out; a connection doing work is never displaced. Stopping the
server ends every connection cleanly: its client sees the end of the stream, nothing
is logged as an error and no task is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.ping import Ping
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

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


@pytest.fixture()
def server(whole_synth: Any) -> Iterator[ServerThread]:
    running = make_server(whole_synth, None, max_connections=SLOTS)
    yield running
    running.close()


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


async def _displaced(client: AsyncTcpClient) -> list[Event]:
    """What a displaced client is sent before the end of the stream."""
    events = []
    while (event := await _read(client)) is not None:
        events.append(event)
    return events


def test_a_newcomer_displaces_the_connection_idle_the_longest_and_a_ping_is_not_activity(
        server: ServerThread) -> None:
    async def go() -> tuple[list[Event], int]:
        held = [await _connect(server) for _ in range(SLOTS)]
        await _ask(held[0], Describe().event(), "info")  # the first is active again: the second is idlest
        await _ask(held[1], Ping().event(), "pong")  # ... and a ping does not change that
        newcomer = await _connect(server)  # answered, not refused `busy`
        gone = await _displaced(held[1])
        for client in (held[0], held[2], held[3], newcomer):
            await _ask(client, Describe().event(), "info")  # everyone else is still served
            await client.disconnect()
        return gone, server.server.stats.refused_busy

    gone, busy = asyncio.run(go())
    assert [(e.type, Error.from_event(e).code) for e in gone] == [("error", "displaced")]
    assert busy == 0


def test_clients_that_only_ping_cannot_lock_home_assistant_out(server: ServerThread) -> None:
    # Seen: 16 clients pinging every 20 s held all 16 slots; Home Assistant was served 0 times of 38.
    requests = 8

    async def pinger(ready: asyncio.Event, stop: asyncio.Event) -> None:
        """Takes a slot and holds it with pings; displaced, it comes straight back."""
        while not stop.is_set():
            client = await _connect(server, Ping().event(), "pong")
            ready.set()
            with contextlib.suppress(ConnectionError):
                await _displaced(client)
            ready.clear()
            await client.disconnect()

    async def go() -> int:
        stop = asyncio.Event()
        ready = [asyncio.Event() for _ in range(SLOTS)]
        pingers = [asyncio.create_task(pinger(r, stop)) for r in ready]
        served = 0
        for _ in range(requests):
            for r in ready:  # every slot held by a pinger again
                await asyncio.wait_for(r.wait(), 10)
            async with AsyncTcpClient(server.host, server.port) as home_assistant:
                await home_assistant.write_event(Describe().event())
                answer = await _read(home_assistant)
                served += answer is not None and answer.type == "info"
        stop.set()
        for task in pingers:
            task.cancel()
        await asyncio.gather(*pingers, return_exceptions=True)
        return served

    assert asyncio.run(go()) == requests
    stats = server.server.stats
    assert stats.refused_busy == 0 and stats.displaced >= requests


def test_connections_mid_synthesis_or_mid_stream_are_never_displaced(server: ServerThread) -> None:
    async def go() -> tuple[Event | None, list[Event], Event | None, list[Event]]:
        # One synthesizing far more audio than the sockets hold while its client does not read
        # (the server is busy sending it), the others in the middle of a streamed text.
        speaking = AsyncTcpClient(server.host, server.port)
        await speaking.connect()
        await speaking.write_event(Synthesize(text=LONG_TEXT).event())
        first = await _read(speaking, 60)
        streaming = []
        for _ in range(SLOTS - 1):
            client = await _connect(server)
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(text="The garage door").event())  # no sentence yet
            await _ask(client, Ping().event(), "pong")  # answered in order: the stream is open
            streaming.append(client)
        async with AsyncTcpClient(server.host, server.port) as newcomer:
            await newcomer.write_event(Describe().event())
            refused = await _read(newcomer)
        await speaking.disconnect()  # its synthesis stops with it
        finished = []
        for client in streaming:  # each stream goes on where it was
            await client.write_event(SynthesizeChunk(text=" is closed").event())
            await client.write_event(SynthesizeStop().event())
            while (event := await _read(client, 60)) is not None and event.type != "synthesize-stopped":
                assert event.type != "error", event
            finished.append(event)
            await client.disconnect()
        return first, finished, refused, []

    first, finished, refused, _ = asyncio.run(go())
    assert first is not None and first.type == "audio-start"
    assert refused is not None and Error.from_event(refused).code == "busy"
    assert all(e is not None and e.type == "synthesize-stopped" for e in finished)
    assert server.server.stats.displaced == 0


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
