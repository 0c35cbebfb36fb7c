"""Peers that break the framing or stall: refused, closed, and nobody else notices.

Only framing and limits matter here, so the server runs without models (a TTS
service whose voice is never asked for, no ASR) and with short deadlines.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.tts import Synthesize, SynthesizeVoice

from tests.wyoming.wyoming_support import ServerThread, make_server

LIMITS = {"idle_timeout_s": 1.0, "event_timeout_s": 0.5, "max_connections": 4, "max_header_bytes": 8192,
          "max_data_bytes": 4096, "max_payload_bytes": 8192}


@pytest.fixture(scope="module")
def server(local_synth: Any) -> Iterator[ServerThread]:
    running = make_server(local_synth, None, **LIMITS)
    yield running
    running.close()


async def _raw(server: ServerThread, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(data)
    await writer.drain()
    return reader, writer


async def _answer_then_close(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The error event the server sends before it closes, and proof that it closed."""
    line = await asyncio.wait_for(reader.readline(), 5)
    header = json.loads(line)
    data = json.loads(await reader.readexactly(header["data_length"])) if header.get("data_length") else {}
    assert await asyncio.wait_for(reader.read(), 5) == b"", "connection left open"
    return {"type": header["type"], **data}


@pytest.mark.parametrize(("data", "code"), [
    (b'{"type": "audio-chunk", "payload_length": 100000000}\n', "too-large"),
    (b'{"type": "synthesize", "data_length": 5000}\n', "too-large"),
    (b'{"type": "audio-chunk", "payload_length": -1}\n', "bad-header"),
    (b'{"type": "audio-chunk", "payload_length": "12"}\n', "bad-header"),
    (b"this is not json\n", "bad-json"),
    (b"[1, 2, 3]\n", "bad-json"),
    (b"[" * 900 + b"\n", "bad-json"),
    (b'{"data": {}}\n', "bad-header"),
    (b'{"type": "synthesize", "data_length": 4}\n[1] ', "bad-json"),
    (b'{"type": "' + b"x" * 9000 + b'"}\n', "header-too-large"),
    # Valid JSON that Python will not read (over 4300 digits): once answered `internal`, with a traceback.
    (b'{"type": "synthesize", "data_length": 1' + b"0" * 4400 + b'}\n', "bad-json"),
])
def test_malformed_or_oversized_events_are_refused_and_the_connection_closed(
        server: ServerThread, data: bytes, code: str, caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        bystander = AsyncTcpClient(server.host, server.port)
        await bystander.connect()
        reader, writer = await _raw(server, data)
        answer = await _answer_then_close(reader)
        writer.close()
        assert answer["type"] == "error" and answer["code"] == code, answer
        await _describe(bystander)  # a connection that was open all along is still served
        await bystander.disconnect()

    asyncio.run(go())
    # A framing error is the peer's fault: a warning saying what was wrong, no traceback.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
    assert any("dropped: " in r.getMessage() for r in caplog.records)


def test_a_payload_that_never_arrives_in_full_times_out(server: ServerThread) -> None:
    async def go() -> dict[str, Any]:
        reader, writer = await _raw(server, b'{"type": "audio-chunk", "payload_length": 8000}\n' + b"\0" * 10)
        try:
            return await _answer_then_close(reader)
        finally:
            writer.close()

    assert asyncio.run(go())["code"] == "event-timeout"


def test_a_peer_that_sends_nothing_is_closed_after_the_idle_timeout(server: ServerThread) -> None:
    async def go() -> dict[str, Any]:
        reader, writer = await _raw(server, b"")
        try:
            return await _answer_then_close(reader)
        finally:
            writer.close()

    assert asyncio.run(go())["code"] == "idle-timeout"


def test_connections_over_the_limit_are_told_busy_and_the_rest_keep_working(server: ServerThread) -> None:
    async def go() -> dict[str, Any]:
        held = [AsyncTcpClient(server.host, server.port) for _ in range(LIMITS["max_connections"])]
        for client in held:  # an answered describe proves the server counts the connection
            await client.connect()
            await _describe(client)
        reader, writer = await asyncio.open_connection(server.host, server.port)
        answer = await _answer_then_close(reader)
        writer.close()
        for client in held:
            await _describe(client)
            await client.disconnect()
        return answer

    assert asyncio.run(go())["code"] == "busy"


async def _describe(client: AsyncTcpClient) -> None:
    await client.write_event(Describe().event())
    event = await asyncio.wait_for(client.read_event(), 5)
    assert event is not None and event.type == "info"


def test_a_refused_request_gets_an_error_and_the_connection_stays_usable(server: ServerThread) -> None:
    async def go() -> tuple[Event, Event, Event]:
        async with AsyncTcpClient(server.host, server.port) as client:
            await client.write_event(Synthesize(text="Hi.", voice=SynthesizeVoice(name="nobody")).event())
            unknown = await asyncio.wait_for(client.read_event(), 5)
            audio = {"rate": 16000, "width": 2, "channels": 1}
            await client.write_event(Event(type="audio-chunk", data=audio, payload=b"\0\0"))
            no_asr = await asyncio.wait_for(client.read_event(), 5)
            await client.write_event(Describe().event())
            info = await asyncio.wait_for(client.read_event(), 5)
            assert unknown is not None and no_asr is not None and info is not None
            return unknown, no_asr, info

    unknown, no_asr, info = asyncio.run(go())
    assert Error.from_event(unknown).code == "unknown-voice"
    assert Error.from_event(no_asr).code == "no-service"
    assert info.type == "info"
