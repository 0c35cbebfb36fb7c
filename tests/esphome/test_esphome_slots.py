"""Who holds the ESPHome API's connections: Home Assistant gets in whatever else is connected.

Abusers are raw sockets on loopback (silent, or saying Hello and then only pinging);
Home Assistant is aioesphomeapi's `APIClient`. Connections that have not said Hello
hold no slot and have a budget of their own, in count and time; a newcomer that says
Hello when every slot is taken displaces the connection idle the longest with nothing
in flight, which is told so (`DisconnectRequest`) and reads it even while it is still
sending; a refusal reaches a client that is still sending instead of a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aioesphomeapi import APIClient
from aioesphomeapi import api_pb2 as pb

from edge_agent.esphome.frames import encode
from edge_agent.esphome.noise import REQUIRES_ENCRYPTION
from tests.esphome.test_esphome_noise import KEY
from tests.esphome_support import connected, port_of, run_daemon
from tests.mqtt_support import wait_until

HA_WITHIN_S = 2.0
HELLO = b"".join(encode(pb.HelloRequest(client_info="abuser")))
PING = b"".join(encode(pb.PingRequest()))
DISCONNECT_REQUEST = 5
PING_PERIOD_S = 0.02


def _types(data: bytes) -> list[int]:
    """The message types of the plain-text frames in `data` (lengths and types are one byte here)."""
    kinds, i = [], 0
    while i + 3 <= len(data):
        assert data[i] == 0, f"not a plain-text frame at {i}: {data[i:i + 8]!r}"
        kinds.append(data[i + 2])
        i += 3 + data[i + 1]
    return kinds


async def _home_assistant_connects(daemon: Any, key: str | None = None) -> float:
    """Seconds from connecting to the device info answered, as Home Assistant connects."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    async for client in connected(daemon, noise_psk=key):
        client.subscribe_states(lambda state: None)
        assert (await asyncio.wait_for(client.device_info(), 10)).name == "kitchen"
        return loop.time() - started
    raise AssertionError("not connected")


class PingOnly:
    """A client that says Hello and then only pings, reading every answer, until told to go."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.received = b""
        self.stopped = False
        self.ended: str | None = None
        """How the device ended it: 'eof' (a clean end after what it said) or 'reset'."""

    async def start(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(HELLO)
        self.received += await asyncio.wait_for(self.reader.read(256), 10)
        self._task = asyncio.ensure_future(self._ping())

    async def _ping(self) -> None:
        try:
            while not self.stopped:
                self.writer.write(PING)  # keeps sending whatever the device says: the worst case
                data = await asyncio.wait_for(self.reader.read(4096), 10)
                if not data:
                    self.ended = "eof"
                    return
                self.received += data
                await asyncio.sleep(PING_PERIOD_S)  # the client's pace, not a synchronisation
        except ConnectionResetError:
            self.ended = "reset"

    async def close(self) -> None:
        self.stopped = True
        self.writer.transport.abort()  # ends its read at once (a cancel can be lost in 3.11's wait_for)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._task, 10)


def test_home_assistant_gets_in_within_2_s_while_eight_silent_sockets_are_open(device: Any) -> None:
    port = port_of(device)
    server = device.esphome.server
    silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(8)]
    try:
        wait_until(lambda: len(server.greeting) == 8, what="the silent sockets to be accepted")
        took = asyncio.run(_home_assistant_connects(device))
        assert took < HA_WITHIN_S
        # Home Assistant left again; the silent ones never held a slot
        wait_until(lambda: not server.connections, what="Home Assistant's slot to be free")
        assert len(server.greeting) == 8
        assert server.displaced == 0
    finally:
        for sock in silent:
            sock.close()


def test_home_assistant_displaces_one_of_eight_ping_only_clients_which_is_told_and_reads_it(
        device: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = device.esphome.server

    async def scenario() -> None:
        abusers = [PingOnly(port_of(device)) for _ in range(8)]
        for abuser in abusers:
            await abuser.start()
        try:
            assert len(server.connections) == 8 == server.max_connections
            assert await _home_assistant_connects(device) < HA_WITHIN_S
            async with asyncio.timeout(10):
                while not any(a.ended for a in abusers):
                    await asyncio.sleep(0.02)
            assert [a for a in abusers if a.ended] == [abusers[0]]  # idle the longest: pings don't count
            assert DISCONNECT_REQUEST in _types(abusers[0].received)  # told, while it was still sending
            assert abusers[0].ended == "eof"  # then a clean end, not a reset
            assert all(a.ended is None for a in abusers[1:])
        finally:
            for abuser in abusers:
                await abuser.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert server.displaced == 1
    assert "said Hello with all 8 connections taken" in caplog.text and "displaced" in caplog.text


def test_home_assistant_running_the_voice_assistant_is_never_the_one_displaced(device: Any) -> None:
    async def noop(*_: Any) -> None:
        return None

    server = device.esphome.server

    async def scenario() -> None:
        async for client in connected(device):
            client.subscribe_states(lambda state: None)
            client.subscribe_voice_assistant(handle_start=noop, handle_stop=noop, handle_audio=noop)
            await client.device_info()
            controller = device.esphome.assistant.controller
            assert controller is not None
            abusers = [PingOnly(port_of(device)) for _ in range(20)]  # 12 more than the slots
            try:
                for abuser in abusers:
                    await abuser.start()
                assert (await client.device_info()).name == "kitchen"
                assert device.esphome.assistant.controller is controller
                assert controller in server.connections and len(server.connections) == 8
            finally:
                for abuser in abusers:
                    await abuser.close()

    asyncio.run(scenario())
    assert server.displaced == 13


def test_with_a_key_home_assistant_gets_in_behind_eight_keyed_clients_that_only_ping(
        tmp_path: Path, broker: Any) -> None:
    """Eight real aioesphomeapi clients with the key, connected and then idle (their keepalive
    pings only): Home Assistant's client gets in, and the one displaced is told it was asked to go."""
    stops: list[tuple[int, bool]] = []

    def on_stop(n: int) -> Any:
        async def stopped(expected: bool) -> None:
            stops.append((n, expected))
        return stopped

    async def scenario(daemon: Any) -> float:
        idle = [APIClient("127.0.0.1", port_of(daemon), password=None, client_info=f"idle {n}",
                          noise_psk=KEY) for n in range(8)]
        try:
            for n, client in enumerate(idle):
                await asyncio.wait_for(client.connect(on_stop=on_stop(n), login=True), 10)
            assert len(daemon.esphome.server.connections) == 8
            took = await _home_assistant_connects(daemon, KEY)
            async with asyncio.timeout(10):
                while not stops:
                    await asyncio.sleep(0.02)
            return took
        finally:
            for client in idle:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.disconnect(), 5)

    for daemon in run_daemon(tmp_path, broker, {"esphome.encryption_key": KEY}):
        assert asyncio.run(scenario(daemon)) < HA_WITHIN_S
        assert stops[0] == (0, True)  # the longest idle, and it knew it was asked to leave
        assert daemon.esphome.server.displaced == 1


def test_a_flood_before_hello_is_bounded_in_count_and_in_time(tmp_path: Path, broker: Any) -> None:
    overrides = {"esphome.max_handshakes": 4, "esphome.handshake_timeout_s": 1.0}
    for daemon in run_daemon(tmp_path, broker, overrides):
        server = daemon.esphome.server
        port = port_of(daemon)
        flood = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
        try:
            wait_until(lambda s=server: s.evicted == 36, what="the oldest 36 to be closed for newer ones")
            assert len(server.greeting) == 4
            for sock in flood[:36]:  # closed by the device at once (a reset: it had nothing to say)
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(1) == b""
            started = time.monotonic()
            for sock in flood[36:]:  # the last four: closed when their time to say Hello is up
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(1) == b""
            assert time.monotonic() - started < 5.0  # 1 s, not the 90 s idle timeout
            assert asyncio.run(_home_assistant_connects(daemon)) < HA_WITHIN_S
        finally:
            for sock in flood:
                sock.close()


def test_a_flood_before_hello_from_one_address_closes_its_own_connections_not_another_s(
        tmp_path: Path, broker: Any) -> None:
    for daemon in run_daemon(tmp_path, broker, {"esphome.max_handshakes": 4}):
        server = daemon.esphome.server
        port = port_of(daemon)
        other = socket.create_connection(("127.0.0.1", port), timeout=10)  # the oldest of all
        flood = []
        try:
            for _ in range(20):
                sock = socket.socket()
                sock.bind(("127.0.0.2", 0))
                sock.connect(("127.0.0.1", port))
                flood.append(sock)
            wait_until(lambda s=server: s.evicted == 17, what="17 of the flood to be closed")
            assert len(server.greeting) == 4
            assert [c.source for c in server.greeting].count("127.0.0.1") == 1  # still open
            other.sendall(HELLO)  # and it gets its slot
            assert _types(other.recv(256)) == [2]  # HelloResponse
        finally:
            other.close()
            for sock in flood:
                sock.close()


def test_a_refusal_reaches_a_client_that_is_still_sending(tmp_path: Path, broker: Any) -> None:
    """A plain-text client at a keyed device, sending 512 KiB of pings after its Hello: it reads
    the 'requires encryption' frame and a clean end, not a reset that would have destroyed them."""
    stream = HELLO + PING * (512 * 1024 // len(PING))
    for daemon in run_daemon(tmp_path, broker, {"esphome.encryption_key": KEY}):
        with socket.create_connection(("127.0.0.1", port_of(daemon)), timeout=10) as sock:
            sender = threading.Thread(target=_send_all, args=(sock, stream), daemon=True)
            sender.start()
            received = b""
            while chunk := sock.recv(4096):  # a reset here raises ConnectionResetError: the failure
                received += chunk
            sender.join(10)
        assert received == REQUIRES_ENCRYPTION


def _send_all(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the device closes after its linger: the rest is not sent
        sock.sendall(data)
