"""`edge-agent run` as Home Assistant's voice assistant over the ESPHome API, a whole turn.

The daemon runs in this process with real models: the microphone is a pipe this test
writes 16 kHz PCM into (a wake word and a command, then live silence), the wake engine
and the announcement queue are the daemon's own, the speaker is a directory of WAVs.
The client is aioesphomeapi's `APIClient`, doing what Home Assistant's esphome
integration does (homeassistant/components/esphome/assist_satellite.py): subscribe to
the voice assistant, take the pipeline request and the microphone audio, send the
pipeline's events, the answer as a TTS URL, and wait for the announcement to finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aioesphomeapi import VoiceAssistantEventType as Ev

from benchmarks.clips import load_16k, piper_clip
from edge_agent.asr.whisper import Padding
from edge_agent.audio.wav import WavWriter
from edge_agent.config import AsrSettings
from edge_agent.models import ModelStore, load_catalog
from edge_agent.parts import build_hearing
from tests.esphome_support import MediaServer, connected, run_daemon
from tests.integration.satellite_support import (
    ANSWER,
    ANSWER_WAIT_S,
    RATE,
    WAKE_COMMAND,
    Microphone,
    clip_22k,
    spoken,
)
from tests.mqtt_support import Producer, Watcher, wait_until
from tests.speech_fixtures import silence


@pytest.fixture
def listening(tmp_path: Path, broker: Any, whisper_dir: Path, request: Any) -> Iterator[dict[str, Any]]:
    mic = Microphone()

    def listener(settings: Any, accept_wake: Any) -> Any:
        store = ModelStore(settings.models.cache_dir, load_catalog(settings.models.catalog))
        return build_hearing(settings, store, mic.source, accept_wake)

    watcher = Watcher(broker.url)
    try:
        overrides = {"listen.mode": "wake", "asr.model": str(whisper_dir), **getattr(request, "param", {})}
        for daemon in run_daemon(tmp_path, broker, overrides, listener_factory=listener):
            yield {"daemon": daemon, "mic": mic, "watcher": watcher, "out": tmp_path / "out"}
    finally:
        mic.close()
        watcher.close()


def test_a_wake_word_streams_the_command_to_home_assistant_and_its_answer_url_is_played(
        listening, whisper, clip_cache, piper_voice, tmp_path: Path) -> None:
    daemon, mic, out = listening["daemon"], listening["mic"], listening["out"]
    media = MediaServer(tmp_path)
    writer = WavWriter(tmp_path / "answer.wav", 22050)
    writer.write(clip_22k(ANSWER, clip_cache, piper_voice))
    writer.close()
    command = load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice))

    async def home_assistant() -> dict[str, Any]:
        started: asyncio.Future[tuple[str, str | None]] = asyncio.get_running_loop().create_future()
        finished: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        pcm = bytearray()

        async def handle_start(conversation_id: str, flags: int, settings: Any, phrase: str | None) -> int:
            started.set_result((conversation_id, phrase))
            return 0  # the audio comes over the API

        async def handle_stop(abort: bool) -> None:
            return None

        async def handle_audio(data: bytes, data2: bytes | None = None) -> None:
            pcm.extend(data)

        async def handle_finished(message: Any) -> None:
            if not finished.done():
                finished.set_result(message.success)

        async for client in connected(daemon):
            client.subscribe_voice_assistant(handle_start=handle_start, handle_stop=handle_stop,
                                             handle_audio=handle_audio,
                                             handle_announcement_finished=handle_finished)
            await client.device_info()  # the subscription has been carried out
            mic.say(np.concatenate([silence(0.3), command]))
            conversation_id, phrase = await asyncio.wait_for(started, 30)
            async with asyncio.timeout(30):
                while len(pcm) < 2 * RATE * 2.5:  # Home Assistant's VAD would end it; 2.5 s holds the command
                    await asyncio.sleep(0.05)
            streamed = np.frombuffer(bytes(pcm), "<i2").astype(np.float32) / 32768
            heard = whisper.recognize(streamed, Padding.from_settings(AsrSettings())).text
            for kind, data in ((Ev.VOICE_ASSISTANT_RUN_START, {}), (Ev.VOICE_ASSISTANT_STT_START, {}),
                               (Ev.VOICE_ASSISTANT_STT_VAD_END, {}),
                               (Ev.VOICE_ASSISTANT_STT_END, {"text": heard}),
                               (Ev.VOICE_ASSISTANT_INTENT_END, {"conversation_id": "c1",
                                                                 "continue_conversation": "0"}),
                               (Ev.VOICE_ASSISTANT_TTS_START, {"text": ANSWER}),
                               (Ev.VOICE_ASSISTANT_TTS_END, {"url": media.url("answer.wav")}),
                               (Ev.VOICE_ASSISTANT_RUN_END, {})):
                client.send_voice_assistant_event(kind, data)
            success = await asyncio.wait_for(finished, 60)
            return {"conversation_id": conversation_id, "phrase": phrase, "heard": heard, "success": success}

    try:
        got = asyncio.run(home_assistant())
    finally:
        media.close()
    assert got["phrase"] == "Okay Nabu" and got["success"]
    assert "kitchen lights" in got["heard"].lower()  # what was streamed is the command
    answers = list(out.glob("esphome-answer-*.wav"))
    assert len(answers) == 1 and "kitchen lights are on" in spoken(whisper, answers[0])
    watcher = listening["watcher"]
    done = watcher.wait("edge/kitchen/announce/status",
                        lambda d: d["state"] == "done" and d["id"].startswith("esphome-answer"))
    assert done[0]["conversation_id"] == got["conversation_id"]  # the answer to the wake word's turn
    heard = watcher.wait("edge/kitchen/transcript")
    assert heard[0]["text"] == got["heard"] and heard[0]["source"] == "home-assistant"


def test_a_conversation_home_assistant_continues_streams_the_next_command_without_a_wake_word(
        listening, clip_cache, piper_voice, tmp_path: Path) -> None:
    daemon, mic = listening["daemon"], listening["mic"]
    media = MediaServer(tmp_path)
    writer = WavWriter(tmp_path / "question.wav", 22050)
    writer.write(clip_22k("Which room?", clip_cache, piper_voice))
    writer.close()
    command = load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice))

    async def home_assistant() -> tuple[str | None, str | None, int]:
        starts: asyncio.Queue[str | None] = asyncio.Queue()
        finished: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        heard = [0]

        async def handle_start(conversation_id: str, flags: int, settings: Any, phrase: str | None) -> int:
            heard[0] = 0
            starts.put_nowait(phrase)
            return 0

        async def handle_stop(abort: bool) -> None:
            return None

        async def handle_audio(data: bytes, data2: bytes | None = None) -> None:
            heard[0] += len(data)

        async def handle_finished(message: Any) -> None:
            if not finished.done():
                finished.set_result(message.success)

        async for client in connected(daemon):
            client.subscribe_voice_assistant(handle_start=handle_start, handle_stop=handle_stop,
                                             handle_audio=handle_audio,
                                             handle_announcement_finished=handle_finished)
            await client.device_info()
            mic.say(np.concatenate([silence(0.3), command]))
            first = await asyncio.wait_for(starts.get(), 30)
            for kind, data in ((Ev.VOICE_ASSISTANT_STT_END, {"text": "turn on the lights"}),
                               (Ev.VOICE_ASSISTANT_INTENT_END, {"conversation_id": "c1",
                                                                 "continue_conversation": "1"}),
                               (Ev.VOICE_ASSISTANT_TTS_END, {"url": media.url("question.wav")}),
                               (Ev.VOICE_ASSISTANT_RUN_END, {})):
                client.send_voice_assistant_event(kind, data)
            assert await asyncio.wait_for(finished, 60)
            second = await asyncio.wait_for(starts.get(), 30)  # the microphone opened again, no wake word
            async with asyncio.timeout(30):
                while heard[0] < 2 * RATE:  # a second of the reopened turn's audio
                    await asyncio.sleep(0.05)
            client.send_voice_assistant_event(Ev.VOICE_ASSISTANT_RUN_END, {})
            return first, second, heard[0]
        raise AssertionError("not connected")

    try:
        first, second, streamed = asyncio.run(home_assistant())
    finally:
        media.close()
    assert first == "Okay Nabu" and second is None and streamed >= 2 * RATE


@pytest.mark.parametrize("listening", [{"listen.answer_wait_s": ANSWER_WAIT_S}], indirect=True)
def test_an_announcement_held_by_a_turn_that_ends_without_an_answer_plays_without_the_answer_wait(
        listening, broker, clip_cache, piper_voice) -> None:
    daemon, mic, watcher = listening["daemon"], listening["mic"], listening["watcher"]
    command = load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice))
    producer = Producer(broker.url)

    def meanwhile() -> list[str]:
        return watcher.statuses("kitchen", "meanwhile")

    async def home_assistant() -> None:
        started: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def handle_start(conversation_id: str, flags: int, settings: Any, phrase: str | None) -> int:
            started.set_result(conversation_id)
            return 0

        async def handle_stop(abort: bool) -> None:
            return None

        async for client in connected(daemon):
            client.subscribe_voice_assistant(handle_start=handle_start, handle_stop=handle_stop)
            await client.device_info()
            mic.say(np.concatenate([silence(0.3), command]))
            await asyncio.wait_for(started, 30)  # the turn streams: announcements wait for its answer
            assert daemon.announcements.held
            producer.publish("edge/kitchen/announce", {"id": "meanwhile", "text": "Meanwhile."})
            await asyncio.to_thread(wait_until, lambda: meanwhile() == ["queued"], what="queued")
            # A response with nothing to say: Home Assistant skips text-to-speech and ends the run.
            for kind, data in ((Ev.VOICE_ASSISTANT_RUN_START, {}), (Ev.VOICE_ASSISTANT_STT_START, {}),
                               (Ev.VOICE_ASSISTANT_STT_VAD_END, {}),
                               (Ev.VOICE_ASSISTANT_STT_END, {"text": "turn on the kitchen lights"}),
                               (Ev.VOICE_ASSISTANT_INTENT_END, {"conversation_id": "c1",
                                                                 "continue_conversation": "0"}),
                               (Ev.VOICE_ASSISTANT_RUN_END, {})):
                client.send_voice_assistant_event(kind, data)
            await asyncio.to_thread(watcher.wait, "edge/kitchen/announce/status",
                                    lambda d: d["id"] == "meanwhile" and d["state"] == "done")

    try:
        asyncio.run(home_assistant())
    finally:
        producer.close()
    assert meanwhile() == ["queued", "speaking", "done"]
    assert not daemon.announcements.held
