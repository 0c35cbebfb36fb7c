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
from edge_agent.esphome.media import MAX_FETCHES
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
    # One 16 MiB body held at a time, never its four-times-larger float32 decode.
    assert budget.peak <= 16 * 1024 * 1024


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


def test_fetches_beyond_the_devices_cap_are_refused_at_once(
        device: Daemon, abusive: AbusiveMedia, caplog: Any) -> None:
    async def scenario() -> tuple[bool, float]:
        stalls = [asyncio.create_task(_announce(device, abusive.url("stall"))) for _ in range(MAX_FETCHES)]
        await asyncio.to_thread(wait_until, lambda: abusive.served == MAX_FETCHES, 5, "the stalled fetches")
        answer = await _announce(device, abusive.url("stall"))
        assert all(not ok for ok, _ in await asyncio.gather(*stalls))
        return answer

    with caplog.at_level(logging.WARNING):
        success, took = asyncio.run(scenario())
    assert not success and took < 1.0
    assert f"already fetching {MAX_FETCHES} media URLs (at most {MAX_FETCHES} at once)" in caplog.text
    assert abusive.served == MAX_FETCHES
