"""`edge-agent run` as Home Assistant's Wyoming satellite, driven by a client doing what Home Assistant does.

The daemon runs in this process with real models: the microphone is a pipe this test
writes 16 kHz PCM into (a wake word and a command, then a live stream of silence), the
wake engine and the announcement queue are the daemon's own, the speaker is a directory
of WAV files. The client is the `wyoming` library's, speaking the events Home Assistant's
satellite side sends and expects (homeassistant/components/wyoming/assist_satellite.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wyoming.asr import Transcript
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping
from wyoming.satellite import PauseSatellite, RunSatellite
from wyoming.timer import TimerFinished
from wyoming.tts import Synthesize

from benchmarks.clips import load_16k, piper_clip
from edge_agent.asr.whisper import Padding
from edge_agent.audio.resample import resample
from edge_agent.audio.wav import to_pcm16
from edge_agent.config import AsrSettings
from edge_agent.daemon import Daemon, SettingsSource
from edge_agent.models import ModelStore, load_catalog
from edge_agent.parts import build_hearing
from tests.integration.satellite_support import (
    ANSWER,
    ANSWER_WAIT_S,
    NOTICE,
    RATE,
    WAKE_COMMAND,
    Microphone,
    clip_22k,
    spoken,
)
from tests.mqtt_support import Producer, ToneSynth, Watcher, device_config, wait_until
from tests.speech_fixtures import silence


@pytest.fixture
def satellite(tmp_path: Path, broker: Any, whisper_dir: Path, request: Any) -> Iterator[dict[str, Any]]:
    config = device_config(tmp_path / "device.yaml", tmp_path)
    source = SettingsSource(config, {
        "mqtt.broker": broker.url, "device.id": "dev1", "daemon.out_dir": str(tmp_path / "out"),
        "wyoming.enabled": True, "wyoming.uri": "tcp://127.0.0.1:0", "wyoming.zeroconf": False,
        "wyoming.services_uri": "tcp://127.0.0.1:0",
        "listen.mode": "wake", "asr.model": str(whisper_dir), "announcements.max_audio_s": 8.0,
        **getattr(request, "param", {})})
    mic = Microphone()

    def listener(settings: Any, accept_wake: Any) -> Any:
        store = ModelStore(settings.models.cache_dir, load_catalog(settings.models.catalog))
        return build_hearing(settings, store, mic.source, accept_wake)

    daemon = Daemon(source, synthesizer_factory=lambda s: ToneSynth(rate=22050), listener_factory=listener)
    watcher = Watcher(broker.url)
    thread = threading.Thread(target=lambda: asyncio.run(daemon.run()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: daemon.wyoming is not None and daemon.wyoming.address, timeout=120,
                   what="the wyoming server")
        assert daemon.wyoming is not None and daemon.wyoming.address is not None
        assert daemon.wyoming.services_address is not None
        yield {"daemon": daemon, "port": daemon.wyoming.address[1], "mic": mic, "out": tmp_path / "out",
               "watcher": watcher, "services_port": daemon.wyoming.services_address[1]}
    finally:
        daemon.stop()
        thread.join(30)
        mic.close()
        watcher.close()
    assert not thread.is_alive()


async def next_event(client: AsyncTcpClient, wanted: str, timeout: float = 30.0) -> Event:
    """The next event of type `wanted` (pings and other chatter skipped); "" takes any but a pong."""
    async with asyncio.timeout(timeout):
        while True:
            event = await client.read_event()
            assert event is not None, f"the device closed the connection waiting for {wanted}"
            if event.type == wanted or (not wanted and event.type != "pong"):
                return event


async def send_audio(client: AsyncTcpClient, samples: np.ndarray, rate: int) -> None:
    """Audio as Home Assistant sends it: 22050 Hz s16le mono, 1024 samples a chunk."""
    await client.write_event(AudioStart(rate=rate, width=2, channels=1).event())
    for start in range(0, len(samples), 1024):
        pcm = to_pcm16(samples[start:start + 1024])
        await client.write_event(AudioChunk(rate=rate, width=2, channels=1, audio=pcm).event())
    await client.write_event(AudioStop().event())


def test_a_whole_turn_and_an_announcement_as_home_assistant_runs_them(
        satellite, whisper, clip_cache, piper_voice) -> None:
    port, mic, out = satellite["port"], satellite["mic"], satellite["out"]
    command = load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice))

    async def home_assistant() -> dict[str, Any]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await next_event(client, "info"))
            await client.write_event(RunSatellite().event())
            await client.write_event(Ping().event())
            await next_event(client, "pong")  # run-satellite has been carried out
            mic.say(np.concatenate([silence(0.3), command]))
            detection = await next_event(client, "detection")
            pipeline = await next_event(client, "run-pipeline")
            before_audio = []  # Home Assistant logs anything but chunks here as unexpected
            while (event := await next_event(client, "")).type != "audio-chunk":
                before_audio.append(event.type)
            first = AudioChunk.from_event(event)
            pcm = first.audio
            while len(pcm) < 2 * RATE * 2.5:  # Home Assistant's VAD would end it; 2.5 s holds the command
                pcm += AudioChunk.from_event(await next_event(client, "audio-chunk")).audio
            streamed = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
            heard = whisper.recognize(streamed, Padding.from_settings(AsrSettings())).text
            await client.write_event(Transcript(text=heard).event())
            await next_event(client, "audio-stop")  # the device stops streaming
            await client.write_event(Synthesize(text=ANSWER).event())
            await send_audio(client, clip_22k(ANSWER, clip_cache, piper_voice), 22050)
            await next_event(client, "played")
            await send_audio(client, clip_22k(NOTICE, clip_cache, piper_voice), 22050)
            await next_event(client, "played")
            await client.write_event(TimerFinished(id="kitchen").event())
            await client.write_event(PauseSatellite().event())
            return {"info": info, "detection": detection.data, "pipeline": pipeline.data, "first": first,
                    "before_audio": before_audio, "heard": heard}

    got = asyncio.run(home_assistant())
    info = got["info"]
    assert info.satellite is not None and info.satellite.active_wake_words == ["okay_nabu"]
    assert info.satellite.name == "dev1" and info.wake  # the wake word Home Assistant resolves names with
    assert got["detection"]["name"] == "okay_nabu"
    assert got["pipeline"]["start_stage"] == "asr" and got["pipeline"]["end_stage"] == "tts"
    assert "audio-start" not in got["before_audio"]  # the chunks say their format
    assert (got["first"].rate, got["first"].width, got["first"].channels) == (16000, 2, 1)
    assert "kitchen lights" in got["heard"].lower()  # what was streamed is the command
    answers = list(out.glob("ha-answer-*.wav"))
    notices = list(out.glob("ha-announce-*.wav"))
    assert len(answers) == 1 and len(notices) == 1
    assert "kitchen lights are on" in spoken(whisper, answers[0])
    # The notice played is the one Home Assistant sent: heard as its clip is heard (tiny.en hears
    # our clip of "Dinner is ready." as "Enter is ready."; this test measures the device, not tiny.en).
    sent = whisper.recognize(resample(clip_22k(NOTICE, clip_cache, piper_voice), 22050, RATE),
                             Padding.from_settings(AsrSettings())).text.lower()
    assert "is ready" in sent and spoken(whisper, notices[0]) == sent
    wait_until(lambda: list(out.glob("ha-timer-*.wav")), what="the timer chime")
    # The answer went out as the answer to the wake word's turn, through the announcement queue.
    wake = satellite["watcher"].wait("edge/dev1/wake")[0]
    done = satellite["watcher"].wait("edge/dev1/announce/status",
                                     lambda d: d["state"] == "done" and d["id"].startswith("ha-answer"))
    assert done[0]["conversation_id"] == wake["conversation_id"]
    # The device status said who ran the satellite, and that nobody does after the pause.
    watcher = satellite["watcher"]
    statuses = watcher.wait("edge/dev1/status", lambda d: d.get("satellite", {}).get("connected"))
    assert statuses[-1]["satellite"]["peer"].startswith("127.0.0.1:")

    def released_after_running() -> bool:
        seen = [d.get("satellite") for d in watcher.find("edge/dev1/status")]
        first = next((i for i, d in enumerate(seen) if d and d["connected"]), None)
        return first is not None and {"connected": False, "peer": None} in seen[first + 1:]

    wait_until(released_after_running, what="the status after pause-satellite")
    # Home Assistant's transcript is published like the device's own (the last-transcript sensor).
    heard = satellite["watcher"].wait("edge/dev1/transcript")
    assert heard[0]["text"] == got["heard"] and heard[0]["source"] == "home-assistant"
    assert heard[0]["conversation_id"] == wake["conversation_id"] and heard[0]["wake_word"] == "Okay Nabu"


def test_refused_audio_leaves_the_satellite_and_other_connections_working(satellite, clip_cache,
                                                                           piper_voice) -> None:
    port, out = satellite["port"], satellite["out"]
    notice = clip_22k(NOTICE, clip_cache, piper_voice)

    async def home_assistant() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", port) as client, \
                AsyncTcpClient("127.0.0.1", port) as other:
            await client.write_event(RunSatellite().event())
            await client.write_event(AudioChunk(rate=22050, width=2, channels=1, audio=b"\0\0").event())
            errors = [await next_event(client, "error")]
            # Longer than announcements.max_audio_s (8 s): refused, nothing queued.
            await send_audio(client, np.tile(notice, 20), 22050)
            errors.append(await next_event(client, "error"))
            await other.write_event(Ping().event())
            await next_event(other, "pong")
            await send_audio(client, notice, 22050)  # the same connection still plays what fits
            await next_event(client, "played")
            return errors

    errors = asyncio.run(home_assistant())
    assert [e.data["code"] for e in errors] == ["no-audio-start", "audio-too-long"]
    assert len(list(out.glob("ha-announce-*.wav"))) == 1


def test_a_newer_run_satellite_takes_over_and_a_wake_word_without_home_assistant_is_local(
        satellite, clip_cache, piper_voice) -> None:
    port, mic = satellite["port"], satellite["mic"]
    command = load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice))

    async def two_clients() -> Event:
        async with AsyncTcpClient("127.0.0.1", port) as old, AsyncTcpClient("127.0.0.1", port) as new:
            for client in (old, new):
                await client.write_event(RunSatellite().event())
                await client.write_event(Ping().event())
                await next_event(client, "pong")
            mic.say(np.concatenate([silence(0.3), command]))
            detection = await next_event(new, "detection")
            await new.write_event(Transcript(text="turn on the kitchen lights").event())
            await next_event(new, "audio-stop")
            await old.write_event(Ping().event())
            async with asyncio.timeout(10):  # the replaced controller got nothing of the turn
                while (event := await old.read_event()) is not None and event.type != "pong":
                    assert event.type not in ("detection", "run-pipeline", "audio-chunk"), event.type
            return detection

    assert asyncio.run(two_clients()).data["name"] == "okay_nabu"
    # With no controller any more the next turn is the device's own: Whisper transcribes it.
    mic.say(np.concatenate([silence(0.5), command, silence(1.5)]))
    heard = satellite["watcher"].wait("edge/dev1/transcript", timeout=60)
    assert "kitchen lights" in heard[-1]["text"].lower()


async def streaming_turn(client: AsyncTcpClient, mic: Microphone, command: np.ndarray) -> None:
    """Run the satellite as Home Assistant does, then say the wake word and `command` into the
    microphone: returns once the device streams the turn."""
    await client.write_event(RunSatellite().event())
    await client.write_event(Ping().event())
    await next_event(client, "pong")
    mic.say(np.concatenate([silence(0.3), command]))
    await next_event(client, "audio-chunk")


def test_home_assistant_giving_up_ends_the_turn_and_later_audio_is_an_announcement(
        satellite, clip_cache, piper_voice) -> None:
    port, mic, out = satellite["port"], satellite["mic"], satellite["out"]
    command = load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice))

    async def home_assistant() -> None:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await streaming_turn(client, mic, command)
            await client.write_event(Error(text="no speech heard", code="stt-no-text-recognized").event())
            await next_event(client, "audio-stop")  # the device stops streaming at once
            await send_audio(client, clip_22k(NOTICE, clip_cache, piper_voice), 22050)
            await next_event(client, "played")

    asyncio.run(home_assistant())
    assert not list(out.glob("ha-answer-*.wav"))  # no answer came: that audio was an announcement
    assert len(list(out.glob("ha-announce-*.wav"))) == 1
    ended = satellite["watcher"].wait("edge/dev1/wake")
    assert len(ended) == 1


@pytest.mark.parametrize("satellite", [{"listen.answer_wait_s": ANSWER_WAIT_S}], indirect=True)
def test_an_announcement_held_by_a_turn_home_assistant_gives_up_on_plays_without_the_answer_wait(
        satellite, broker, clip_cache, piper_voice) -> None:
    daemon, port, mic = satellite["daemon"], satellite["port"], satellite["mic"]
    watcher = satellite["watcher"]
    command = load_16k(piper_clip(WAKE_COMMAND, clip_cache, piper_voice))
    producer = Producer(broker.url)

    def meanwhile() -> list[str]:
        return watcher.statuses("dev1", "meanwhile")

    async def home_assistant() -> None:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await streaming_turn(client, mic, command)  # announcements now wait for its answer
            assert daemon.announcements.held
            producer.publish("edge/dev1/announce", {"id": "meanwhile", "text": "Meanwhile."})
            await asyncio.to_thread(wait_until, lambda: meanwhile() == ["queued"], what="queued")
            await client.write_event(Error(text="no speech heard", code="stt-no-text-recognized").event())
            await next_event(client, "audio-stop")

    try:
        asyncio.run(home_assistant())
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "meanwhile" and d["state"] == "done")
    finally:
        producer.close()
    assert meanwhile() == ["queued", "speaking", "done"]
    assert not daemon.announcements.held


def ha_platforms(info: Info) -> set[str]:
    """What Home Assistant's wyoming integration loads for a service with this `info`
    (homeassistant/components/wyoming/data.py: nothing but the satellite for a satellite)."""
    if info.satellite is not None and info.satellite.installed:
        return {"assist_satellite"}
    kinds = {"stt": info.asr, "tts": info.tts, "wake_word": info.wake}
    return {platform for platform, programs in kinds.items() if any(p.installed for p in programs)}


def test_one_run_gives_home_assistant_the_satellite_and_the_services_with_the_models_loaded_once(
        satellite, clip_cache, piper_voice) -> None:
    daemon, port, services_port = satellite["daemon"], satellite["port"], satellite["services_port"]
    watcher = satellite["watcher"]
    notice = clip_22k(NOTICE, clip_cache, piper_voice)

    async def describe(at: int) -> Info:
        async with AsyncTcpClient("127.0.0.1", at) as client:
            await client.write_event(Describe().event())
            return Info.from_event(await next_event(client, "info", timeout=5))

    async def synthesize() -> bytes:
        async with AsyncTcpClient("127.0.0.1", services_port) as client:
            await client.write_event(Synthesize(text="One. Two.").event())
            pcm = b""
            while (event := await next_event(client, "")).type != "audio-stop":
                if AudioChunk.is_type(event.type):
                    pcm += AudioChunk.from_event(event).audio
            return pcm

    def published_connected() -> bool:
        """What the device status on MQTT says last (statuses coalesce: the newest one counts)."""
        seen = [d["satellite"]["connected"] for d in watcher.find("edge/dev1/status") if "satellite" in d]
        return bool(seen) and seen[-1] is True

    async def home_assistant() -> list[bool]:
        """Muted and unmuted within a second (pause, no run-satellite), then an announcement."""
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(RunSatellite().event())
            await client.write_event(PauseSatellite().event())
            connected = []
            for _ in range(2):  # Home Assistant's loop goes on pinging every ~2 s
                await client.write_event(Ping().event())
                await next_event(client, "pong")
                connected.append(daemon.satellite.status()["connected"])
            # Home Assistant runs the satellite; the device's published status says so too.
            await asyncio.to_thread(wait_until, published_connected, what="the status after the unmute")
            await send_audio(client, notice, 22050)
            await next_event(client, "played")
            return connected

    sat_info, services_info = asyncio.run(describe(port)), asyncio.run(describe(services_port))
    assert ha_platforms(sat_info) == {"assist_satellite"} and not sat_info.asr and not sat_info.tts
    assert sat_info.wake  # what Home Assistant names the satellite's detections with
    assert services_info.satellite is None
    assert ha_platforms(services_info) == {"stt", "tts", "wake_word"}
    assert len(asyncio.run(synthesize())) > 0
    # One voice, one Whisper: the services endpoint holds the daemon's own objects.
    services = daemon.wyoming.services.server.services
    assert services.tts.synth() is daemon.synth
    assert services.asr.transcriber is daemon.listener.transcriber
    assert daemon.wyoming.endpoints[0].server.services.wake is services.wake

    assert asyncio.run(home_assistant()) == [False, True]
    assert len(list(satellite["out"].glob("ha-announce-*.wav"))) == 1
