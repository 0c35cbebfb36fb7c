"""The Wyoming server with the `wyoming` library's client doing what Home Assistant does.

Audio that comes back is checked by ear, that is by our Whisper: it must say the words asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from edge_agent.audio.resample import resample
from edge_agent.audio.wav import from_pcm16, to_pcm16
from edge_agent.text.wer import wer
from tests.wyoming.wyoming_support import ServerThread, make_server

TIMEOUT = 60.0


@pytest.fixture(scope="module")
def server(local_synth: Any, transcriber: Any) -> Iterator[ServerThread]:
    running = make_server(local_synth, transcriber, max_audio_s=20.0)
    yield running
    running.close()


async def _read(client: AsyncTcpClient, timeout: float = TIMEOUT) -> Event:
    event = await asyncio.wait_for(client.read_event(), timeout)
    assert event is not None, "server closed the connection"
    return event


async def _audio_until(client: AsyncTcpClient, last: str) -> tuple[list[Event], np.ndarray, int]:
    """Events up to and including `last`; the audio they carry as float32 and its rate."""
    events: list[Event] = []
    pcm = b""
    rate = 0
    while True:
        event = await _read(client)
        events.append(event)
        if Error.is_type(event.type):
            raise AssertionError(f"server error: {event.data}")
        if AudioStart.is_type(event.type):
            rate = rate or AudioStart.from_event(event).rate
        if AudioChunk.is_type(event.type):
            chunk = AudioChunk.from_event(event)
            assert (chunk.rate, chunk.width, chunk.channels) == (rate, 2, 1)
            pcm += chunk.audio
        if event.type == last:
            return events, from_pcm16(pcm), rate


def _heard(transcriber: Any, audio: np.ndarray, rate: int) -> str:
    from edge_agent.vad.segmenter import Utterance

    samples = resample(audio, rate, 16000)
    seconds = samples.size / 16000
    result = transcriber(Utterance(samples, 0.0, seconds, 0.0, seconds, round(seconds * 1000)))
    return result.text if result is not None else ""


def test_describe_answers_with_info_listing_voice_and_model_within_a_second(server: ServerThread) -> None:
    async def go() -> Info:
        async with AsyncTcpClient(server.host, server.port) as client:
            started = time.monotonic()
            await client.write_event(Describe().event())
            event = await _read(client, 1.0)
            assert time.monotonic() - started < 1.0
            return Info.from_event(event)

    info = asyncio.run(go())
    assert [v.name for v in info.tts[0].voices] == ["en_US-joe-medium"]
    assert info.tts[0].supports_synthesize_streaming
    assert info.asr[0].models[0].name == "whisper-tiny.en"
    assert info.asr[0].models[0].languages == ["en"]


def test_synthesize_returns_audio_that_says_the_text(server: ServerThread, transcriber: Any) -> None:
    async def go() -> tuple[list[Event], np.ndarray, int]:
        async with AsyncTcpClient(server.host, server.port) as client:
            voice = SynthesizeVoice(name="en_US-joe-medium")
            await client.write_event(Synthesize(text="The front door is open.", voice=voice).event())
            return await _audio_until(client, "audio-stop")

    events, audio, rate = asyncio.run(go())
    assert rate == 22050
    assert events[0].type == "audio-start"
    assert sum(e.type == "audio-chunk" for e in events) > 1  # streamed, not one blob
    assert 0.8 < audio.size / rate < 4.0
    assert wer(["the front door is open"], [_heard(transcriber, audio, rate)]) == 0.0


def test_text_with_nothing_to_say_is_an_empty_stream_at_the_voice_rate(server: ServerThread) -> None:
    async def go() -> tuple[list[Event], np.ndarray, int]:
        async with AsyncTcpClient(server.host, server.port) as client:
            await client.write_event(Synthesize(text=" ").event())  # no sentence in it
            return await _audio_until(client, "audio-stop")

    events, audio, rate = asyncio.run(go())
    assert [e.type for e in events] == ["audio-start", "audio-stop"]
    assert rate == 22050 and audio.size == 0


def test_streamed_text_is_spoken_sentence_by_sentence_before_the_stream_ends(
        server: ServerThread, transcriber: Any) -> None:
    async def go() -> tuple[list[Event], np.ndarray, int, list[Event]]:
        async with AsyncTcpClient(server.host, server.port) as client:
            await client.write_event(SynthesizeStart().event())
            for piece in ("The kitchen", " light is on. ", "The garage"):
                await client.write_event(SynthesizeChunk(text=piece).event())
            # The first sentence is complete: its audio comes while the text is still open.
            early, first_audio, _ = await _audio_until(client, "audio-stop")
            await client.write_event(SynthesizeChunk(text=" door is closed.").event())
            # Home Assistant's copy for servers without streaming: must not be spoken twice.
            copy = "The kitchen light is on. The garage door is closed."
            await client.write_event(Synthesize(text=copy).event())
            await client.write_event(SynthesizeStop().event())
            rest, rest_audio, rate = await _audio_until(client, "synthesize-stopped")
            return early, np.concatenate([first_audio, rest_audio]), rate, rest

    early, audio, rate, rest = asyncio.run(go())
    assert early[0].type == "audio-start"
    assert [e.type for e in rest].count("audio-start") == 1
    assert rest[-2].type == "audio-stop"
    heard = _heard(transcriber, audio, rate)
    assert wer(["the kitchen light is on the garage door is closed"], [heard]) <= 0.1, heard


def test_speech_is_cut_at_max_speech_s_and_the_connection_stays_usable(
        local_synth: Any, transcriber: Any) -> None:
    # Three short sentences (~4 s) against a 1 s budget, plain and streamed; the stream's budget
    # covers the whole stream, so its second sentence gets an empty but well-formed audio stream.
    text = "The front door is open. The kitchen light is on. The garage door is closed."
    capped = make_server(local_synth, None, max_speech_s=1.0)

    async def go() -> tuple[np.ndarray, int, list[Event], Info]:
        async with AsyncTcpClient(capped.host, capped.port) as client:
            await client.write_event(Synthesize(text=text).event())
            _, plain, rate = await _audio_until(client, "audio-stop")
            await client.write_event(SynthesizeStart().event())
            for sentence in text.split(". "):
                await client.write_event(SynthesizeChunk(text=sentence.rstrip(".") + ". ").event())
            await client.write_event(SynthesizeStop().event())
            streamed, _, _ = await _audio_until(client, "synthesize-stopped")
            await client.write_event(Describe().event())
            return plain, rate, streamed, Info.from_event(await _read(client))

    try:
        plain, rate, streamed, info = asyncio.run(go())
    finally:
        capped.close()
    assert plain.size == rate  # exactly the budget, not the ~4 s the text asks for
    chunks = [AudioChunk.from_event(e) for e in streamed if AudioChunk.is_type(e.type)]
    assert sum(len(c.audio) for c in chunks) == 2 * rate
    assert [e.type for e in streamed].count("audio-stop") == 3
    assert info.tts  # still answering


def test_transcribe_hears_a_command_at_16_and_22_khz(server: ServerThread, piper_clips: list[Any]) -> None:
    from edge_agent.audio.wav import read_wav

    clip = piper_clips[0]
    wav = read_wav(clip.path)

    async def go(rate: int) -> Transcript:
        samples = resample(wav.samples, wav.sample_rate, rate)
        async with AsyncTcpClient(server.host, server.port) as client:
            await client.write_event(Transcribe(language="en").event())
            await client.write_event(AudioStart(rate=rate, width=2, channels=1).event())
            pcm = to_pcm16(samples)
            step = 2 * 1024
            for i in range(0, len(pcm), step):
                chunk = AudioChunk(rate=rate, width=2, channels=1, audio=pcm[i:i + step])
                await client.write_event(chunk.event())
            await client.write_event(AudioStop().event())
            return Transcript.from_event(await _read(client))

    # The clip is the same samples on every machine, so the words can be exact: the 22.05 kHz
    # stream, resampled by the server, hears what 16 kHz does.
    for rate in (16000, 22050):
        transcript = asyncio.run(go(rate))
        assert wer([clip.text], [transcript.text]) == 0.0, (rate, transcript.text)
        assert transcript.language == "en"


def test_audio_over_max_audio_s_gets_one_error_and_ends_the_connection(server: ServerThread) -> None:
    # Seen: one audio-too-long, then ~140 "audio-chunk before audio-start" errors and an idle timeout at
    # 60 s, while Home Assistant's STT client (it ignores errors) waited for a transcript.
    refused = server.server.stats.refused_requests
    pcm = to_pcm16(np.zeros(25 * 16000, dtype=np.float32))  # the server takes 20 s

    async def home_assistant() -> list[Event]:
        async with AsyncTcpClient(server.host, server.port) as client:
            with contextlib.suppress(ConnectionError):  # as Home Assistant, which catches OSError
                await client.write_event(Transcribe(language="en").event())
                await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
                for i in range(0, len(pcm), 2048):
                    await client.write_event(AudioChunk(rate=16000, width=2, channels=1,
                                                        audio=pcm[i:i + 2048]).event())
                await client.write_event(AudioStop().event())
            events = []
            while (event := await client.read_event()) is not None:  # until transcript or closed
                events.append(event)
                if event.type == "transcript":
                    break
            return events

    events = asyncio.run(asyncio.wait_for(home_assistant(), 2.0))
    assert [(e.type, e.data.get("code")) for e in events] == [("error", "audio-too-long")]
    assert server.server.stats.refused_requests == refused + 1  # the rest of the stream was dropped quietly
