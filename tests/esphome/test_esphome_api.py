"""The ESPHome native API inside `edge-agent run`, driven by aioesphomeapi (Home Assistant's client).

The daemon runs in this process (a tone voice, WAV files as the speaker); the client
calls what Home Assistant's esphome integration calls: connect and log in, device
info, the entity list, states, announcements, volume, mute, timers, the voice
assistant's configuration; raw sockets send what no honest client would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path
from typing import Any

import numpy as np
from aioesphomeapi import (
    APIClient,
    MediaPlayerEntityState,
    MediaPlayerFormatPurpose,
    MediaPlayerInfo,
    MediaPlayerState,
    SwitchInfo,
    VoiceAssistantFeature,
    VoiceAssistantTimerEventType,
)

from edge_agent.esphome.assistant import MAX_PENDING_CHIMES
from edge_agent.esphome.entities import MEDIA_PLAYER, MUTE
from edge_agent.esphome.service import device_mac
from tests.esphome_support import connected, port_of, run_daemon
from tests.mqtt_support import wait_until


async def _entities(client: APIClient) -> tuple[MediaPlayerInfo, SwitchInfo]:
    entities, _services = await client.list_entities_services()
    player = next(e for e in entities if isinstance(e, MediaPlayerInfo))
    switch = next(e for e in entities if isinstance(e, SwitchInfo))
    return player, switch


def test_home_assistants_client_sees_a_voice_assistant_with_a_media_player_and_a_mute_switch(device):
    async def scenario() -> None:
        async for client in connected(device):
            info = await client.device_info()
            assert info.name == "kitchen" and info.mac_address == device_mac("kitchen")
            flags = VoiceAssistantFeature(info.voice_assistant_feature_flags)
            assert VoiceAssistantFeature.VOICE_ASSISTANT in flags and VoiceAssistantFeature.API_AUDIO in flags
            assert VoiceAssistantFeature.ANNOUNCE in flags and VoiceAssistantFeature.TIMERS in flags
            player, switch = await _entities(client)
            assert player.key == MEDIA_PLAYER and switch.key == MUTE
            # Home Assistant's proxy sends media as FLAC and announcements as WAV.
            formats = {(f.purpose, f.format) for f in player.supported_formats}
            assert formats == {(MediaPlayerFormatPurpose.DEFAULT, "flac"),
                               (MediaPlayerFormatPurpose.ANNOUNCEMENT, "wav")}
            assert player.supports_pause
            config = await client.get_voice_assistant_configuration(5)
            assert config.active_wake_words == ["okay_nabu"]
            assert {w.id for w in config.available_wake_words} >= {"okay_nabu", "hey_jarvis"}

    asyncio.run(scenario())


def test_an_announcement_is_fetched_played_and_answered_finished(device, media, tmp_path: Path):
    url = media.tone("announce.wav", seconds=0.4)

    async def scenario() -> None:
        async for client in connected(device):
            finished = await client.send_voice_assistant_announcement_await_response(url, 30, "Dinner")
            assert finished.success

    asyncio.run(scenario())
    played = sorted((tmp_path / "out").glob("esphome-announce-*.wav"))
    assert len(played) == 1


def test_audio_that_cannot_be_decoded_or_reached_is_refused_at_once_with_an_unsuccessful_finish(
        device, media, caplog):
    (media.root / "answer.mp3").write_bytes(b"ID3\x04" + bytes(2000))

    async def scenario() -> None:
        async for client in connected(device):
            for url in (media.url("answer.mp3"), media.url("missing.wav"), "file:///etc/passwd"):
                finished = await client.send_voice_assistant_announcement_await_response(url, 10)
                assert not finished.success

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    text = caplog.text
    assert "not playable MP3 (libsndfile: " in text and "404" in text and "only http(s)" in text


def test_volume_and_mute_set_in_home_assistant_reach_the_device_and_come_back_as_states(device):
    states: list[Any] = []

    async def scenario() -> None:
        async for client in connected(device):
            player, switch = await _entities(client)
            client.subscribe_states(states.append)
            client.media_player_command(player.key, volume=0.3)
            client.switch_command(switch.key, True)
            async with asyncio.timeout(10):
                while not (device.mic_muted() and abs(device.volume() - 0.3) < 1e-6
                           and any(getattr(s, "state", None) is True and s.key == MUTE for s in states)):
                    await asyncio.sleep(0.02)

    asyncio.run(scenario())
    volumes = [s.volume for s in states if isinstance(s, MediaPlayerEntityState)]
    assert volumes[0] != 0.3 and abs(volumes[-1] - 0.3) < 1e-6
    assert all(s.state is MediaPlayerState.IDLE for s in states if isinstance(s, MediaPlayerEntityState))


def test_a_flood_of_finished_timers_queues_one_chime_per_timer_and_a_few_at_most(device, tmp_path: Path):
    device.announcements.hold()  # nothing plays during the flood: what it queued is what is pending

    async def scenario() -> None:
        async for client in connected(device):
            finished = VoiceAssistantTimerEventType.VOICE_ASSISTANT_TIMER_FINISHED
            for i in range(300):
                client.send_voice_assistant_timer_event(finished, f"t{i % 20}", "pasta", 60, 0, False)
            await client.device_info()  # a round trip: every timer event before it has been handled

    asyncio.run(scenario())
    assert device.esphome is not None
    assert device.esphome.assistant.pending_chimes == MAX_PENDING_CHIMES
    device.announcements.release()
    wait_until(lambda: device.esphome.assistant.pending_chimes == 0, timeout=60, what="the chimes to play")
    assert len(list((tmp_path / "out").glob("esphome-timer-*.wav"))) == MAX_PENDING_CHIMES


def test_a_newer_home_assistant_connection_takes_the_voice_assistant_over(device):
    async def noop(*_: Any) -> None:
        return None

    async def scenario() -> None:
        async for first in connected(device):
            first.subscribe_voice_assistant(handle_start=noop, handle_stop=noop, handle_audio=noop)
            await first.device_info()
            assert device.esphome is not None
            old = device.esphome.assistant.controller
            assert old is not None
            async for second in connected(device):
                second.subscribe_voice_assistant(handle_start=noop, handle_stop=noop, handle_audio=noop)
                await second.device_info()
                new = device.esphome.assistant.controller
                assert new is not None and new is not old
            async with asyncio.timeout(10):  # the newer one left: nobody runs it
                while device.esphome.assistant.controller is not None:
                    await asyncio.sleep(0.02)

    asyncio.run(scenario())


def _raw(port: int, data: bytes) -> bytes:
    """Send `data`, return what the device answers until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(4096):
                got += chunk
        return got


def test_hostile_frames_close_their_connection_and_honest_clients_still_get_in(device, caplog):
    port = port_of(device)
    hello = bytes([0, 0, 1])  # a HelloRequest with an empty payload
    claimed_4gib = bytes([0, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 1])
    endless_varint = bytes([0]) + bytes([0xFF] * 12)
    with caplog.at_level(logging.WARNING):
        assert _raw(port, claimed_4gib) == b""
        assert _raw(port, endless_varint) == b""
        assert _raw(port, bytes([1, 0, 0])) == b""  # a Noise (encrypted) client
        assert _raw(port, bytes([0, 0, 7])) == b""  # a PingRequest before HelloRequest
        assert _raw(port, b"GET / HTTP/1.1\r\n\r\n") == b""
        answered = _raw(port, hello + bytes([0, 0, 5]))  # hello, then a DisconnectRequest
    assert answered.startswith(b"\x00") and b"kitchen" in answered
    for reason in ("at most 65536", "longer than 5 bytes", "encrypted connection", "before HelloRequest",
                   "bad preamble"):
        assert reason in caplog.text

    async def honest() -> None:
        async for client in connected(device):
            assert (await client.device_info()).name == "kitchen"

    asyncio.run(honest())


def test_a_mute_set_elsewhere_reaches_home_assistant_as_the_switch_state(device):
    states: list[Any] = []

    async def scenario() -> None:
        async for client in connected(device):
            client.subscribe_states(states.append)
            await client.device_info()
            device.set_mic_muted(True)  # as the MQTT switch does
            async with asyncio.timeout(10):
                while not any(s.key == MUTE and getattr(s, "state", None) is True for s in states):
                    await asyncio.sleep(0.02)

    asyncio.run(scenario())


def test_a_controller_that_stops_reading_is_closed_before_its_audio_grows_the_device(device):
    from aioesphomeapi import api_pb2 as pb

    from edge_agent.esphome.frames import encode

    assistant = device.esphome.assistant
    with socket.create_connection(("127.0.0.1", port_of(device)), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"".join(encode(pb.HelloRequest(client_info="stalled"),
                                     pb.SubscribeVoiceAssistantRequest(subscribe=True, flags=4))))
        wait_until(lambda: assistant.controller is not None, what="the stalled client to subscribe")
        assistant.begin_turn("c1", "okay_nabu", "Okay Nabu", 0.0)
        second = np.zeros(16000, dtype=np.float32)
        sent = 0
        while assistant.controller is not None and sent < 200:  # 200 s of audio is 6.4 MB
            assistant.audio("c1", second)
            sent += 1
            # The loop runs callbacks in order: once this no-op has run, the audio was written.
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0), device._loop).result(10)
        wait_until(lambda: assistant.controller is None, timeout=20, what="the stalled client to be closed")
    assert sent < 200  # closed at about 1 MiB waiting (and what the kernel's buffers hold), not 6.4 MB


def test_wake_words_chosen_in_home_assistant_are_kept_across_a_restart(tmp_path: Path, broker):
    async def choose(daemon: Any, wake_words: list[str] | None) -> list[str]:
        async for client in connected(daemon):
            if wake_words is not None:
                await client.set_voice_assistant_configuration(wake_words)
                await client.device_info()  # a round trip: the choice has been handled
            return list((await client.get_voice_assistant_configuration(5)).active_wake_words)
        raise AssertionError("not connected")

    for daemon in run_daemon(tmp_path, broker, {}):
        assert asyncio.run(choose(daemon, ["hey_jarvis"])) == ["hey_jarvis"]
        assert daemon.settings.wake.models == ("hey_jarvis",)
    for daemon in run_daemon(tmp_path, broker, {}):  # the same state directory: a restart
        assert daemon.settings.wake.models == ("hey_jarvis",)
        assert asyncio.run(choose(daemon, None)) == ["hey_jarvis"]


def test_the_device_is_advertised_as_home_assistant_discovers_esphome_devices(tmp_path: Path, broker):
    from edge_agent.esphome.service import SERVICE_TYPE
    from tests.mdns_support import browse

    for daemon in run_daemon(tmp_path, broker, {"esphome.zeroconf": True}):
        seen = asyncio.run(browse(SERVICE_TYPE, f"kitchen.{SERVICE_TYPE}", 10))
        assert seen.addresses == ["127.0.0.1"] and seen.port == port_of(daemon)
        # What HA's esphome config flow reads from a discovery: the MAC (its unique id), the name.
        assert seen.properties["mac"] == device_mac("kitchen").replace(":", "")
        assert seen.properties["friendly_name"] == "kitchen" and seen.server == "kitchen.local."
