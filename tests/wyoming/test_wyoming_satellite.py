"""The satellite endpoint on a real server on loopback, with the real announcement pipeline behind it.

The client is the `wyoming` library's, sending the events Home Assistant's satellite side sends
(homeassistant/components/wyoming/assist_satellite.py): `run-satellite`, pings, `pause-satellite`
on a mute, announcements as `audio-start` (22050 Hz s16le, timestamp 0), 1024-sample chunks and
`audio-stop`, then waiting for `played`; timer events. The speaker writes WAV files.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping
from wyoming.satellite import PauseSatellite, RunSatellite
from wyoming.timer import TimerFinished

from edge_agent.announce.journal import Journal
from edge_agent.announce.pipeline import Announcer, Speaking
from edge_agent.announce.playout import DirOpener
from edge_agent.audio.wav import to_pcm16
from edge_agent.config import AnnouncementSettings, DeviceSettings, Settings, WyomingSettings
from edge_agent.wyoming.satellite import MAX_TIMER_CHIMES, PINGS_TO_RESUME, SatelliteService
from tests.mqtt_support import ToneSynth, wait_until
from tests.wyoming.wyoming_support import ServerThread

HA_RATE = 22050
"""What Home Assistant announces at."""
CHUNK = 1024


class Satellite:
    """A satellite endpoint (no services) whose audio goes to a real `Announcer` writing WAVs."""

    def __init__(self, tmp_path: Path, *, start_speaker: bool = True, **wyoming: Any) -> None:
        self.out = tmp_path / "out"
        announcements = AnnouncementSettings(state_dir=tmp_path / "state", max_audio_s=60.0)
        self.settings = Settings(device=DeviceSettings(id="dev1"), announcements=announcements,
                                 wyoming=WyomingSettings(**wyoming))
        self.announcer = Announcer(Speaking(announcements, ToneSynth(), DirOpener(self.out), frozenset()),
                                   Journal(announcements.state_dir, announcements))
        self.announcer.recover()
        if start_speaker:
            self.announcer.start()
        self.ended: list[str] = []
        self.statuses: list[bool] = []
        self.service: SatelliteService | None = None
        self.thread = ServerThread(self._make)
        self.port = self.thread.port

    def _make(self) -> Any:
        from edge_agent.wyoming.server import Services, WyomingServer

        self.service = SatelliteService(self.settings.wyoming, "dev1", self.announcer, self.ended.append,
                                        ["okay_nabu"], max_audio_s=self.settings.announcements.max_audio_s,
                                        on_change=lambda: self.statuses.append(self.connected))
        return WyomingServer(Services(satellite=self.service), self.settings.wyoming)

    @property
    def sat(self) -> SatelliteService:
        assert self.service is not None
        return self.service

    @property
    def connected(self) -> bool:
        """What the device status says (`satellite.connected`)."""
        return bool(self.sat.status()["connected"])

    def close(self) -> None:
        self.thread.close()
        self.announcer.stop()


@pytest.fixture
def satellite(tmp_path: Path) -> Iterator[Any]:
    made: list[Satellite] = []

    def make(**kw: Any) -> Satellite:
        made.append(Satellite(tmp_path, **kw))
        return made[-1]

    yield make
    for sat in made:
        sat.close()


async def next_event(client: AsyncTcpClient, wanted: str, timeout: float = 10.0) -> Event:
    """The next event of type `wanted`; anything else on the way is skipped."""
    async with asyncio.timeout(timeout):
        while True:
            event = await client.read_event()
            assert event is not None, f"the device closed the connection waiting for {wanted}"
            if event.type == wanted:
                return event


async def events_until_pong(client: AsyncTcpClient) -> list[Event]:
    """Ping, and everything the device sends before its pong (it answers events in order)."""
    await client.write_event(Ping(text="sync").event())
    seen = []
    async with asyncio.timeout(10):
        while (event := await client.read_event()) is not None and event.type != "pong":
            seen.append(event)
    return seen


async def run_satellite(client: AsyncTcpClient) -> None:
    await client.write_event(RunSatellite().event())
    await events_until_pong(client)


def tone(seconds: float, rate: int = HA_RATE) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


async def announce(client: AsyncTcpClient, samples: np.ndarray, rate: int = HA_RATE, *,
                   stop: bool = True) -> None:
    """What Home Assistant's `async_announce` writes."""
    await client.write_event(AudioStart(rate=rate, width=2, channels=1, timestamp=0).event())
    timestamp = 0
    for start in range(0, len(samples), CHUNK):
        chunk = AudioChunk(rate=rate, width=2, channels=1, audio=to_pcm16(samples[start:start + CHUNK]),
                           timestamp=timestamp)
        await client.write_event(chunk.event())
        timestamp += chunk.milliseconds
    if stop:
        await client.write_event(AudioStop().event())


def test_the_satellite_endpoint_describes_a_satellite_and_no_services(satellite) -> None:
    sat = satellite()

    async def describe() -> Info:
        async with AsyncTcpClient("127.0.0.1", sat.port) as client:
            await client.write_event(Describe().event())
            return Info.from_event(await next_event(client, "info"))

    info = asyncio.run(describe())
    assert info.satellite is not None and info.satellite.installed and info.satellite.name == "dev1"
    assert not info.asr and not info.tts


def test_an_announcement_after_pause_satellite_is_played(satellite) -> None:
    """Home Assistant's quick mute/unmute leaves it running without a new run-satellite; its next
    announcement on that connection is played and answered `played` (it was taken for speech to
    text before)."""
    sat = satellite()

    async def home_assistant() -> list[str]:
        async with AsyncTcpClient("127.0.0.1", sat.port) as client:
            await run_satellite(client)
            await client.write_event(PauseSatellite().event())
            await announce(client, tone(0.5))
            answer = [e.type for e in await events_until_pong(client)]
            if "played" not in answer:
                answer.append((await next_event(client, "played")).type)
            return answer

    answer = asyncio.run(home_assistant())
    assert "played" in answer and "transcript" not in answer and "error" not in answer
    played = list(sat.out.glob("ha-announce-*.wav"))
    assert len(played) == 1


def test_a_mute_undone_within_a_second_leaves_both_sides_running(satellite) -> None:
    """HA pauses on the mute, the unmute comes before its loop looked, so no run-satellite follows;
    its loop keeps pinging, and the device runs again (its status says connected) by the second ping."""
    sat = satellite()

    async def home_assistant() -> list[bool]:
        async with AsyncTcpClient("127.0.0.1", sat.port) as client:
            await run_satellite(client)
            seen = [sat.connected]
            await client.write_event(PauseSatellite().event())  # muted ...
            for _ in range(PINGS_TO_RESUME):  # ... and unmuted: HA's loop goes on pinging
                await events_until_pong(client)
                seen.append(sat.connected)
            return seen

    seen = asyncio.run(home_assistant())
    # Running, paused after the first ping (a real mute sends at most that one), running again.
    assert seen == [True] + [False] * (PINGS_TO_RESUME - 1) + [True]
    # Each change was published as it happened (then the disconnect's, once the client closed).
    assert sat.statuses[:3] == [True, False, True]


def test_a_paused_controller_that_stops_pinging_stays_paused(satellite) -> None:
    """A real mute: the pause, at most the one ping already under way, then quiet."""
    sat = satellite()

    async def home_assistant() -> bool:
        async with AsyncTcpClient("127.0.0.1", sat.port) as client:
            await run_satellite(client)
            await client.write_event(PauseSatellite().event())
            await events_until_pong(client)
            return sat.connected

    assert asyncio.run(home_assistant()) is False
    assert not sat.sat.streaming  # a wake word now stays on the device


def test_a_turn_streams_chunks_without_an_audio_start_ahead(satellite) -> None:
    """HA's satellite loop takes the microphone's chunks after run-pipeline and logs an
    `audio-start` as an unexpected event: none is sent."""
    sat = satellite()

    async def home_assistant() -> list[str]:
        async with AsyncTcpClient("127.0.0.1", sat.port) as client:
            await run_satellite(client)
            # The hearing loop's thread, as the daemon calls it on a wake word.
            await asyncio.to_thread(sat.sat.begin_turn, "turn1", "okay_nabu", "Okay Nabu", 0.5)
            await asyncio.to_thread(sat.sat.audio, "turn1", tone(0.1, 16000))
            await asyncio.to_thread(sat.sat.end_turn, "turn1")
            return [e.type for e in await events_until_pong(client)]

    kinds = asyncio.run(home_assistant())
    assert kinds[:3] == ["detection", "run-pipeline", "audio-chunk"]
    assert "audio-start" not in kinds and kinds[-1] == "audio-stop"


def test_an_implausible_rate_is_refused_at_audio_start(satellite) -> None:
    """384 kHz is a valid WAV rate but no announcement's: refused before anything is buffered,
    with one error for the whole stream."""
    sat = satellite()

    async def home_assistant() -> tuple[list[Event], list[str]]:
        async with AsyncTcpClient("127.0.0.1", sat.port) as client:
            await run_satellite(client)
            await client.write_event(AudioStart(rate=384000, width=2, channels=1).event())
            first = await events_until_pong(client)  # refused at once, before any chunk
            assert sat.sat.controller is not None and sat.sat.controller.recording is None
            await announce(client, tone(0.5, 384000)[:CHUNK * 4], 384000)
            rest = [e.type for e in await events_until_pong(client)]
            return first, rest

    first, rest = asyncio.run(home_assistant())
    assert [(e.type, e.data["code"]) for e in first] == [("error", "bad-audio-format")]
    assert "384000" in first[0].data["text"]
    assert rest == ["error"]  # the second stream's own audio-start; its chunks say nothing more
    assert not sat.out.exists() or not list(sat.out.iterdir())


def test_a_long_stream_stops_at_the_byte_bound_with_one_error(satellite) -> None:
    limit = 64 * 1024  # 16384 samples: 0.74 s at 22050 Hz
    sat = satellite(max_announce_bytes=limit)
    held = []

    async def home_assistant() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", sat.port) as client:
            await run_satellite(client)
            events = []
            await client.write_event(AudioStart(rate=HA_RATE, width=2, channels=1, timestamp=0).event())
            samples = tone(5.0)
            for start in range(0, len(samples), CHUNK):
                pcm = to_pcm16(samples[start:start + CHUNK])
                await client.write_event(AudioChunk(rate=HA_RATE, width=2, channels=1, audio=pcm).event())
                if start % (CHUNK * 4) == 0:  # what the buffer holds as the stream goes on
                    events += await events_until_pong(client)
                    recording = sat.sat.controller.recording if sat.sat.controller else None
                    held.append(recording.samples * 4 if recording is not None else 0)
            await client.write_event(AudioStop().event())
            events += await events_until_pong(client)
            await announce(client, tone(0.3))  # the connection still plays what fits
            await next_event(client, "played")
            return events

    events = asyncio.run(home_assistant())
    assert 0 < max(held) <= limit and held[-1] == 0  # never above the bound, freed once refused
    assert [(e.type, e.data.get("code")) for e in events] == [("error", "audio-too-large")]
    assert "wyoming.max_announce_bytes" in events[0].data["text"]
    assert len(list(sat.out.glob("ha-announce-*.wav"))) == 1  # only the one that fit


def test_a_takeover_frees_the_replaced_controllers_buffer(satellite) -> None:
    sat = satellite()
    held: dict[str, Any] = {}

    async def two_home_assistants() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", sat.port) as old, AsyncTcpClient("127.0.0.1", sat.port) as new:
            await run_satellite(old)
            await announce(old, tone(2.0), stop=False)  # half an announcement, then HA reconnects
            await events_until_pong(old)
            session = sat.sat.controller
            assert session is not None and session.recording is not None
            held["buffer"] = weakref.ref(session.recording)
            await run_satellite(new)
            assert sat.sat.controller is not session and session.recording is None
            gc.collect()
            held["freed_on_takeover"] = held["buffer"]() is None
            # The replaced connection's rest of that stream is dropped quietly, a new stream refused.
            await announce(old, tone(0.2))
            return await events_until_pong(old)

    events = asyncio.run(two_home_assistants())
    assert held["freed_on_takeover"]
    assert [(e.type, e.data.get("code")) for e in events] == [("error", "not-controller")]
    assert not sat.out.exists() or not list(sat.out.iterdir())


def test_a_disconnect_frees_the_buffer(satellite) -> None:
    sat = satellite()
    held: dict[str, Any] = {}

    async def home_assistant() -> None:
        async with AsyncTcpClient("127.0.0.1", sat.port) as client:
            await run_satellite(client)
            await announce(client, tone(2.0), stop=False)
            await events_until_pong(client)
            session = sat.sat.controller
            assert session is not None and session.recording is not None
            held["buffer"] = weakref.ref(session.recording)

    asyncio.run(home_assistant())
    wait_until(lambda: sat.sat.controller is None, what="the disconnect")
    gc.collect()
    assert held["buffer"]() is None


def test_a_timer_flood_is_two_chimes_and_one_per_timer_id(satellite) -> None:
    sat = satellite(start_speaker=False)  # nothing is played: every chime stays waiting
    audio_dir = sat.announcer.audio_files.directory

    async def home_assistant(timers: list[str]) -> None:
        async with AsyncTcpClient("127.0.0.1", sat.port) as client:
            await run_satellite(client)
            for timer in timers:
                await client.write_event(TimerFinished(id=timer).event())
            await events_until_pong(client)

    asyncio.run(home_assistant(["kitchen", "kitchen"]))  # the same timer again: its chime is waiting
    assert sat.sat.chimes_waiting == 1 and len(list(audio_dir.glob("*.wav"))) == 1
    asyncio.run(home_assistant([f"timer-{i % 150}" for i in range(300)]))
    assert sat.sat.chimes_waiting == MAX_TIMER_CHIMES
    assert len(list(audio_dir.glob("*.wav"))) == MAX_TIMER_CHIMES
    assert len(sat.announcer.queue) == MAX_TIMER_CHIMES
    assert sat.sat.chimes_dropped == 300 + 1 - (MAX_TIMER_CHIMES - 1)
    sat.announcer.start()  # played: the next timer chimes again
    wait_until(lambda: sat.sat.chimes_waiting == 0, what="the chimes played")
    asyncio.run(home_assistant(["oven"]))
    wait_until(lambda: len(list(sat.out.glob("ha-timer-*.wav"))) == MAX_TIMER_CHIMES + 1,
               what="the next timer's chime")


def test_only_the_controller_buffers_audio(satellite) -> None:
    """A connection that never ran the satellite is not Home Assistant's: its audio on this endpoint
    (which has no speech to text) is refused, not buffered."""
    sat = satellite()

    async def stranger() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", sat.port) as client:
            await announce(client, tone(0.2))
            return await events_until_pong(client)

    events = asyncio.run(stranger())
    assert events and all(e.type == "error" for e in events)
    assert not sat.out.exists() or not list(sat.out.iterdir())

