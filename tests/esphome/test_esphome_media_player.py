"""The media player as Home Assistant drives it: play_media (FLAC, MP3), pause, resume, stop, mute,
and the music ducked and paused by what the device says and hears.

The daemon runs in this process with the ESPHome API on; Home Assistant's own client library
(aioesphomeapi) sends the commands its esphome integration sends. Tracks are made here with
libsndfile (soundfile writes FLAC and, through LAME, MP3) and served over loopback HTTP; what
the device plays lands in `daemon.out_dir` as `media-<id>-<n>.wav`, one file per stretch of
output, each placed on the clock (`Segment.start_us`), so every level is measured on the
output timeline. The reference samples are the same files decoded by the same library.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from aioesphomeapi import (
    APIClient,
    MediaPlayerCommand,
    MediaPlayerEntityState,
    MediaPlayerState,
    VoiceAssistantTimerEventType,
)

from edge_agent.audio.wav import read_wav
from edge_agent.daemon import Daemon
from edge_agent.esphome.entities import MEDIA_PLAYER
from edge_agent.esphome.player import Segment, TrackPlayer, now_us
from edge_agent.listen.hearing import TurnEnded, Woke
from edge_agent.wake.engine import Detection
from tests.esphome_support import MediaServer, connected, run_daemon
from tests.mqtt_support import PacedOpener, wait_until

RATE = 22050
BLOCK_S = 0.02
"""The player's block: each segment fades in over its first, a pause fades out over its last."""
TOLERANCE = 2.5 / 32768
"""The output WAV is 16-bit: a sample is within a step or two of the reference."""


def _tone(seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    mono = (amplitude * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    return np.stack([mono, mono], axis=1)  # stereo, as music comes: the player mixes it down


def _noise(seconds: float) -> np.ndarray:
    """Samples that differ everywhere, so that a place in the track can be recognised."""
    rng = np.random.default_rng(7)
    return (rng.integers(-9000, 9000, round(seconds * RATE)) / 32768).astype(np.float32)


def _reference(data: bytes) -> np.ndarray:
    samples, _ = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return samples.mean(axis=1, dtype=np.float32)


class Session:
    """Home Assistant's connection, with every media player state it was sent."""

    def __init__(self, client: APIClient) -> None:
        self.client = client
        self.states: list[MediaPlayerEntityState] = []
        client.subscribe_states(self._state)

    def _state(self, state: Any) -> None:
        if isinstance(state, MediaPlayerEntityState):
            self.states.append(state)

    def command(self, **kwargs: Any) -> None:
        self.client.media_player_command(MEDIA_PLAYER, **kwargs)

    async def until(self, condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not condition():
                    await asyncio.sleep(0.01)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None

    async def until_state(self, state: MediaPlayerState) -> None:
        await self.until(lambda: bool(self.states) and self.states[-1].state == state, f"state {state.name}")

    async def until_muted(self, muted: bool) -> None:
        await self.until(lambda: bool(self.states) and self.states[-1].muted == muted, f"muted {muted}")

    async def for_s(self, seconds: float) -> None:
        """Let `seconds` of output pass (what is measured, not a synchronisation)."""
        end = time.monotonic() + seconds
        await self.until(lambda: time.monotonic() >= end, f"{seconds} s")


def _player(device: Daemon) -> TrackPlayer:
    assert device.esphome is not None and device.esphome.assistant.player is not None
    return device.esphome.assistant.player


def _heard(out_dir: Path, segment: Segment) -> np.ndarray:
    return read_wav(out_dir / f"{segment.name}.wav").samples


def _rms_at(samples: np.ndarray, segment: Segment, t_us: int, seconds: float) -> float:
    start = round((t_us - segment.start_us) * segment.rate / 1e6)
    window = samples[max(0, start):start + round(seconds * segment.rate)]
    assert len(window) > 0.9 * seconds * segment.rate, "the window is outside the output"
    return float(np.sqrt(np.mean(np.square(window, dtype=np.float64))))


@pytest.fixture
def device(tmp_path: Path, broker: Any) -> Iterator[Daemon]:
    # Announcements are written at a loudspeaker's pace, so they last as long as their audio.
    yield from run_daemon(tmp_path, broker, {}, opener_factory=lambda s: PacedOpener(tmp_path / "spoken"))


@pytest.mark.parametrize("kind", ["FLAC", "MP3"])
def test_a_flac_or_mp3_track_plays_whole_on_the_output_and_home_assistant_sees_playing_then_idle(
        device: Daemon, media: MediaServer, tmp_path: Path, kind: str) -> None:
    data = media.encoded(f"track.{kind.lower()}", _tone(1.0), RATE, kind)

    async def scenario() -> list[MediaPlayerState]:
        async for client in connected(device):
            ha = Session(client)
            await ha.until_state(MediaPlayerState.IDLE)
            ha.command(media_url=media.url(f"track.{kind.lower()}"))
            await ha.until_state(MediaPlayerState.PLAYING)
            await ha.until_state(MediaPlayerState.IDLE)
            return [s.state for s in ha.states]
        raise AssertionError("not connected")

    states = asyncio.run(scenario())
    assert states[0] == MediaPlayerState.IDLE and MediaPlayerState.PLAYING in states
    [segment] = _player(device).stats.segments
    out, reference = _heard(tmp_path / "out", segment), _reference(data) * device.volume()
    block = round(BLOCK_S * RATE)
    assert len(out) == len(reference) and segment.offset == 0
    assert np.max(np.abs(out[block:] - reference[block:])) < TOLERANCE
    wait_until(lambda: device.esphome.assistant.budget.held == 0, 5, "the track's memory released")


def test_pause_stops_the_output_and_play_resumes_where_it_paused(
        device: Daemon, media: MediaServer, tmp_path: Path) -> None:
    data = media.encoded("noise.flac", _noise(2.0), RATE, "FLAC")
    player = _player(device)
    marks: dict[str, Any] = {}

    async def scenario() -> None:
        async for client in connected(device):
            ha = Session(client)
            ha.command(media_url=media.url("noise.flac"))
            await ha.until(lambda: player.stats.blocks >= 20, "0.4 s played")
            ha.command(command=MediaPlayerCommand.PAUSE)
            await ha.until_state(MediaPlayerState.PAUSED)
            await ha.until((tmp_path / "out" / f"{player.stats.segments[0].name}.wav").exists,
                           "the output closed")
            assert player.track is not None
            marks["at"], marks["paused"] = player.track.position, now_us()
            await ha.for_s(0.5)
            marks["still"], marks["segments"] = player.track.position, len(player.stats.segments)
            ha.command(command=MediaPlayerCommand.PLAY)
            await ha.until_state(MediaPlayerState.PLAYING)
            await ha.until_state(MediaPlayerState.IDLE)

    asyncio.run(scenario())
    assert marks["still"] == marks["at"] and marks["segments"] == 1  # nothing played while paused
    first, second = player.stats.segments
    a, b = _heard(tmp_path / "out", first), _heard(tmp_path / "out", second)
    reference, block = _reference(data) * device.volume(), round(BLOCK_S * RATE)
    assert len(a) == second.offset == marks["at"]  # it resumed at the sample where it paused
    assert len(a) + len(b) == len(reference)
    assert np.max(np.abs(a[block:-block] - reference[block:len(a) - block])) < TOLERANCE
    assert np.max(np.abs(b[block:] - reference[len(a) + block:])) < TOLERANCE
    assert np.max(np.abs(a[-1])) < 0.01  # faded out, not cut
    gap_s = (second.start_us - first.start_us) / 1e6 - len(a) / RATE
    print(f"pause: {len(a) / RATE:.2f} s played, then a {gap_s:.2f} s gap, then the rest")
    assert gap_s >= 0.5


def test_mute_silences_the_track_as_it_runs_and_stop_ends_it(
        device: Daemon, media: MediaServer, tmp_path: Path) -> None:
    media.encoded("tone.flac", _tone(4.0), RATE, "FLAC")
    player = _player(device)
    marks: dict[str, int] = {}
    muted_states: list[bool] = []

    async def scenario() -> None:
        async for client in connected(device):
            ha = Session(client)
            ha.command(media_url=media.url("tone.flac"))
            await ha.until(lambda: player.stats.blocks >= 20, "0.4 s played")
            marks["mute"] = now_us()
            ha.command(command=MediaPlayerCommand.MUTE)
            await ha.until_muted(True)
            await ha.for_s(0.5)
            marks["unmute"] = now_us()
            ha.command(command=MediaPlayerCommand.UNMUTE)
            await ha.until_muted(False)
            await ha.for_s(0.4)
            ha.command(command=MediaPlayerCommand.STOP)
            await ha.until_state(MediaPlayerState.IDLE)
            muted_states.extend(s.muted for s in ha.states)

    asyncio.run(scenario())
    assert True in muted_states and muted_states[-1] is False and not device.media_muted()
    [segment] = player.stats.segments
    out = _heard(tmp_path / "out", segment)
    full = 0.5 / 2 ** 0.5 * device.volume()
    before = _rms_at(out, segment, marks["mute"] - 200_000, 0.15)
    muted = _rms_at(out, segment, marks["mute"] + 100_000, 0.35)
    after = _rms_at(out, segment, marks["unmute"] + 100_000, 0.25)
    print(f"mute: {before:.4f} -> {muted:.4f} -> {after:.4f}; stopped after {len(out) / RATE:.2f} of 4 s")
    assert abs(before - full) < 0.01 * full and muted == 0.0 and abs(after - full) < 0.01 * full
    assert len(out) < 3.0 * RATE  # stopped, not played to the end
    wait_until(lambda: device.esphome.assistant.budget.held == 0, 5, "the track's memory released")


def test_a_corrupt_flac_or_mp3_is_refused_with_libsndfiles_reason_and_nothing_plays(
        device: Daemon, media: MediaServer, caplog: Any) -> None:
    rng = np.random.default_rng(3)
    flac = media.encoded("good.flac", _tone(1.0), RATE, "FLAC")
    (media.root / "bad.flac").write_bytes(flac[:120] + rng.bytes(20000))  # STREAMINFO, then garbage
    (media.root / "bad.mp3").write_bytes(b"ID3\x03\x00\x00\x00\x00\x00\x00" + rng.bytes(20000))
    player = _player(device)

    async def scenario() -> list[bool]:
        async for client in connected(device):
            ha = Session(client)
            answers = []
            for name in ("bad.flac", "bad.mp3"):
                finished = await client.send_voice_assistant_announcement_await_response(media.url(name), 10)
                answers.append(finished.success)
                ha.command(media_url=media.url(name))
                n = len(answers)
                await ha.until(lambda n=n: caplog.text.count("media not played") == n, "the refusal")
            assert all(s.state != MediaPlayerState.PLAYING for s in ha.states)
            return answers
        raise AssertionError("not connected")

    with caplog.at_level(logging.WARNING):
        answers = asyncio.run(scenario())
    assert answers == [False, False]  # Home Assistant's announcement finished unsuccessfully
    assert caplog.text.count("not playable FLAC (libsndfile: ") == 2
    assert caplog.text.count("not playable MP3 (libsndfile: ") == 2
    assert not player.stats.segments and player.state == "idle"
    budget = device.esphome.assistant.budget
    wait_until(lambda: budget.held == 0 and budget.running == 0, 5, "the budget freed")


@pytest.fixture
def small(tmp_path: Path, broker: Any) -> Iterator[Daemon]:
    """A device whose media may decode to 512 Ki samples (`media_max_bytes` 1 MiB as 16-bit mono)."""
    yield from run_daemon(tmp_path, broker, {"esphome.media_max_bytes": 1 << 20})


def _unstated(flac: bytes) -> bytes:
    """A FLAC whose STREAMINFO says its length is unknown (0), so only decoding finds it out."""
    data = bytearray(flac)
    data[8 + 13] &= 0xF0  # the top 4 of the 36 bits of total samples
    data[8 + 14:8 + 18] = bytes(4)
    return bytes(data)


@pytest.mark.parametrize("name", ["stated.flac", "unstated.flac", "silence.mp3"])
def test_a_small_file_that_decodes_past_the_budget_is_refused_while_memory_stays_bounded(
        small: Daemon, media: MediaServer, caplog: Any, name: str) -> None:
    silence = np.zeros(120 * RATE, dtype=np.float32)  # 2.6 M samples: five times what 1 MiB allows
    if name.endswith(".mp3"):
        size = len(media.encoded(name, silence[:60 * RATE], RATE, "MP3"))
    else:
        flac = media.encoded("stated.flac", silence, RATE, "FLAC")
        (media.root / "unstated.flac").write_bytes(_unstated(flac))
        size = len(flac)
    budget = small.esphome.assistant.budget

    async def scenario() -> None:
        async for client in connected(small):
            ha = Session(client)
            ha.command(media_url=media.url(name))
            await ha.until(lambda: "media not played" in caplog.text, "the refusal")

    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING):
            asyncio.run(scenario())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"{name}: {size} bytes refused; budget peak {budget.peak >> 10} KiB of {budget.limit_bytes >> 10}, "
          f"Python's peak {peak >> 10} KiB")
    assert f"more than the {(1 << 20) // 2} that media_max_bytes allows" in caplog.text
    assert budget.peak <= budget.limit_bytes and peak < budget.limit_bytes + (1 << 20)
    if name == "stated.flac":
        assert budget.peak < 4 * size + (1 << 16)  # refused from STREAMINFO, before a sample
    else:  # refused as it decoded, at the bound: 512 Ki samples of float32 held at most
        assert (1 << 20) < budget.peak < (2 << 20) + 4 * size + (1 << 18)
    wait_until(lambda: budget.held == 0 and budget.running == 0, 5, "the budget freed")
    assert not _player(small).stats.segments


def test_an_announcement_ducks_the_track_while_it_is_spoken_and_restores_it(
        device: Daemon, media: MediaServer, tmp_path: Path) -> None:
    media.encoded("tone.flac", _tone(5.0), RATE, "FLAC")
    announcement = media.tone("announce.wav", seconds=1.5)
    player = _player(device)
    marks: dict[str, int] = {}

    async def scenario() -> None:
        async for client in connected(device):
            ha = Session(client)
            ha.command(media_url=media.url("tone.flac"))
            await ha.until(lambda: player.stats.blocks >= 25, "0.5 s played")
            spoken = asyncio.create_task(
                client.send_voice_assistant_announcement_await_response(announcement, 30))
            await ha.until(lambda: player.ducked, "the track ducked")
            marks["duck"] = now_us()
            await ha.until(lambda: not player.ducked, "the track restored")
            marks["restore"] = now_us()
            assert (await spoken).success
            await ha.for_s(0.5)
            ha.command(command=MediaPlayerCommand.STOP)
            await ha.until_state(MediaPlayerState.IDLE)

    asyncio.run(scenario())
    [segment] = player.stats.segments
    out = _heard(tmp_path / "out", segment)
    spoken_s = (marks["restore"] - marks["duck"]) / 1e6
    before = _rms_at(out, segment, marks["duck"] - 250_000, 0.15)
    ducked = _rms_at(out, segment, marks["duck"] + 100_000, spoken_s - 0.2)
    after = _rms_at(out, segment, marks["restore"] + 100_000, 0.3)
    print(f"ducking: {spoken_s:.2f} s announcement: {before:.4f} -> {ducked:.4f} ({ducked / before:.3f}) "
          f"-> {after:.4f}")
    assert 1.3 < spoken_s < 3.0
    assert abs(ducked / before - device.settings.sendspin.duck_level) < 0.01
    assert abs(after - before) < 0.01 * before
    assert (tmp_path / "spoken").is_dir()  # the announcement's own output, beside the track's


def test_a_wake_word_pauses_the_track_until_the_turn_ends_then_it_goes_on_where_it_was(
        device: Daemon, media: MediaServer, tmp_path: Path) -> None:
    data = media.encoded("noise.flac", _noise(1.5), RATE, "FLAC")
    player = _player(device)

    async def scenario() -> list[MediaPlayerState]:
        async for client in connected(device):
            ha = Session(client)
            ha.command(media_url=media.url("noise.flac"))
            await ha.until(lambda: player.stats.blocks >= 20, "0.4 s played")
            # What the hearing loop tells the daemon's conversation turn, which tells its observers.
            wake = Detection("okay_nabu", "Okay Nabu", 1.0, 0.99)
            device.turns.on_event(Woke(detection=wake, conversation_id="c1"))
            await ha.until_state(MediaPlayerState.PAUSED)
            await ha.for_s(0.3)
            device.turns.on_event(TurnEnded("c1", "heard", 0.0))
            await ha.until_state(MediaPlayerState.PLAYING)
            await ha.until_state(MediaPlayerState.IDLE)
            return [s.state for s in ha.states]
        raise AssertionError("not connected")

    asyncio.run(scenario())
    first, second = player.stats.segments
    a = _heard(tmp_path / "out", first)
    assert second.offset == len(a) and len(a) + len(_heard(tmp_path / "out", second)) == len(_reference(data))


def test_a_flac_that_does_not_state_its_length_still_plays_whole_when_it_fits() -> None:
    from edge_agent.esphome.media import decode_audio

    buffer = io.BytesIO()
    soundfile.write(buffer, _tone(1.0), RATE, format="FLAC")
    fetched = decode_audio(bytearray(_unstated(buffer.getvalue())), "streamed.flac", max_samples=RATE)
    assert len(fetched.samples) == RATE and fetched.sample_rate == RATE


def test_play_media_as_an_announcement_goes_through_the_announcement_queue_not_the_track_player(
        device: Daemon, media: MediaServer, tmp_path: Path) -> None:
    url = media.tone("chime.wav", seconds=0.3)
    spoken = tmp_path / "spoken"

    async def scenario() -> None:
        async for client in connected(device):
            client.media_player_command(MEDIA_PLAYER, media_url=url, announcement=True)
            await asyncio.to_thread(wait_until, lambda: any(spoken.glob("esphome-announce-*.wav")), 10,
                                    "the announcement played")

    asyncio.run(scenario())
    assert not _player(device).stats.segments


def _vm(field: str) -> int:
    """This process's `VmRSS` or `VmHWM` (its peak since `_reset_peak`), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def test_an_hour_of_flac_silence_that_hides_its_length_is_refused_with_the_peak_rss_within_the_budget(
        device: Daemon, media: MediaServer, caplog: Any) -> None:
    zeros = np.zeros(1 << 20, dtype=np.float32)
    with soundfile.SoundFile(media.root / "hour.flac", "w", RATE, 1, format="FLAC") as out:
        for _ in range(76):  # 3616 s, 80 M samples: ten times the 8 Mi that 16 MiB allows
            out.write(zeros)
    data = (media.root / "hour.flac").read_bytes()
    (media.root / "hidden.flac").write_bytes(_unstated(data))
    budget = device.esphome.assistant.budget

    async def scenario() -> None:
        async for client in connected(device):
            ha = Session(client)
            ha.command(media_url=media.url("hidden.flac"))
            await ha.until(lambda: "media not played" in caplog.text, "the refusal")

    Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from now
    before = _vm("VmRSS")
    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    grew = _vm("VmHWM") - before
    print(f"hour.flac: {len(data)} bytes, refused at {budget.peak >> 20} MiB counted of "
          f"{budget.limit_bytes >> 20}; the process's peak RSS grew {grew / 2 ** 20:.1f} MiB")
    assert "more than the 8388608 that media_max_bytes allows" in caplog.text
    assert budget.peak <= budget.limit_bytes and grew < budget.limit_bytes
    wait_until(lambda: budget.held == 0 and budget.running == 0, 5, "the budget freed")


def test_a_finished_timer_ducks_the_track_while_its_chime_plays(
        device: Daemon, media: MediaServer, tmp_path: Path) -> None:
    # Long enough to outlast the chime's synthesis on a loaded machine (the test stops it).
    media.encoded("tone.flac", _tone(30.0), RATE, "FLAC")
    player = _player(device)

    async def scenario() -> None:
        async for client in connected(device):
            ha = Session(client)
            ha.command(media_url=media.url("tone.flac"))
            await ha.until(lambda: player.stats.blocks >= 10, "0.2 s played")
            finished = VoiceAssistantTimerEventType.VOICE_ASSISTANT_TIMER_FINISHED
            client.send_voice_assistant_timer_event(finished, "t1", "pasta", 60, 0, False)
            await ha.until(lambda: player.ducked, "the track ducked")
            await ha.until(lambda: not player.ducked, "the track restored")
            assert player.state == "playing"  # the track played on under the chime
            ha.command(command=MediaPlayerCommand.STOP)
            await ha.until_state(MediaPlayerState.IDLE)

    asyncio.run(scenario())
    assert len(list((tmp_path / "spoken").glob("esphome-timer-*.wav"))) == 1
    assert len(player.stats.segments) == 1  # ducked, never paused
