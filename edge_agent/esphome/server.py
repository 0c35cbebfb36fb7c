"""The ESPHome native API server: Home Assistant's connections to the device.

With `esphome.encryption_key` every connection is encrypted (`noise.py`: the handshake
first, a plain-text client told that the device requires encryption, a wrong key told
so); otherwise plain text (`frames.py`). Each connection must open with `HelloRequest`; the device
answers with its name and API version, then serves device info, the entity list,
states, pings and the voice assistant (`assistant`). At most `max_connections` are
open; one more is refused. A connection whose outgoing data piles up past
`max_buffered_bytes` (a client that stopped reading) is closed: what it costs the
device is bounded whatever it does. Every connection is closed and awaited on `stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

from aioesphomeapi import api_pb2 as pb
from google.protobuf.message import Message

from edge_agent import __version__
from edge_agent.errors import TIMEOUTS
from edge_agent.esphome.assistant import Assistant
from edge_agent.esphome.entities import Entities
from edge_agent.esphome.frames import FrameError, FrameLimits, FrameReader
from edge_agent.esphome.noise import REQUIRES_ENCRYPTION, NoiseFrames, RequiresEncryption, WrongKey

log = logging.getLogger(__name__)

STOP_WAIT_S = 2.0
"""Longest `stop` waits for the clients' transports to close, once their tasks ended."""
API_VERSION = (1, 10)
"""The API version answered in `HelloResponse` (what linux-voice-assistant answers)."""
MANUFACTURER, MODEL = "edge-speech", "edge-agent"


class ApiConnection:
    """One client: its frames in, its messages out."""

    def __init__(self, server: EsphomeServer, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.writer = writer
        self.frames: FrameReader | NoiseFrames = (NoiseFrames(reader, server.limits, server.psk)
                                                  if server.psk else FrameReader(reader, server.limits))
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "a client"
        self.greeted = False
        self.subscribed = False
        """Asked for state updates (`SubscribeStatesRequest`)."""
        self._loop = asyncio.get_running_loop()
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # microphone audio in small frames: no Nagle delay
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def run(self) -> None:
        try:
            if isinstance(self.frames, NoiseFrames):
                self.writer.writelines(await self.frames.handshake(self.server.name, self.server.mac))
            while True:
                message = await self.frames.read()
                if message is not None and not self._handle(message):
                    return
        except EOFError:
            pass
        except RequiresEncryption as exc:
            self.writer.write(REQUIRES_ENCRYPTION)  # the client's helper reports "requires encryption"
            log.warning("esphome: %s: %s", self.peer, exc)
        except WrongKey as exc:
            self.writer.writelines(exc.frames)  # the client reports an invalid encryption key
            log.warning("esphome: %s: %s; connection closed", self.peer, exc)
        except FrameError as exc:
            log.warning("esphome: %s: %s; connection closed", self.peer, exc)
        finally:
            self.server.assistant.detach(self)
            self.writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await self.writer.wait_closed()

    def send(self, *messages: Message) -> bool:
        """Write on the server's loop; a client that stopped reading is closed instead."""
        if self.writer.is_closing():
            return False
        buffered = self.writer.transport.get_write_buffer_size()
        if buffered > self.server.max_buffered_bytes:
            log.warning("esphome: %s stopped reading (%d bytes waiting); connection closed",
                        self.peer, buffered)
            self.writer.transport.abort()
            return False
        self.writer.writelines(self.frames.encode(*messages))
        return True

    def post(self, *messages: Message) -> None:
        """Write from any thread (the hearing loop's, the speaker's)."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to send to
            self._loop.call_soon_threadsafe(self.send, *messages)

    def _handle(self, message: Message) -> bool:
        """Answer one message; False closes the connection."""
        if not self.greeted:
            if not isinstance(message, pb.HelloRequest):
                log.warning("esphome: %s sent %s before HelloRequest; connection closed",
                            self.peer, type(message).__name__)
                return False
            self.greeted = True
            log.info("esphome: %s connected (%s)", self.peer, message.client_info[:64])
            return self.send(pb.HelloResponse(api_version_major=API_VERSION[0],
                                              api_version_minor=API_VERSION[1],
                                              server_info=f"edge-speech {__version__}",
                                              name=self.server.name))
        server, assistant = self.server, self.server.assistant
        if isinstance(message, pb.AuthenticationRequest):
            return self.send(pb.AuthenticationResponse())
        if isinstance(message, pb.DisconnectRequest):
            self.send(pb.DisconnectResponse())
            return False
        if isinstance(message, pb.PingRequest):
            return self.send(pb.PingResponse())
        if isinstance(message, pb.DeviceInfoRequest):
            return self.send(server.device_info())
        if isinstance(message, pb.ListEntitiesRequest):
            return self.send(*server.entities.descriptions(), pb.ListEntitiesDoneResponse())
        if isinstance(message, pb.SubscribeStatesRequest):
            self.subscribed = True
            return self.send(*server.entities.states())
        if isinstance(message, pb.SwitchCommandRequest):
            server.entities.switch(message)
        elif isinstance(message, pb.MediaPlayerCommandRequest):
            if message.has_media_url and message.media_url:
                assistant.play_media(self, message.media_url)
            else:
                server.entities.media(message)
        else:
            assistant.handle(self, message)
        return not self.writer.is_closing()


class EsphomeServer:
    """The listening socket, its connections and what they share."""

    def __init__(self, name: str, host: str, port: int, assistant: Assistant, entities: Entities, *,
                 mac: str, limits: FrameLimits | None = None, max_connections: int = 8,
                 max_buffered_bytes: int = 1 << 20, psk: bytes | None = None) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.mac = mac
        self.assistant = assistant
        self.entities = entities
        self.limits = limits or FrameLimits()
        self.max_connections = max_connections
        self.max_buffered_bytes = max_buffered_bytes
        self.psk = psk
        """The Noise pre-shared key (`esphome.encryption_key`); None: plain text."""
        self.connections: set[ApiConnection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        entities.publish = self._publish

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("esphome: API on %s port %d", self.host, self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if server is not None:
            # From Python 3.12.1 `wait_closed` also waits for every client's transport: bounded.
            with contextlib.suppress(*TIMEOUTS):
                await asyncio.wait_for(server.wait_closed(), STOP_WAIT_S)

    def device_info(self) -> pb.DeviceInfoResponse:
        return pb.DeviceInfoResponse(
            name=self.name, friendly_name=self.name, mac_address=self.mac, esphome_version="2025.9.0",
            model=MODEL, manufacturer=MANUFACTURER, project_name="edge-speech.edge-agent",
            project_version=__version__, voice_assistant_feature_flags=self.assistant.features(),
            api_encryption_supported=self.psk is not None)

    def _publish(self, message: Message) -> None:
        """A state change, to every subscribed connection (any thread)."""
        for connection in list(self.connections):
            if connection.subscribed:
                connection.post(message)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.connections) >= self.max_connections:
            log.warning("esphome: more than %d connections; one refused", self.max_connections)
            writer.close()
            return
        connection = ApiConnection(self, reader, writer)
        task = asyncio.current_task()
        self.connections.add(connection)
        if task is not None:
            self._tasks.add(task)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
            if task is not None:
                self._tasks.discard(task)
