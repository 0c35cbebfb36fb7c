"""The Wyoming server: connections, limits, and handing each event to the service it belongs to.

Each connection runs one task that reads an event, carries it out, and reads the
next: a client's requests are answered in order, and while one is being carried
out the socket's buffers hold what the client sends next (backpressure, no queue
of ours to grow). What a connection may cost is bounded: every event's header,
data and payload length checked before it is read, a deadline for a silent peer
(`idle_timeout_s`), for a started event and for every write (`event_timeout_s`),
wake word audio heard at most `max_wake_speed` times real time, and
`max_connections` at a time. When they are all taken, a newcomer displaces the
connection idle the longest that has nothing in flight (a ping is not activity;
a request being carried out, a stream whose events keep coming, or Home
Assistant's satellite link is in flight); when none qualifies, the newcomer gets
an `error` event, code `busy`.

A refusal ends the connection: the client gets one `error` event, then the end of
the stream. Home Assistant's TTS and STT clients ignore `error` events and stop
only on `audio-stop`, `transcript` or a closed connection, so an error on a
connection left open kept them waiting until a timeout; and what the client was
still sending for the refused request (the rest of an audio stream) is read and
dropped, not answered with an error each. Framing violations end it the same way.
The one exception is Home Assistant running the device's satellite: refused audio
there is dropped by the satellite (the rest of that stream too) and the link to
Home Assistant stays up. Nothing one connection does reaches another.

Unknown event types are ignored, as the protocol asks, so newer clients work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Info
from wyoming.ping import Pong

from edge_agent.errors import TIMEOUTS
from edge_agent.netclose import close, hang_up
from edge_agent.wyoming import tts
from edge_agent.wyoming.asr import AsrService, AsrSession
from edge_agent.wyoming.audio import Refused
from edge_agent.wyoming.framing import EventReader, FramingError, Limits, write_event
from edge_agent.wyoming.satellite import SatelliteService, SatelliteSession
from edge_agent.wyoming.settings import WyomingSettings
from edge_agent.wyoming.tts import TtsService, TtsSession
from edge_agent.wyoming.wake import WakeService, WakeSession

log = logging.getLogger(__name__)

AUDIO_EVENTS = frozenset({"audio-start", "audio-chunk", "audio-stop"})
LINGER_S = 10.0
"""After an `error` that ends a connection: longest time what the client still sends is read and
dropped, waiting for the end of its stream (`netclose.hang_up`). A live stream (a microphone at
real time) goes on until its sender stops it; one second was not enough, and the reset that
followed it destroyed the `audio-too-long` the client had not read yet."""
LINGER_BYTES = 32 << 20
"""... and most bytes dropped then (a client flooding past them is reset): 17 minutes of 16 kHz
audio, at a cost of 512 reads of 64 KiB."""
LINGER_MAX = 64
"""Connections lingering at once (they no longer count against `max_connections`); past it a
refused connection is closed at once."""
DISPLACE_WAIT_S = 2.0
"""Longest wait for a displaced connection to finish closing."""


@dataclass
class ServerStats:
    """Counts since the server started."""

    connections: int = 0
    refused_busy: int = 0
    displaced: int = 0
    framing_errors: int = 0
    refused_requests: int = 0
    failures: int = 0
    by_code: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Services:
    """What the server offers; absent services are left out of `info`."""

    tts: TtsService | None = None
    asr: AsrService | None = None
    wake: WakeService | None = None
    satellite: SatelliteService | None = None
    """Only inside `edge-agent run`: the device's microphone and speaker for Home Assistant."""


STOP_WAIT_S = 2.0
"""Longest `stop` waits for the listening socket's clients to be closed, once their tasks ended."""


class WyomingServer:
    """Serves `Services` over TCP."""

    def __init__(self, services: Services, settings: WyomingSettings) -> None:
        self.services = services
        self.settings = settings
        self.limits = Limits.from_settings(settings)
        self.stats = ServerStats()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        """Every connection's task, counted or not: `stop` ends and awaits them all."""
        self._open: dict[asyncio.Task[None], Connection] = {}
        """The connections counted against `max_connections`."""
        self.stopping = False
        """Set by `stop`: every connection ends at its next read or write."""
        self._lingering = 0

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on `host:port` (0 picks a free port); returns the address bound."""
        # The stream's limit caps an event's header line (see framing.EventReader).
        self._server = await asyncio.start_server(self._accept, host, port, limit=self.limits.header_bytes)
        sock = self._server.sockets[0].getsockname()
        log.info("wyoming server listening on %s:%d", sock[0], sock[1])
        return str(sock[0]), int(sock[1])

    async def stop(self) -> None:
        """Stop listening, close every connection (its client sees the end of the stream) and wait
        for each connection's task to finish."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            # From Python 3.12.1 `wait_closed` also waits for every client's transport, and one
            # still closing (a refused stream's linger) held a stop for good on 3.13: close them
            # (3.13 has the call) and wait a bounded time.
            close_clients = getattr(self._server, "close_clients", None)
            if close_clients is not None:
                close_clients()
            with contextlib.suppress(Exception, *TIMEOUTS):
                await asyncio.wait_for(self._server.wait_closed(), STOP_WAIT_S)

    @property
    def connections(self) -> int:
        return len(self._open)

    def info(self) -> Info:
        s = self.services
        return Info(tts=[tts.program(s.tts.voices())] if s.tts else [],
                    asr=[s.asr.program()] if s.asr else [],
                    wake=[s.wake.program()] if s.wake else [],
                    satellite=s.satellite.info() if s.satellite else None)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """asyncio's callback for a new connection: serves it in a task of ours.

        Not a coroutine on purpose: `start_server` wraps a coroutine callback in a task whose
        done-callback calls `task.exception()`, which raises on a cancelled task, so stopping the
        server with clients connected logged a CancelledError traceback at ERROR (Python 3.11)."""
        if self.stopping:  # accepted just as the server was closing
            writer.close()
            return
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = _peer(writer)
        hang_up = False
        try:
            if not await self._make_room(peer):
                self.stats.refused_busy += 1
                log.warning("wyoming connection from %s refused: %d connections open, all of them working",
                            peer, len(self._open))
                with contextlib.suppress(Exception):
                    await write_event(writer, Error(text="server busy", code="busy").event(), 1.0)
                hang_up = True
                return
            connection = Connection(self, reader, writer, peer)
            self._open[task] = connection
            self.stats.connections += 1
            try:
                hang_up = await connection.run()
            finally:
                del self._open[task]
        finally:
            if hang_up:
                await self._hang_up(reader, writer, peer)
            await close(writer)

    async def _hang_up(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> None:
        """End our side after an `error` event; what the client still sends is read and dropped,
        so that the error reaches it rather than a reset (`netclose.hang_up`)."""
        if self._lingering >= LINGER_MAX:
            log.debug("wyoming client %s closed without lingering: %d connections linger", peer,
                      self._lingering)
            return
        self._lingering += 1
        try:
            if not (await hang_up(reader, writer, linger_s=LINGER_S, linger_bytes=LINGER_BYTES)).ended:
                log.debug("wyoming client %s still sending after %g s or %d bytes: reset", peer,
                          LINGER_S, LINGER_BYTES)
        finally:
            self._lingering -= 1

    async def _make_room(self, peer: str) -> bool:
        """True when a connection may be opened: below `max_connections`, or once the connection idle
        the longest with nothing in flight has been displaced."""
        loop = asyncio.get_running_loop()
        # Checked again after each displacement: another newcomer may have taken the slot meanwhile.
        while len(self._open) >= self.settings.max_connections:
            now = loop.time()
            idle = [(c.last_active, task, c) for task, c in self._open.items()
                    if not c.leaving and not c.in_flight(now)]
            if not idle:
                return False
            _, task, victim = min(idle, key=lambda entry: entry[0])
            self.stats.displaced += 1
            log.warning("wyoming connection from %s displaces %s (idle %.1f s; %d connections open)",
                        peer, victim.peer, now - victim.last_active, len(self._open))
            await victim.displace(task)
        return True


class Connection:
    """One client: its sessions with each service, and the order its events are carried out in."""

    def __init__(self, server: WyomingServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 peer: str) -> None:
        self.server = server
        self.events = EventReader(reader, server.limits)
        self.writer = writer
        self.peer = peer
        self._write_lock = asyncio.Lock()
        services = server.services
        self.tts: TtsSession | None = services.tts.session(self.send) if services.tts else None
        self.asr: AsrSession | None = services.asr.session(self.send) if services.asr else None
        self.wake: WakeSession | None = services.wake.session(self.send) if services.wake else None
        self.satellite: SatelliteSession | None = (services.satellite.session(self.send, peer)
                                                   if services.satellite else None)
        self._audio_to: AsrSession | WakeSession | None = self.asr or self.wake
        """Who the client's audio is for: the service of its last `transcribe` or `detect`."""
        self.last_active = asyncio.get_running_loop().time()
        """When the client last sent an event other than `ping`, or a request of its was finished."""
        self.working = False
        """An event of the client's is being carried out."""
        self.leaving = False
        """Being displaced: not a candidate again."""

    def in_flight(self, now: float) -> bool:
        """Whether closing this connection would cut work short: a request being carried out, a
        stream (audio, streamed text) whose events are still coming (one silent for
        `event_timeout_s` is stalled, not in flight), or Home Assistant running the satellite."""
        if self.working or (self.satellite is not None and self.satellite.running):
            return True
        sessions: tuple[TtsSession | AsrSession | WakeSession | None, ...] = (self.tts, self.asr, self.wake)
        streaming = any(session is not None and session.streaming for session in sessions)
        return streaming and now - self.last_active < self.server.limits.event_timeout_s

    @property
    def ending(self) -> bool:
        """Being closed (displaced, or the server stopping).

        Cancelling the connection's task ends it; this ends it too where a cancellation is lost:
        `asyncio.wait_for` before Python 3.12 drops one that arrives just as its inner await
        completes (a read that has its data, a write that went out), and the connection would
        carry on with its request. Cancelling it again instead could cut short its cleanup (the
        close of a synthesis under way)."""
        return self.leaving or self.server.stopping

    async def displace(self, task: asyncio.Task[None]) -> None:
        """Make room for a newcomer: tell the client, end this connection and wait until it has."""
        self.leaving = True
        with contextlib.suppress(Exception):
            text = "server full: the connection idle the longest was closed"
            await write_event(self.writer, Error(text=text, code="displaced").event(), 1.0)
        task.cancel()
        await asyncio.wait({task}, timeout=DISPLACE_WAIT_S)

    async def send(self, event: Event) -> None:
        if self.ending:
            raise ConnectionAbortedError("connection closed by the server")
        async with self._write_lock:
            await write_event(self.writer, event, self.server.limits.event_timeout_s)

    async def run(self) -> bool:
        """Carry out the client's events until it leaves; True when the server ends the connection
        after an `error` event (see `WyomingServer._hang_up`)."""
        log.debug("wyoming client %s connected", self.peer)
        stats = self.server.stats
        loop = asyncio.get_running_loop()
        try:
            while not self.ending and (event := await self.events.read()) is not None:
                for_satellite = self.satellite is not None and self.satellite.takes(event.type)
                self.working = True
                try:
                    await self.handle(event, for_satellite)
                except Refused as exc:
                    stats.refused_requests += 1
                    stats.by_code[exc.code] = stats.by_code.get(exc.code, 0) + 1
                    log.warning("wyoming %s from %s refused: %s", event.type, self.peer, exc)
                    await self.send(Error(text=str(exc), code=exc.code).event())
                    if not for_satellite:
                        return True
                finally:
                    self.working = False
                    if event.type != "ping":  # a ping is not activity: idle counts on through it
                        self.last_active = loop.time()
            return False
        except FramingError as exc:
            stats.framing_errors += 1
            stats.by_code[exc.code] = stats.by_code.get(exc.code, 0) + 1
            log.warning("wyoming client %s dropped: %s", self.peer, exc)
            if exc.code == "write-timeout":
                return False  # it reads nothing: no error event, no lingering
            with contextlib.suppress(Exception):
                await write_event(self.writer, Error(text=str(exc), code=exc.code).event(), 1.0)
            return True
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            log.debug("wyoming client %s went away: %s", self.peer, exc)
            return False
        except Exception as exc:  # one connection's failure must not reach the server
            stats.failures += 1
            log.exception("wyoming connection %s failed", self.peer)
            with contextlib.suppress(Exception):
                await write_event(self.writer, Error(text=_first_line(exc), code="internal").event(), 1.0)
            return True
        finally:
            if self.satellite is not None:
                await self.satellite.close()
            if self.wake is not None:
                await self.wake.close()
            log.debug("wyoming client %s disconnected", self.peer)

    async def handle(self, event: Event, for_satellite: bool = False) -> None:
        """Carry out one event; `for_satellite`: Home Assistant driving the satellite sent it."""
        kind = event.type
        if for_satellite and self.satellite is not None:
            await self.satellite.handle(event)  # not a service request
        elif kind == "describe":
            await self.send(self.server.info().event())
        elif kind == "ping":
            await self.send(Pong(text=event.data.get("text")).event())
        elif kind in tts.EVENTS and self.tts is not None:
            await self.tts.handle(event)
        elif kind == "transcribe" and self.asr is not None:
            self.asr.transcribe(event)
            self._audio_to = self.asr
        elif kind == "detect" and self.wake is not None:
            self.wake.detect(event)
            self._audio_to = self.wake
        elif kind in AUDIO_EVENTS:
            await self._audio(event)
        else:
            log.debug("wyoming %s from %s ignored", kind, self.peer)

    async def _audio(self, event: Event) -> None:
        target = self._audio_to
        if target is None:
            raise Refused("this server takes no audio", "no-service")
        if event.type == "audio-start":
            await target.audio_start(event)
        elif event.type == "audio-chunk":
            await target.audio_chunk(event)
        else:
            await target.audio_stop()


def _peer(writer: asyncio.StreamWriter) -> str:
    name = writer.get_extra_info("peername")
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{name[0]}:{name[1]}"
    return str(name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
