"""A refusal reaches a client that is still sending: the server writes the `error`, half-closes, and
reads and drops the rest of the stream until the client ends it, instead of closing with unread
data (the kernel's reset then destroyed the error before the client read it). Real `wyoming`
clients against the real server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from wyoming.asr import Transcribe
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event

from edge_agent.audio.wav import to_pcm16
from edge_agent.wyoming import server as server_module
from tests.wyoming.wyoming_support import ServerThread, make_server

RATE = 16000
CHUNK = 1024
"""Samples per chunk (64 ms), as a microphone sends them."""
LIVE_PAST_S = 3.0
"""Wall-clock seconds the client keeps streaming, in real time, after the audio the server takes:
longer than the one second the server used to linger."""


async def _stream_past_the_limit(client: AsyncTcpClient, fast_s: float) -> None:
    """`fast_s` seconds of audio at once, then audio at real time for `LIVE_PAST_S`, then audio-stop:
    a microphone streaming on past the limit, which reads nothing until its stream ends."""
    pcm = to_pcm16(np.zeros(CHUNK, dtype=np.float32))
    await client.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
    for _ in range(round(fast_s * RATE / CHUNK)):
        await client.write_event(AudioChunk(rate=RATE, width=2, channels=1, audio=pcm).event())
    until = time.monotonic() + LIVE_PAST_S
    while time.monotonic() < until:
        await client.write_event(AudioChunk(rate=RATE, width=2, channels=1, audio=pcm).event())
        await asyncio.sleep(CHUNK / RATE)  # the pace of a live microphone
    await client.write_event(AudioStop().event())


async def _answers(client: AsyncTcpClient) -> list[Event]:
    events = []
    while (event := await client.read_event()) is not None:
        events.append(event)
    return events


@pytest.fixture(scope="module")
def asr_server(local_synth: Any, transcriber: Any) -> Iterator[ServerThread]:
    running = make_server(local_synth, transcriber)  # the default max_audio_s: 30 s
    yield running
    running.close()


def test_a_client_still_streaming_past_max_audio_s_reads_audio_too_long_not_a_reset(
        asr_server: ServerThread) -> None:
    # Seen: ConnectionResetError on the client's next write, one second after the refusal, and
    # the `audio-too-long` lost with it.
    limit = asr_server.server.settings.max_audio_s

    async def go() -> list[Event]:
        async with AsyncTcpClient(asr_server.host, asr_server.port) as client:
            await client.write_event(Transcribe(language="en").event())
            await _stream_past_the_limit(client, fast_s=limit + 1)
            return await asyncio.wait_for(_answers(client), 5)

    events = asyncio.run(go())
    assert [(e.type, e.data.get("code")) for e in events] == [("error", "audio-too-long")]


@pytest.fixture(scope="module")
def bare_server(local_synth: Any) -> Iterator[ServerThread]:
    running = make_server(local_synth, None)  # no ASR: audio is refused at once
    yield running
    running.close()


def test_audio_refused_at_its_start_reaches_a_client_that_streams_on(bare_server: ServerThread) -> None:
    async def go() -> list[Event]:
        async with AsyncTcpClient(bare_server.host, bare_server.port) as client:
            await _stream_past_the_limit(client, fast_s=1.0)
            return await asyncio.wait_for(_answers(client), 5)

    events = asyncio.run(go())
    assert [(e.type, e.data.get("code")) for e in events] == [("error", "no-service")]


def test_a_client_that_never_stops_sending_is_closed_once_the_linger_is_spent(
        bare_server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "LINGER_S", 0.5)
    pcm = to_pcm16(np.zeros(CHUNK, dtype=np.float32))

    async def go() -> float:
        client = AsyncTcpClient(bare_server.host, bare_server.port)
        await client.connect()
        start = time.monotonic()
        try:
            with pytest.raises(ConnectionError):
                while time.monotonic() - start < 30:
                    await client.write_event(AudioChunk(rate=RATE, width=2, channels=1, audio=pcm).event())
                    await asyncio.sleep(0.01)
            return time.monotonic() - start
        finally:
            with contextlib.suppress(ConnectionError):
                await client.disconnect()

    assert asyncio.run(go()) < 5.0  # closed after the linger, not held open by a sender
