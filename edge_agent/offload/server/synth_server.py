"""`edge-agent serve`: many devices, one heavy voice, one asyncio loop, synthesis in threads."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_agent import __version__
from edge_agent.errors import TIMEOUTS, ConfigError
from edge_agent.logs import Throttle
from edge_agent.offload.server.admission import HandshakeSlots
from edge_agent.offload.server.scheduler import (
    FIRST_AUDIO_BUDGET_S,
    DeadlineMissed,
    Scheduler,
    SentenceResult,
    StreamCancelled,
    Ticket,
    sentence_work,
)
from edge_agent.offload.server.server_metrics import ServerMetrics
from edge_agent.offload.settings import ServerSettings
from edge_agent.offload.wire import auth
from edge_agent.offload.wire.codecs import OPUS_RATES, SentenceEncoder, available_codecs, opus_rate
from edge_agent.offload.wire.framing import (
    HARD_MAX_PAYLOAD,
    AuthenticationFailed,
    BadStreamId,
    ErrorCode,
    MalformedPayload,
    ProtocolError,
    UnexpectedMessage,
)
from edge_agent.offload.wire.messages import (
    MAC_SIZE,
    Audio,
    Auth,
    Cancel,
    Challenge,
    Codec,
    End,
    Error,
    Format,
    GoAway,
    Hello,
    Load,
    Ping,
    Pong,
    Synth,
    VoiceInfo,
    Welcome,
    codec_mask,
    codecs_in,
)
from edge_agent.offload.wire.transport import ConnectionClosed, FramedConnection, cancel_and_wait
from edge_agent.tts.voice import Voice

log = logging.getLogger(__name__)

MIN_PEER_FRAME = 1024
_AUDIO_HEADER = 6
LATE_GRACE_S = 2.0
"""A chunk that cannot even be queued this long after its playback deadline (the client stopped
reading) ends its stream: what is left of it is dropped, not synthesized, and not held."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_key(settings: ServerSettings, psk: bytes | None) -> None:
    """Refuse to run without a key, except in explicit insecure mode on loopback."""
    if psk is not None:
        return
    if not settings.insecure:
        raise ConfigError(f"server: no pre-shared key (set server.psk_file or ${auth.PSK_ENV}); "
                          "to run without one on loopback only, set server.insecure: true")
    if not is_loopback(settings.host):
        raise ConfigError(f"server.insecure: only allowed on a loopback address, not {settings.host!r}")


FILES_BESIDES_CONNECTIONS = 64
"""Open files a server needs besides its sockets (models, logs, the listener, the metrics port)."""


def raise_file_limit(needed: int) -> None:
    """Raise the soft limit on open files to `needed`, as far as the hard limit allows: every
    connection, half-open ones included, holds a descriptor, and a budget the limit cannot hold
    would fail accepts (asyncio then stops accepting for a second) long before it is full."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        log.warning("open-file limit is %d, below the %d that server.max_connections and twice "
                    "server.max_handshakes may need: raise it (systemd: LimitNOFILE)", target, needed)


@dataclass
class _Stream:
    id: int
    ticket: Ticket
    task: asyncio.Task[None] | None = None


class SynthServer:
    """The synthesis server; `start`, then `shutdown` (also what SIGTERM triggers)."""

    def __init__(self, settings: ServerSettings, voices: Mapping[str, Voice], psk: bytes | None, *,
                 tls: ssl.SSLContext | None = None, metrics: ServerMetrics | None = None) -> None:
        check_key(settings, psk)
        if not voices:
            raise ConfigError("server.voices: no voice loaded")
        self.settings = settings
        self.voices = dict(voices)
        self.default_voice = next(iter(self.voices))
        self.psk = psk
        self.tls = tls
        self.codecs = available_codecs()
        self.metrics = metrics or ServerMetrics()
        self.scheduler = Scheduler(settings.workers, self.metrics)
        self._server: asyncio.Server | None = None
        self._sessions: set[_Session] = set()
        """Every open connection's session."""
        self._handshaking: HandshakeSlots[_Session] = HandshakeSlots(settings.max_handshakes,
                                                                     settings.max_handshakes_per_source)
        """Sessions still in their handshake, and whom to close when there are too many."""
        self._handlers: set[asyncio.Task[Any]] = set()
        self._handshake_log = Throttle(10.0)
        """Every connection handler still running: shutdown waits for them all."""
        self._authenticated = 0
        self._idle = asyncio.Event()
        self._no_sessions = asyncio.Event()
        self.draining = False
        self.address: tuple[str, int] = (settings.host, settings.port)

    @property
    def voice_infos(self) -> tuple[VoiceInfo, ...]:
        return tuple(VoiceInfo(k, v.sample_rate) for k, v in self.voices.items())

    async def start(self) -> tuple[str, int]:
        """Listen; returns the bound (host, port) (port 0 picks a free one)."""
        s = self.settings
        raise_file_limit(s.max_connections + 2 * s.max_handshakes + FILES_BESIDES_CONNECTIONS)
        self.scheduler.start()
        self._idle.set()
        self._no_sessions.set()
        try:
            self._server = await asyncio.start_server(
                self._accept, self.settings.host, self.settings.port, ssl=self.tls,
                ssl_handshake_timeout=self.settings.handshake_timeout_s if self.tls else None,
                limit=64 * 1024)
        except OSError as exc:
            raise ConfigError(f"server: cannot listen on {self.settings.host}:{self.settings.port} "
                              f"({exc.strerror or exc})") from None
        sockname = self._server.sockets[0].getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        return self.address

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.draining:  # accepted just before the listener closed
            writer.close()
            return
        handler = asyncio.current_task()
        assert handler is not None  # start_server runs each connection in a task of its own
        self._handlers.add(handler)
        try:
            await self._connection(reader, writer)
        finally:
            self._handlers.discard(handler)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        s = self.settings
        conn = FramedConnection(reader, writer, max_payload=s.max_frame_bytes,
                                frame_timeout=s.frame_timeout_s, write_timeout=s.write_timeout_s)
        deadline = asyncio.get_running_loop().time() + s.handshake_timeout_s
        session = _Session(self, conn, deadline)
        peer = writer.get_extra_info("peername")
        # Unauthenticated connections have a budget of their own; `HandshakeSlots` says whom a
        # full one closes (never a connection further on in its handshake than the newcomer).
        self._evict(self._handshaking.arrive(session, str(peer[0]) if isinstance(peer, tuple) else ""))
        self._sessions.add(session)
        self._no_sessions.clear()
        self.metrics.open_connections += 1
        self.metrics.count("connections")
        try:
            await session.run()
        finally:
            self._handshaking.leave(session)
            self._sessions.discard(session)
            if session.authenticated:
                self._authenticated -= 1
            if not self._sessions:
                self._no_sessions.set()
            self.metrics.open_connections -= 1

    def _evict(self, sessions: list[_Session]) -> None:
        for session in sessions:
            self.metrics.count("handshakes_evicted")
            session.evict()  # its handler unwinds on its next read

    def handshake_failed(self, peer: str, exc: ProtocolError) -> None:
        """Log a failed handshake, at most one line per 10 s: a flood of half-open connections
        fails hundreds a second, and a line each would cost the loop (and fill the log) for them."""
        if self._handshake_log.ready():
            also = self._handshake_log.take_suppressed()
            log.warning("%s: %s: %s; closing%s", peer, type(exc).__name__, exc,
                        f" ({also} more failed handshakes in the last {self._handshake_log.interval_s:g} s, "
                        "counted in the metrics)" if also else "")

    def hello_received(self, session: _Session) -> None:
        """A session sent a complete HELLO: it is now only pushed out by others that did too."""
        self._evict(self._handshaking.hello(session))

    def admit(self, session: _Session) -> bool:
        """A session proved its key: count it against `max_connections`; False if that is full."""
        self._handshaking.leave(session)
        if self._authenticated >= self.settings.max_connections:
            self.metrics.count("rejected_connections")
            log.warning("%s: refused, %d authenticated connections open", session.conn.peer,
                        self._authenticated)
            return False
        self._authenticated += 1
        session.authenticated = True
        return True

    def stream_opened(self) -> None:
        self.metrics.open_streams += 1
        self._idle.clear()

    def stream_closed(self) -> None:
        self.metrics.open_streams -= 1
        if self.metrics.open_streams <= 0:
            self._idle.set()

    async def shutdown(self) -> None:
        """Stop accepting, tell clients (GOAWAY), let open streams finish within the grace period."""
        if self.draining:
            return
        self.draining = True
        if self._server is not None:
            self._server.close()
        log.info("shutting down: %d connections, %d open streams",
                 len(self._sessions), self.metrics.open_streams)
        for session in list(self._sessions):
            await session.go_away()
        with contextlib.suppress(*TIMEOUTS):
            await asyncio.wait_for(self._idle.wait(), self.settings.shutdown_grace_s)
        for session in list(self._sessions):
            await session.terminate()
        with contextlib.suppress(*TIMEOUTS):  # connection handlers unwind after their sockets close
            await asyncio.wait_for(self._no_sessions.wait(), 2.0)
        # A handler still running (stuck in a write, say) is cancelled and awaited: none may
        # outlive the server, to log into a closed stream or touch a stopped loop.
        for handler in list(self._handlers):
            await cancel_and_wait(handler)
        await self.scheduler.stop()
        log.info("metrics %s", json.dumps(self.metrics.snapshot()))

    async def log_metrics(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            log.info("metrics %s", json.dumps(self.metrics.snapshot()))


class _Session:
    """One client connection: handshake, then requests until it closes."""

    def __init__(self, server: SynthServer, conn: FramedConnection, deadline: float) -> None:
        self.server = server
        self.conn = conn
        self.deadline = deadline
        """Loop time by which the handshake must be complete."""
        self.authenticated = False
        self.settings = server.settings
        self.streams: dict[int, _Stream] = {}
        self.last_stream = 0
        self.codecs: frozenset[Codec] = frozenset()
        self.client = ""

    async def run(self) -> None:
        try:
            await self._handshake()
            await self._serve()
        except ProtocolError as exc:
            counter = "auth_failures" if isinstance(exc, AuthenticationFailed) else "protocol_errors"
            self.server.metrics.count(counter)
            if self.authenticated:
                log.warning("%s: %s: %s; closing", self.conn.peer, type(exc).__name__, exc)
            else:
                self.server.handshake_failed(self.conn.peer, exc)
            self._cancel_all()
            await self.conn.close(exc)
        except ConnectionClosed:
            log.debug("%s: closed by peer", self.conn.peer)
        finally:
            self._cancel_all()
            await self.conn.close()

    def evict(self) -> None:
        """Close a connection still in its handshake to make room for another."""
        # Debug, not info: under a flood this runs for every attacking connection.
        log.debug("%s: handshake slot given to another connection; closing", self.conn.peer)
        self.conn.abort()

    async def _handshake(self) -> None:
        deadline = self.deadline  # one deadline for the whole handshake, not one per read
        hello = await self.conn.read(deadline=deadline)
        if not isinstance(hello, Hello):
            raise UnexpectedMessage(f"expected HELLO, got {type(hello).__name__}")
        if hello.max_frame < MIN_PEER_FRAME:
            raise MalformedPayload(f"HELLO: max_frame {hello.max_frame} is below {MIN_PEER_FRAME}")
        self.conn.peer_max_payload = min(hello.max_frame, HARD_MAX_PAYLOAD)
        self.codecs = codecs_in(hello.codecs) & self.server.codecs
        if not self.codecs:
            raise UnexpectedMessage("no audio codec in common")
        self.server.hello_received(self)
        psk = self.server.psk
        challenge = Challenge(auth.new_nonce(), codec_mask(self.server.codecs), self.settings.max_frame_bytes,
                              f"edge-agent serve {__version__}", noauth=psk is None)
        await self.conn.send(challenge)
        proof = await self.conn.read(deadline=deadline)
        if not isinstance(proof, Auth):
            raise UnexpectedMessage(f"expected AUTH, got {type(proof).__name__}")
        transcript = (hello.payload(), challenge.payload())
        if psk is not None and not auth.verify(auth.client_proof(psk, *transcript), proof.mac):
            raise AuthenticationFailed("authentication failed: wrong pre-shared key")
        if not self.server.admit(self):
            await self.conn.close(Error(0, ErrorCode.BUSY, "too many connections"))
            raise ConnectionClosed(f"{self.conn.peer}: refused, too many connections")
        mac = auth.server_proof(psk, *transcript) if psk is not None else bytes(MAC_SIZE)
        welcome = Welcome(mac, codec_mask(self.codecs), self.server.voice_infos, noauth=psk is None)
        await self.conn.send(welcome)
        self.client = hello.name
        log.info("%s: client %r authenticated%s", self.conn.peer, hello.name,
                 "" if psk is not None else " (insecure mode: no key)")

    async def _serve(self) -> None:
        while True:
            message = await self.conn.read(self.settings.idle_timeout_s)
            if isinstance(message, Synth):
                await self._open(message)
            elif isinstance(message, Cancel):
                stream = self.streams.get(message.stream)
                if stream is not None:  # else it already ended: CANCEL crossed END on the wire
                    stream.ticket.cancel()
            elif isinstance(message, Ping):
                metrics = self.server.metrics
                await self.conn.send(Pong(message.nonce, Load(metrics.queue_depth, metrics.open_streams)))
            elif isinstance(message, Pong):
                pass
            elif isinstance(message, Error):
                if message.stream == 0:
                    log.info("%s: client closed with %s: %s", self.conn.peer, message.name, message.message)
                    return
                stream = self.streams.get(message.stream)
                if stream is not None:
                    stream.ticket.cancel()
            else:
                raise UnexpectedMessage(f"a client may not send {type(message).__name__}")

    async def _refuse(self, stream: int, code: ErrorCode, text: str) -> None:
        self.server.metrics.count(f"rejected_{code.name.lower()}")
        log.info("%s stream %d: refused (%s): %s", self.conn.peer, stream, code.name, text)
        await self.conn.send(Error(stream, code, text))

    async def _open(self, req: Synth) -> None:
        if req.stream <= self.last_stream:
            raise BadStreamId(f"stream id {req.stream} is not above the last one ({self.last_stream})")
        self.last_stream = req.stream
        server, s = self.server, self.settings
        voice_id = req.voice or server.default_voice
        voice = server.voices.get(voice_id)
        text_chars = sum(len(x) for x in req.sentences)
        if server.draining:
            return await self._refuse(req.stream, ErrorCode.SHUTTING_DOWN, "server is shutting down")
        if len(self.streams) >= s.max_streams_per_connection:
            return await self._refuse(req.stream, ErrorCode.TOO_MANY_STREAMS,
                                      f"at most {s.max_streams_per_connection} open streams per connection")
        if server.metrics.open_streams >= s.max_streams:
            return await self._refuse(req.stream, ErrorCode.BUSY,
                                      f"server is at its limit of {s.max_streams} open streams "
                                      f"(server.max_streams={s.max_streams}); try again when one has ended")
        if voice is None:
            return await self._refuse(req.stream, ErrorCode.UNKNOWN_VOICE,
                                      f"no voice {voice_id!r} (offered: {', '.join(server.voices)})")
        if req.codec not in self.codecs:
            return await self._refuse(req.stream, ErrorCode.UNSUPPORTED_CODEC,
                                      f"{req.codec.name} was not agreed on this connection")
        if not 0 < text_chars <= s.max_text_chars or len(req.sentences) > 0xFFFF:
            return await self._refuse(req.stream, ErrorCode.BAD_REQUEST,
                                      f"text must have 1..{s.max_text_chars} characters")
        longest = max(range(len(req.sentences)), key=lambda i: len(req.sentences[i]))
        if len(req.sentences[longest]) > s.max_sentence_chars:
            # What a sentence costs (memory above all) grows with its length, so the bound is
            # per sentence; the device never sends longer ones (it splits at the same length).
            return await self._refuse(req.stream, ErrorCode.BAD_REQUEST,
                                      f"sentence {longest} has {len(req.sentences[longest])} characters, "
                                      f"at most {s.max_sentence_chars} per sentence")
        native = opus_rate(voice.sample_rate) if req.codec is Codec.OPUS else voice.sample_rate
        rate = req.sample_rate or native
        if req.codec is Codec.OPUS and rate not in OPUS_RATES:
            return await self._refuse(req.stream, ErrorCode.UNSUPPORTED_CODEC,
                                      f"Opus runs at {', '.join(map(str, OPUS_RATES))} Hz, not {rate}")
        if not 8000 <= rate <= 48000:
            return await self._refuse(req.stream, ErrorCode.BAD_REQUEST,
                                      f"sample rate {rate} is outside 8000..48000")
        if req.deadline_ms:
            budget = req.deadline_ms / 1000
            expected = server.scheduler.first_audio_estimate(voice_id, req.sentences[0], budget)
            if expected is not None and expected > budget:
                # Refused now, the device speaks locally at once; accepted, it would wait out its
                # deadline, and take cores from streams that can still be served in time.
                return await self._refuse(req.stream, ErrorCode.BUSY,
                                          f"server at capacity: first audio expected in {expected:.1f} s, "
                                          f"past this stream's deadline of {budget:g} s")
        encoder = SentenceEncoder(req.codec, rate, self.conn.peer_max_payload - _AUDIO_HEADER,
                                  chunk_samples=max(1, rate * s.chunk_ms // 1000), bitrate=s.opus_bitrate)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.deadline_ms / 1000 if req.deadline_ms else None
        ticket = Ticket([], deadline, voice=voice_id)
        stream = _Stream(req.stream, ticket)
        self.streams[req.stream] = stream
        server.stream_opened()
        server.metrics.count("requests")
        server.scheduler.submit(ticket, [sentence_work(voice, text, rate, encoder) for text in req.sentences],
                                list(req.sentences),
                                req.deadline_ms / 1000 if req.deadline_ms else FIRST_AUDIO_BUDGET_S)
        header = Format(req.stream, rate, req.codec, encoder.frame_samples, encoder.pre_skip,
                        len(req.sentences))
        stream.task = loop.create_task(self._stream(stream, header))
        # A done callback, not `finally`: it also runs for a task cancelled before its first step.
        stream.task.add_done_callback(lambda _task: self._closed(stream))
        log.info("%s stream %d: %d sentences, voice %s, %s at %d Hz", self.conn.peer, req.stream,
                 len(req.sentences), voice_id, req.codec.name, rate)
        return None

    async def _stream(self, stream: _Stream, header: Format) -> None:
        ticket, sid = stream.ticket, stream.id
        samples = 0
        synth_s = 0.0
        outcome = "done"
        try:
            await self.conn.send(header)
            for index, future in enumerate(ticket.futures):
                try:
                    result: SentenceResult = await future
                except StreamCancelled:
                    outcome = "cancelled"
                    break
                except DeadlineMissed:
                    outcome = "deadline"
                    await self.conn.send(Error(sid, ErrorCode.DEADLINE, "synthesis could not start in time"))
                    return
                except Exception as exc:
                    outcome = "failed"
                    await self.conn.send(Error(sid, ErrorCode.INTERNAL, f"synthesis failed: {exc}"))
                    return
                synth_s += result.synth_s
                last = len(result.chunks) - 1
                offset = 0
                for j, chunk in enumerate(result.chunks):
                    if ticket.cancelled:
                        break
                    due = ticket.due_of(index) + offset / header.sample_rate + LATE_GRACE_S
                    message = Audio(sid, index, chunk.samples, chunk.data, last=j == last)
                    if not await self._send_by(message, due):
                        outcome = "late"
                        self._fell_behind(stream, due - LATE_GRACE_S)
                        return
                    offset += chunk.samples
                    if index == 0 and j == 0:
                        ticket.playing_since = asyncio.get_running_loop().time()
                        self.server.metrics.first_audio_sent(time.monotonic() - ticket.arrived)
                samples += offset
            queue_s = (ticket.started_at - ticket.arrived) if ticket.started_at else 0.0
            await self.conn.send(End(sid, samples, round(max(queue_s, 0.0) * 1000), round(synth_s * 1000),
                                     cancelled=ticket.cancelled))
            if ticket.cancelled:
                outcome = "cancelled"
        except ConnectionClosed:
            outcome = "disconnected"
        finally:
            ticket.cancel()
            self.server.metrics.count(f"streams_{outcome}")
            log.info("%s stream %d: %s (%.2f s audio, %.2f s synthesis)", self.conn.peer, sid, outcome,
                     samples / header.sample_rate, synth_s)

    async def _send_by(self, message: Audio, due: float) -> bool:
        """Queue `message` for sending, waiting at most until `due` (loop time); False if it could
        not be: the client has stopped reading (or reads slower than it plays). A chunk made late
        by the server itself still gets `LATE_GRACE_S`: only the client's reading is judged here."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(self.conn.send(message), max(due - loop.time(), LATE_GRACE_S))
        except TIMEOUTS:
            return False
        return True

    def _fell_behind(self, stream: _Stream, due: float) -> None:
        """A stream whose client stopped reading: drop the rest of it (no synthesis, nothing held)
        and close its connection, whose send queue that client no longer empties."""
        stream.ticket.cancel()  # counted as `streams_late` where the stream's task ends
        behind = asyncio.get_running_loop().time() - due
        log.warning("%s stream %d: client %.1f s behind playback (not reading); stream dropped, "
                    "connection closed", self.conn.peer, stream.id, behind)
        self.conn.abort()

    def _closed(self, stream: _Stream) -> None:
        stream.ticket.cancel()
        if self.streams.pop(stream.id, None) is not None:
            self.server.stream_closed()

    def _cancel_all(self) -> None:
        for stream in list(self.streams.values()):
            stream.ticket.cancel()
            if stream.task is not None:
                stream.task.cancel()

    async def go_away(self) -> None:
        with contextlib.suppress(ConnectionClosed, ValueError):
            await self.conn.send(GoAway(ErrorCode.SHUTTING_DOWN, "server is shutting down"))

    async def terminate(self) -> None:
        """End what is still open after the grace period: each stream gets an ERROR, then close."""
        ids = list(self.streams)
        tasks = [st.task for st in self.streams.values() if st.task is not None]
        self._cancel_all()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sid in ids:
            with contextlib.suppress(ConnectionClosed):
                await self.conn.send(Error(sid, ErrorCode.SHUTTING_DOWN, "server shut down"))
        await self.conn.flush(1.0)
        await self.conn.close()


async def _other_tasks() -> list[str]:
    return [repr(t) for t in asyncio.all_tasks() if t is not asyncio.current_task()]


class ServerThread:
    """A `SynthServer` on its own event loop in a background thread (benchmarks, tests, embedding).

    `left_running`, after `stop`: the tasks that the server's shutdown left on its loop (none, or
    shutdown did not wait for everything it started); `stop` then cancels them.
    """

    def __init__(self, settings: ServerSettings, voices: Mapping[str, Voice], psk: bytes | None, *,
                 tls: ssl.SSLContext | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="offload-server", daemon=True)
        self.thread.start()

        async def make() -> SynthServer:
            server = SynthServer(settings, voices, psk, tls=tls)
            await server.start()
            return server

        try:
            self.server = self.call(make())
        except BaseException:
            self._stop_loop()
            raise
        self.host, self.port = self.server.address
        self.left_running: list[str] = []
        self.uri = f"{'tls' if tls else 'tcp'}://127.0.0.1:{self.port}"

    def call(self, coro: Any, timeout: float = 60) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop.is_closed() or not self.loop.is_running():
            return
        self.call(self.server.shutdown())
        self.left_running = self.call(_other_tasks())
        self._stop_loop()

    def _stop_loop(self) -> None:
        async def drain() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.call(drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
