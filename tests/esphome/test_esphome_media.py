"""Audio URLs from a hostile or broken HTTP server, sent by Home Assistant's own client library.

The daemon runs in this process with the ESPHome API on and `esphome.media_timeout_s`
at 2 s; the URLs point at `AbusiveMedia` on loopback, which dribbles, stalls and lies.
Each announcement must finish (unsuccessfully) within the media timeout, with its
reason logged, and the device must let go of the server's connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_agent.daemon import Daemon
from edge_agent.esphome.media import MAX_FETCHES, fetch_audio
from tests.esphome_support import connected, run_daemon
from tests.media_servers import AbusiveMedia, abusive_media
from tests.mqtt_support import wait_until

TIMEOUT_S = 2.0
MARGIN_S = 1.5
"""Generous: the deadline is enforced while reading, so the answer comes at about TIMEOUT_S."""


@pytest.fixture
def abusive() -> Iterator[AbusiveMedia]:
    yield from abusive_media()


@pytest.fixture
def device(tmp_path: Path, broker: Any) -> Iterator[Daemon]:
    yield from run_daemon(tmp_path, broker, {"esphome.media_timeout_s": TIMEOUT_S})


async def _announce(daemon: Daemon, url: str) -> tuple[bool, float]:
    """Home Assistant's announce on a connection of its own: (success, seconds to the finish)."""
    async for client in connected(daemon):
        start = time.monotonic()
        finished = await client.send_voice_assistant_announcement_await_response(url, 30)
        return finished.success, time.monotonic() - start
    raise AssertionError("not connected")


@pytest.mark.parametrize("path", ["dribble", "slow-headers", "stall"])
def test_a_url_that_dribbles_or_stalls_is_answered_within_the_media_timeout(
        device: Daemon, abusive: AbusiveMedia, path: str, caplog: Any) -> None:
    with caplog.at_level(logging.WARNING):
        success, took = asyncio.run(_announce(device, abusive.url(path)))
    assert not success
    assert TIMEOUT_S - 0.1 <= took <= TIMEOUT_S + MARGIN_S, f"{path}: answered after {took:.2f} s"
    assert f"not fetched within {TIMEOUT_S:g} s" in caplog.text
    wait_until(lambda: abusive.open == 0 or path != "stall", timeout=5, what="the device to hang up")


def test_a_lying_content_length_is_refused_at_once_or_read_only_as_far_as_it_says(
        device: Daemon, abusive: AbusiveMedia, tmp_path: Path, caplog: Any) -> None:
    with caplog.at_level(logging.WARNING):
        big, took = asyncio.run(_announce(device, abusive.url("lie-long")))  # says 1 GiB
        assert not big and took < 1.0
        assert "1073741824 bytes (at most 16777216)" in caplog.text
        # Says 1000 bytes and sends 16 MiB: the first 1000 are the WAV (956 bytes of samples).
        short, took = asyncio.run(_announce(device, abusive.url("lie-short")))
    assert short and took < 10
    endless, took = asyncio.run(_announce(device, abusive.url("endless")))
    assert not endless and took < TIMEOUT_S + MARGIN_S
    assert "more than 16777216 bytes" in caplog.text or f"within {TIMEOUT_S:g} s" in caplog.text


def test_a_wav_too_long_to_announce_is_refused_from_its_header_before_it_is_decoded(
        device: Daemon, abusive: AbusiveMedia, caplog: Any) -> None:
    with caplog.at_level(logging.WARNING):
        long8k, _ = asyncio.run(_announce(device, abusive.url("big8-8000")))
        dense, _ = asyncio.run(_announce(device, abusive.url("big8-48000")))
    assert not long8k and not dense
    assert "the audio is 2097.1 s long, the limit is 600 s" in caplog.text
    assert "more than the 8388608 that media_max_bytes allows" in caplog.text
    assert device.esphome is not None
    budget = device.esphome.assistant.budget
    assert budget.held == 0 and budget.running == 0
    # One 16 MiB body counted at a time (its declared length, and the 32 MiB its samples would take
    # as 16-bit), never its four-times-larger float32 decode; refused from the header in the first
    # bytes, not after the whole body.
    assert budget.peak <= 48 * 1024 * 1024 == budget.limit_bytes
    assert abusive.streamed < 2 * 16 * 1024 * 1024, f"{abusive.streamed} bytes sent for two 16 MiB WAVs"


def test_one_connection_fetches_one_url_at_a_time_and_the_rest_are_refused_at_once(
        device: Daemon, abusive: AbusiveMedia, caplog: Any) -> None:
    async def scenario() -> list[tuple[bool, float]]:
        async for client in connected(device):
            first = asyncio.create_task(
                client.send_voice_assistant_announcement_await_response(abusive.url("stall"), 30))
            await asyncio.to_thread(wait_until, lambda: abusive.served == 1, 5, "the first fetch")
            answers = []
            for _ in range(11):
                start = time.monotonic()
                url = abusive.url("stall")
                finished = await client.send_voice_assistant_announcement_await_response(url, 10)
                answers.append((finished.success, time.monotonic() - start))
            await first
            return answers
        raise AssertionError("not connected")

    with caplog.at_level(logging.WARNING):
        answers = asyncio.run(scenario())
    assert all(not ok and took < 1.0 for ok, took in answers), answers
    assert caplog.text.count("previous URL is still being fetched (one at a time)") == 11
    assert abusive.served == 1  # the eleven never reached the server


@pytest.fixture
def patient(tmp_path: Path, broker: Any) -> Iterator[Daemon]:
    """A device whose fetches may take 30 s: what ends them sooner is not the timeout."""
    yield from run_daemon(tmp_path, broker, {"esphome.media_timeout_s": 30.0})


async def _noop(*_: Any) -> None:
    return None


def test_other_connections_cannot_take_the_fetch_kept_for_home_assistants_voice_connection(
        patient: Daemon, abusive: AbusiveMedia, media: Any, caplog: Any) -> None:
    url = media.tone("answer.wav", seconds=0.3)

    async def scenario() -> tuple[bool, float, bool]:
        async for first in connected(patient):
            stalled = asyncio.create_task(
                first.send_voice_assistant_announcement_await_response(abusive.url("stall"), 60))
            await asyncio.to_thread(wait_until, lambda: abusive.served == 1, 5, "the stalled fetch")
            refused, took = await _announce(patient, abusive.url("stall"))  # another connection
            async for home_assistant in connected(patient):
                home_assistant.subscribe_voice_assistant(handle_start=_noop, handle_stop=_noop,
                                                         handle_audio=_noop)
                await home_assistant.device_info()
                finished = await home_assistant.send_voice_assistant_announcement_await_response(url, 30)
            stalled.cancel()
            return refused, took, finished.success
        raise AssertionError("not connected")

    with caplog.at_level(logging.WARNING):
        refused, took, played = asyncio.run(scenario())
    assert not refused and took < 1.0
    kept = f"at most {MAX_FETCHES} at once, one of them kept for Home Assistant's voice connection"
    assert kept in caplog.text
    assert played  # fetched beside the stalled one
    assert abusive.served == 1


def test_a_connection_that_closes_has_its_stalled_fetch_cut_at_once(
        patient: Daemon, abusive: AbusiveMedia) -> None:
    async def scenario() -> None:
        async for client in connected(patient):
            stalled = asyncio.create_task(
                client.send_voice_assistant_announcement_await_response(abusive.url("stall"), 60))
            await asyncio.to_thread(wait_until, lambda: abusive.open == 1, 5, "the stalled fetch")
            stalled.cancel()
            await asyncio.gather(stalled, return_exceptions=True)

    asyncio.run(scenario())  # leaves: the client disconnects
    start = time.monotonic()
    wait_until(lambda: abusive.open == 0, timeout=10, what="the device to hang up on the server")
    assert time.monotonic() - start < 5.0  # not the 30 s media timeout
    assert patient.esphome is not None
    wait_until(lambda: patient.esphome.assistant.budget.running == 0, timeout=5, what="the place freed")


def test_a_streamed_wav_whose_header_arrives_alone_is_played_not_refused_as_too_long(
        abusive: AbusiveMedia) -> None:
    # Home Assistant's ffmpeg proxy states no size (0xFFFFFFFF) and its first chunk can be the
    # header alone: taken for 27 hours of audio, every announcement through it was refused.
    fetched = fetch_audio(abusive.url("streamed"), max_bytes=16 << 20, timeout_s=10, max_seconds=600)
    assert fetched.sample_rate == 16000
    assert len(fetched.samples) == 16000
