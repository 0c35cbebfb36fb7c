"""The ESPHome native API server: Home Assistant's connections to the device.

With `esphome.encryption_key` every connection is encrypted (`noise.py`: the handshake
first, a plain-text client told that the device requires encryption, a wrong key told
so); otherwise plain text (`frames.py`). Each connection must open with `HelloRequest`; the device
answers with its name and API version, then serves device info, the entity list,
states, pings and the voice assistant (`assistant`).

Who holds what (so that Home Assistant always gets in, whatever else connects):

- **Before Hello** a connection holds no slot. Connections that have not said Hello yet
  (and, with a key, finished the Noise handshake, which proves the key) have a budget of
  their own, `max_handshakes` at a time and `handshake_timeout_s` each: a newcomer past
  the budget closes the oldest of them from the address holding the most, and one that
  has not said Hello in time is closed. A socket that connects and says nothing costs a
  budget entry for a few seconds, never a slot.
- **After Hello** a connection takes one of `max_connections` slots. When they are all
  taken, the newcomer gets in and the connection that costs least to lose goes: one
  with nothing in flight (not running the voice assistant, no announcement of its
  waiting for its `VoiceAssistantAnnounceFinished`) before one with something, one not
  subscribed to states before one that is (Home Assistant always subscribes), then the
  one idle the longest (a ping is not activity). It is told with a `DisconnectRequest`,
  which Home Assistant's client answers and reconnects after; each displacement is logged.

A connection ended by the device after telling it something (a refusal, a
`DisconnectRequest`, the answer to the client's own `DisconnectRequest`) is half-closed
and what the client still sends is dropped for a moment before the close
(`edge_agent.netclose`): closing with unread data would reset the connection, and the
client would lose what it was told. A connection whose outgoing data piles up past
`max_buffered_bytes` (a client that stopped reading) is closed: what it costs the
device is bounded whatever it does. Every connection is closed and awaited on `stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import Counter

from aioesphomeapi import api_pb2 as pb
from google.protobuf.message import Message

from edge_agent import __version__, netclose
from edge_agent.errors import TIMEOUTS
from edge_agent.esphome.assistant import Assistant
from edge_agent.esphome.entities import Entities
from edge_agent.esphome.frames import FrameError, FrameLimits, FrameReader
from edge_agent.esphome.noise import REQUIRES_ENCRYPTION, NoiseFrames, RequiresEncryption, WrongKey
from edge_agent.logs import Throttle

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
        self.reader = reader
        self.writer = writer
        self.frames: FrameReader | NoiseFrames = (NoiseFrames(reader, server.limits, server.psk)
                                                  if server.psk else FrameReader(reader, server.limits))
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "a client"
        self.source = str(peer[0]) if isinstance(peer, tuple) else ""
        """The peer's address: a flood before Hello closes its own connections first."""
        self._loop = asyncio.get_running_loop()
        self.deadline = self._loop.time() + server.handshake_timeout_s
        """Loop time by which the client must have said Hello (after the Noise handshake, if keyed)."""
        self.greeted = False
        self.subscribed = False
        """Asked for state updates (`SubscribeStatesRequest`)."""
        self.last_active = self._loop.time()
        """When the client last sent a message other than a ping."""
        self.announcing = 0
        """Announcements it asked for whose `VoiceAssistantAnnounceFinished` has not been sent."""
        self.leaving = False
        """Displaced or evicted by the server: being closed."""
        self._ending = False
        """Its task is closing it: nothing more is written."""
        self._task = asyncio.current_task()
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # microphone audio in small frames: no Nagle delay
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def in_flight(self) -> bool:
        """Whether closing it would cut work short: it runs the voice assistant, or waits for an
        announcement of its to finish."""
        return self.server.assistant.controller is self or self.announcing > 0

    async def run(self) -> None:
        hang_up = False
        try:
            if not self._greet(await self._hello()):
                return
            while True:
                message = await self.frames.read()
                if self.leaving:  # displaced as this frame came in (a cancel `wait_for` lost, 3.11)
                    hang_up = True
                    return
                if message is not None and not self._handle(message):
                    hang_up = self._ending
                    return
        except EOFError:
            pass
        except RequiresEncryption as exc:
            self.writer.write(REQUIRES_ENCRYPTION)  # the client's helper reports "requires encryption"
            self.server.handshake_failed(self, exc)
            hang_up = True
        except WrongKey as exc:
            self.writer.writelines(exc.frames)  # the client reports an invalid encryption key
            self.server.handshake_failed(self, exc)
            hang_up = True
        except FrameError as exc:
            if not self.greeted:
                self.server.handshake_failed(self, exc)
            else:
                log.warning("esphome: %s: %s; connection closed", self.peer, exc)
        except asyncio.CancelledError:
            if not self.leaving or self.server.stopping or self._task is None:
                raise
            uncancel = getattr(self._task, "uncancel", None)  # Python 3.11 and later
            if uncancel is not None:
                uncancel()  # the server's own cancel: displaced, told so, hung up below
            hang_up = True
        finally:
            self._ending = True
            self.server.assistant.detach(self)
            if self.greeted:
                self.server.release(self)  # a slot is free at once; the hang-up below holds none
            try:
                if hang_up:
                    await netclose.hang_up(self.reader, self.writer)
            finally:
                if not self.greeted:
                    self.server.release(self)  # a refused handshake lingers inside the budget
                await netclose.close(self.writer)

    async def _hello(self) -> Message | None:
        """The Noise handshake when keyed, then the first message, all within `handshake_timeout_s`
        of connecting (one deadline for the whole, not one per read)."""

        async def hello() -> Message | None:
            if isinstance(self.frames, NoiseFrames):
                self.writer.writelines(await self.frames.handshake(self.server.name, self.server.mac))
            return await self.frames.read()

        try:
            return await asyncio.wait_for(hello(), max(0.0, self.deadline - self._loop.time()))
        except TIMEOUTS:
            raise FrameError(f"no HelloRequest within {self.server.handshake_timeout_s:g} s of "
                             "connecting") from None

    def displace(self) -> None:
        """Make room for a newer connection: tell the client, then end this one (its task hangs up)."""
        if self.leaving or self._ending:
            return
        self.leaving = True
        self.send(pb.DisconnectRequest())  # the client answers, closes, and may come back
        if self._task is not None:
            self._task.cancel()

    def evict(self) -> None:
        """Close a connection that has not said Hello, to make room for a newer one."""
        self.leaving = True
        self.writer.transport.abort()

    def send(self, *messages: Message) -> bool:
        """Write on the server's loop; a client that stopped reading is closed instead."""
        if self._ending or self.writer.is_closing():
            return False
        buffered = self.writer.transport.get_write_buffer_size()
        if buffered > self.server.max_buffered_bytes:
            log.warning("esphome: %s stopped reading (%d bytes waiting); connection closed",
                        self.peer, buffered)
            self.writer.transport.abort()
            return False
        for message in messages:
            if isinstance(message, pb.VoiceAssistantAnnounceFinished) and self.announcing:
                self.announcing -= 1  # an answer's finish counts down too: at worst one ends early
        self.writer.writelines(self.frames.encode(*messages))
        return True

    def post(self, *messages: Message) -> None:
        """Write from any thread (the hearing loop's, the speaker's)."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to send to
            self._loop.call_soon_threadsafe(self.send, *messages)

    def _greet(self, message: Message | None) -> bool:
        """The first message, which must be `HelloRequest`: the client takes a slot; False closes it."""
        if not isinstance(message, pb.HelloRequest):
            kind = type(message).__name__ if message is not None else "an unknown message"
            log.warning("esphome: %s sent %s before HelloRequest; connection closed", self.peer, kind)
            return False
        self.greeted = True
        self.server.admit(self)
        log.info("esphome: %s connected (%s)", self.peer, message.client_info[:64])
        return self.send(pb.HelloResponse(api_version_major=API_VERSION[0],
                                          api_version_minor=API_VERSION[1],
                                          server_info=f"edge-speech {__version__}",
                                          name=self.server.name))

    def _handle(self, message: Message) -> bool:
        """Answer one message; False closes the connection (hung up when `_ending` is set)."""
        server, assistant = self.server, self.server.assistant
        if isinstance(message, pb.PingRequest):  # not activity: a ping-only client stays idle
            return self.send(pb.PingResponse())
        self.last_active = self._loop.time()
        if isinstance(message, pb.AuthenticationRequest):
            return self.send(pb.AuthenticationResponse())
        if isinstance(message, pb.DisconnectRequest):
            self.send(pb.DisconnectResponse())
            self._ending = True
            return False
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
                assistant.play_media(self, message.media_url,
                                     announcement=message.has_announcement and message.announcement)
            else:
                server.entities.media(message)
        else:
            if isinstance(message, pb.VoiceAssistantAnnounceRequest):
                self.announcing += 1
            assistant.handle(self, message)
        return not self.writer.is_closing()


class EsphomeServer:
    """The listening socket, its connections and what they share."""

    def __init__(self, name: str, host: str, port: int, assistant: Assistant, entities: Entities, *,
                 mac: str, limits: FrameLimits | None = None, max_connections: int = 8,
                 max_handshakes: int = 128, handshake_timeout_s: float = 10.0,
                 max_buffered_bytes: int = 1 << 20, psk: bytes | None = None) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.mac = mac
        self.assistant = assistant
        self.entities = entities
        self.limits = limits or FrameLimits()
        self.max_connections = max_connections
        self.max_handshakes = max_handshakes
        self.handshake_timeout_s = handshake_timeout_s
        self.max_buffered_bytes = max_buffered_bytes
        self.psk = psk
        """The Noise pre-shared key (`esphome.encryption_key`); None: plain text."""
        self.connections: set[ApiConnection] = set()
        """The connections that said Hello, each holding one of `max_connections` slots."""
        self.greeting: dict[ApiConnection, None] = {}
        """The connections that have not said Hello yet, oldest first (at most `max_handshakes`)."""
        self.displaced = 0
        """Connections closed to give their slot to a newer one."""
        self.evicted = 0
        """Connections closed before their Hello to make room for a newer one."""
        self.stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._evict_log = Throttle(10.0)
        entities.publish = self._publish

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("esphome: API on %s port %d", self.host, self.port)

    async def stop(self) -> None:
        self.stopping = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await _cancel_all(set(self._tasks), STOP_WAIT_S)
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

    def admit(self, connection: ApiConnection) -> None:
        """`connection` said Hello: it takes a slot, displacing the connection that costs least to
        lose when all are taken (the newest always gets in: it may be Home Assistant coming back)."""
        self.greeting.pop(connection, None)
        if len(self.connections) >= self.max_connections:
            now = asyncio.get_running_loop().time()
            victim = min(self.connections, key=lambda c: (c.in_flight(), c.subscribed, c.last_active))
            self.displaced += 1
            log.warning("esphome: %s said Hello with all %d connections taken: %s displaced "
                        "(idle %.1f s%s%s)", connection.peer, self.max_connections, victim.peer,
                        now - victim.last_active,
                        ", subscribed to states" if victim.subscribed else "",
                        ", with work in flight" if victim.in_flight() else "")
            self.connections.discard(victim)
            victim.displace()
        self.connections.add(connection)

    def release(self, connection: ApiConnection) -> None:
        """`connection` is closing: whatever it held is free."""
        self.connections.discard(connection)
        self.greeting.pop(connection, None)

    def handshake_failed(self, connection: ApiConnection, exc: FrameError) -> None:
        """Log a connection that ended before its Hello (one closed for a newer one is counted in
        `evicted` instead: a flood would log a line for each)."""
        if not connection.leaving:
            log.warning("esphome: %s: %s; connection closed", connection.peer, exc)

    def _evict(self, newcomer: ApiConnection) -> None:
        """Close the oldest connection before Hello of the address holding the most of them: a flood
        from a few addresses closes its own, not Home Assistant's between its connect and its Hello
        (the offload server's handshake admission, with one stage)."""
        held = Counter(c.source for c in self.greeting)  # oldest first: ties go to the oldest's address
        source = max(held, key=held.__getitem__)
        victim = next(c for c in self.greeting if c.source == source and c is not newcomer)
        del self.greeting[victim]
        self.evicted += 1
        victim.evict()
        if self._evict_log.ready():
            also = self._evict_log.take_suppressed()
            log.warning("esphome: %d connections have not said Hello; the oldest from %s (%s) closed for "
                        "a newer one%s", self.max_handshakes, source, victim.peer,
                        f" ({also} more in the last {self._evict_log.interval_s:g} s)" if also else "")

    def _publish(self, message: Message) -> None:
        """A state change, to every subscribed connection (any thread)."""
        for connection in list(self.connections):
            if connection.subscribed:
                connection.post(message)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.stopping:  # accepted just before the listener closed
            writer.transport.abort()
            return
        connection = ApiConnection(self, reader, writer)
        self.greeting[connection] = None
        while len(self.greeting) > self.max_handshakes:
            self._evict(connection)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await connection.run()
        finally:
            self.release(connection)
            if task is not None:
                self._tasks.discard(task)


async def _cancel_all(tasks: set[asyncio.Task[None]], timeout_s: float) -> None:
    """Cancel `tasks` and wait, at most `timeout_s`, for them to end.

    On Python < 3.12 `asyncio.wait_for` swallows a cancel that lands as its inner read completes
    (a peer sending just then), and the task reads on until the idle timeout (90 s): so the
    cancel is repeated until each task has ended, and the wait is bounded either way.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = tasks
    while pending and (left := deadline - loop.time()) > 0:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(left, 0.2))
    if pending:
        log.warning("esphome: %d connection(s) did not end within %g s of the stop", len(pending),
                    timeout_s)
