"""The ESPHome API's encrypted transport (`esphome.encryption_key`), against aioesphomeapi's own
Noise client: the right key works end to end, a wrong key and a plain-text client are each told
why in the way the client understands, and a device without a key says so to an encrypted client."""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path
from typing import Any

import pytest
from aioesphomeapi import InvalidEncryptionKeyAPIError, RequiresEncryptionAPIError
from aioesphomeapi.core import APIConnectionError

from edge_agent.errors import ConfigError
from tests.esphome_support import MediaServer, connected, run_daemon

KEY = base64.b64encode(bytes(range(32))).decode()
OTHER = base64.b64encode(bytes(range(1, 33))).decode()


def test_the_right_key_connects_and_a_whole_announcement_goes_through_encrypted(
        tmp_path: Path, broker: Any, media: MediaServer) -> None:
    url = media.tone("announce.wav", seconds=0.3)

    async def scenario(daemon: Any) -> tuple[Any, bool]:
        async for client in connected(daemon, noise_psk=KEY):
            info = await client.device_info()
            finished = await client.send_voice_assistant_announcement_await_response(url, 30, "Hi")
            return info, finished.success
        raise AssertionError("not connected")

    for daemon in run_daemon(tmp_path, broker, {"esphome.encryption_key": KEY}):
        info, played = asyncio.run(scenario(daemon))
        assert info.name == "kitchen" and info.api_encryption_supported and played


def test_a_wrong_key_and_a_plain_text_client_are_refused_with_their_reason(
        tmp_path: Path, broker: Any, caplog: pytest.LogCaptureFixture) -> None:
    async def attempt(daemon: Any, psk: str | None) -> BaseException:
        try:
            async for _client in connected(daemon, noise_psk=psk):
                pass
        except APIConnectionError as exc:
            return exc
        raise AssertionError("connected")

    with caplog.at_level(logging.WARNING):
        for daemon in run_daemon(tmp_path, broker, {"esphome.encryption_key": KEY}):
            assert isinstance(asyncio.run(attempt(daemon, OTHER)), InvalidEncryptionKeyAPIError)
            assert isinstance(asyncio.run(attempt(daemon, None)), RequiresEncryptionAPIError)

            assert asyncio.run(name_of(daemon)) == "kitchen"  # the refusals cost the others nothing
    assert "does not match esphome.encryption_key" in caplog.text
    assert "requires encryption" in caplog.text


async def name_of(daemon: Any) -> str:
    async for client in connected(daemon, noise_psk=KEY):
        return str((await client.device_info()).name)
    raise AssertionError("not connected")


def test_a_device_without_a_key_tells_an_encrypted_client_it_speaks_plain_text(
        device: Any, caplog: pytest.LogCaptureFixture) -> None:
    async def attempt() -> None:
        async for _client in connected(device, noise_psk=KEY):
            pass

    with caplog.at_level(logging.WARNING), pytest.raises(APIConnectionError):
        asyncio.run(attempt())
    assert "this device speaks plain text" in caplog.text


@pytest.mark.parametrize("key", ["not base64!", base64.b64encode(bytes(16)).decode()])
def test_a_key_that_is_not_32_bytes_of_base64_is_a_config_error(key: str) -> None:
    from edge_agent.config import load_settings

    with pytest.raises(ConfigError, match="encryption_key: not base64 of 32 bytes"):
        load_settings(None, {"esphome.encryption_key": key})
