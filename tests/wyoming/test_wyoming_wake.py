"""Wyoming wake word detection with the library's client, on speech our Piper voice makes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.wake import Detect, Detection

from benchmarks.clips import load_16k, piper_clip
from edge_agent.audio.resample import resample
from edge_agent.audio.wav import to_pcm16
from edge_agent.wyoming.wake import PACE_BURST_S
from tests.speech_fixtures import silence
from tests.wyoming.wyoming_support import ServerThread, make_server


@pytest.fixture(scope="module")
def server(local_synth: Any) -> Iterator[ServerThread]:
    running = make_server(local_synth, None, wake_models=("okay_nabu", "hey_jarvis"))
    yield running
    running.close()


@pytest.fixture(scope="module")
def speech(clip_cache: Path, piper_voice: Any) -> dict[str, np.ndarray]:
    texts = {"nabu": "Okay Nabu, turn on the kitchen lights.", "other": "Remind me to call my mother at six."}
    return {k: np.concatenate([silence(0.5), load_16k(piper_clip(t, clip_cache, piper_voice)), silence(0.5)])
            for k, t in texts.items()}


async def _stream(server: ServerThread, names: list[str] | None, audio: np.ndarray,
                  rate: int = 16000) -> list[Event]:
    """Detect over `audio` sent as a microphone would (30 ms chunks); the answers up to the last."""
    pcm = to_pcm16(resample(audio, 16000, rate))
    step = 2 * round(0.03 * rate)
    async with AsyncTcpClient(server.host, server.port) as client:
        await client.write_event(Detect(names=names).event())
        await client.write_event(AudioStart(rate=rate, width=2, channels=1).event())
        for i in range(0, len(pcm), step):
            chunk = AudioChunk(rate=rate, width=2, channels=1, audio=pcm[i:i + step])
            await client.write_event(chunk.event())
        await client.write_event(AudioStop().event())
        await client.write_event(Describe().event())  # answered in order: marks the end of the answers
        answers = []
        while (event := await asyncio.wait_for(client.read_event(), 30)) is not None and event.type != "info":
            answers.append(event)
        return answers


def test_info_lists_the_wake_words(server: ServerThread) -> None:
    async def go() -> Info:
        async with AsyncTcpClient(server.host, server.port) as client:
            await client.write_event(Describe().event())
            event = await asyncio.wait_for(client.read_event(), 5)
            assert event is not None
            return Info.from_event(event)

    models = asyncio.run(go()).wake[0].models
    assert [(m.name, m.phrase) for m in models] == [("okay_nabu", "Okay Nabu"), ("hey_jarvis", "Hey Jarvis")]


def test_the_wake_word_is_detected_in_a_clients_stream(server: ServerThread, speech: dict[str, Any]) -> None:
    answers = asyncio.run(_stream(server, ["okay_nabu"], speech["nabu"], rate=22050))
    assert [e.type for e in answers] == ["detection"]
    found = Detection.from_event(answers[0])
    assert found.name == "okay_nabu"
    assert found.timestamp is not None and 500 < found.timestamp < 2500


def test_other_speech_or_another_wake_word_is_not_detected(server: ServerThread,
                                                           speech: dict[str, Any]) -> None:
    assert [e.type for e in asyncio.run(_stream(server, None, speech["other"]))] == ["not-detected"]
    assert [e.type for e in asyncio.run(_stream(server, ["hey_jarvis"], speech["nabu"]))] == ["not-detected"]


def test_an_unknown_wake_word_is_refused_and_the_connection_ended(server: ServerThread) -> None:
    async def go() -> list[Event]:
        async with AsyncTcpClient(server.host, server.port) as client:
            await client.write_event(Detect(names=["hey_computer"]).event())
            answers = []
            while (event := await asyncio.wait_for(client.read_event(), 5)) is not None:
                answers.append(event)
            return answers

    answers = asyncio.run(go())
    assert [Error.from_event(e).code for e in answers] == ["unknown-wake-word"]


def test_max_wake_speed_must_be_positive() -> None:
    from edge_agent.config import WyomingSettings

    with pytest.raises(ValueError, match="max_wake_speed: must be positive"):
        WyomingSettings(max_wake_speed=0)


def test_a_client_streaming_faster_than_max_wake_speed_waits_and_loses_nothing(
        local_synth: Any, speech: dict[str, Any]) -> None:
    # Seen: one detect client had 11,984 s of audio heard in 40 s, a core busy for as long as it sent.
    speed = 8.0
    paced = make_server(local_synth, None, wake_models=("okay_nabu",), max_wake_speed=speed)
    audio = np.concatenate([silence(10.0), speech["nabu"]])
    try:
        started = time.monotonic()
        answers = asyncio.run(_stream(paced, ["okay_nabu"], audio))
        elapsed = time.monotonic() - started
    finally:
        paced.close()
    # A lower bound on the time taken, which load can only lengthen: the audio after the head
    # start was heard no faster than `speed` times real time.
    assert elapsed >= (audio.size / 16000 - PACE_BURST_S) / speed
    # Nothing was dropped: the wake word 10 s into the stream is heard where it was said.
    assert [e.type for e in answers] == ["detection"]
    timestamp = Detection.from_event(answers[0]).timestamp
    assert timestamp is not None and 10500 < timestamp < 12500
