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
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from tests.wyoming.wyoming_support import ServerThread, make_server

LIMITS = {"idle_timeout_s": 1.0, "event_timeout_s": 0.5, "max_connections": 4, "max_header_bytes": 8192,
          "max_data_bytes": 4096, "max_payload_bytes": 8192, "max_text_chars": 1000}
HOME_ASSISTANT_S = 2.0
"""A refused request must end for Home Assistant's clients this fast (they ignore `error` events)."""


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


async def _describe(client: AsyncTcpClient) -> None:
    await client.write_event(Describe().event())
    event = await asyncio.wait_for(client.read_event(), 5)
    assert event is not None and event.type == "info"


async def _until_audio_stop_or_eof(client: AsyncTcpClient) -> list[Event]:
    """What Home Assistant's TTS client does: read until `audio-stop` or a closed connection."""
    events: list[Event] = []
    while (event := await client.read_event()) is not None:
        events.append(event)
        if event.type == "audio-stop":
            break
    return events


def test_an_unknown_voice_ends_the_connection_so_home_assistants_client_stops(server: ServerThread) -> None:
    # Seen: the error on a connection left open, and Home Assistant's tts_proxy answering 500 after 59.9 s.
    async def go() -> list[Event]:
        async with AsyncTcpClient(server.host, server.port) as client:
            await client.write_event(Synthesize(text="Hi.", voice=SynthesizeVoice(name="nobody")).event())
            return await asyncio.wait_for(_until_audio_stop_or_eof(client), HOME_ASSISTANT_S)

    events = asyncio.run(go())
    assert [e.type for e in events] == ["error"]  # and then the end of the stream
    assert Error.from_event(events[0]).code == "unknown-voice"


@pytest.mark.parametrize(("events", "code"), [
    ([Event(type="audio-chunk", data={"rate": 16000, "width": 2, "channels": 1}, payload=b"\0\0")],
     "no-service"),
    ([SynthesizeChunk(text="Hello.").event(), SynthesizeStop().event()], "no-stream"),
    ([SynthesizeStart().event(), SynthesizeChunk(text="x" * 2000).event(), SynthesizeStop().event()],
     "text-too-long"),
])
def test_a_refused_request_gets_one_error_then_the_end_of_the_stream(
        server: ServerThread, events: list[Event], code: str) -> None:
    refused = server.server.stats.refused_requests

    async def go() -> list[Event]:
        async with AsyncTcpClient(server.host, server.port) as client:
            for event in events:  # sent whole, as a client that does not read errors does
                await client.write_event(event)
            return await asyncio.wait_for(_until_audio_stop_or_eof(client), HOME_ASSISTANT_S)

    answers = asyncio.run(go())
    assert [(e.type, e.data.get("code")) for e in answers] == [("error", code)]
    assert server.server.stats.refused_requests == refused + 1  # the rest was dropped, not answered
