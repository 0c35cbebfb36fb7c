"""The synthesis server over real loopback sockets, with the real Piper voice."""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import time

import numpy as np
import pytest

from edge_agent.config import Endpoint, ServerSettings
from edge_agent.errors import ConfigError
from edge_agent.offload.client.connection import ClientConnection
from edge_agent.offload.client.errors import RemoteError, Unavailable
from edge_agent.offload.server.synth_server import SynthServer, check_key
from edge_agent.offload.wire import messages as m
from edge_agent.offload.wire.codecs import SentenceDecoder
from edge_agent.offload.wire.framing import AuthenticationFailed, ErrorCode, FrameDecoder, MessageType
from tests.integration.offload.offload_helpers import PIPER, PSK
from tests.waiting import wait_until

TEXT = ("The front door is open.", "Please close it.", "Thank you.")


def endpoint(server) -> Endpoint:
    return Endpoint("tcp", "127.0.0.1", server.port)


async def connect(server, psk=PSK, **kw) -> ClientConnection:
    return await ClientConnection.open(endpoint(server), psk, timeout=5, **kw)


async def collect(conn: ClientConnection, sentences=TEXT, codec=m.Codec.PCM16, voice=PIPER,
                  answered: asyncio.Event | None = None, **kw):
    """All messages of one stream, up to and including END or ERROR; `answered` is set at the first."""
    q: asyncio.Queue = asyncio.Queue()
    sid = await conn.request(q.put_nowait, tuple(sentences), voice, codec, **kw)
    out = []
    while True:
        msg = await asyncio.wait_for(q.get(), 30)
        out.append(msg)
        if answered is not None:
            answered.set()
        if isinstance(msg, m.End | m.Error | Exception):
            return sid, out


def decode_sentences(messages) -> list[np.ndarray]:
    fmt = next(x for x in messages if isinstance(x, m.Format))
    sentences, pieces, decoder = [], [], None
    for msg in messages:
        if isinstance(msg, m.Audio):
            if decoder is None:
                decoder = SentenceDecoder(fmt.codec, fmt.sample_rate, fmt.frame_samples, fmt.pre_skip)
            pieces.append(decoder.decode(msg.samples, msg.data))
            if msg.last:
                assert msg.sentence == len(sentences)
                sentences.append(np.concatenate(pieces))
                pieces, decoder = [], None
    return sentences


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.mark.parametrize("codec", [m.Codec.PCM16, m.Codec.OPUS])
def test_each_sentence_comes_back_whole_and_in_order(serve, codec):
    server = serve()

    async def go():
        conn = await connect(server)
        try:
            return await collect(conn, codec=codec)
        finally:
            await conn.close()

    _, messages = run(go())
    assert isinstance(messages[0], m.Format)
    assert isinstance(messages[-1], m.End) and not messages[-1].cancelled
    fmt = messages[0]
    assert fmt.sample_rate == (24000 if codec is m.Codec.OPUS else 22050)
    sentences = decode_sentences(messages)
    assert len(sentences) == len(TEXT)
    for audio in sentences:
        assert 0.4 < len(audio) / fmt.sample_rate < 4.0
        assert np.sqrt(np.mean(audio ** 2)) > 0.01  # speech, not silence
    assert messages[-1].samples == sum(len(a) for a in sentences)


def test_requested_rate_is_honoured_by_resampling(serve):
    server = serve()

    async def go():
        conn = await connect(server)
        try:
            return await collect(conn, sentences=("Hello there.",), sample_rate=16000)
        finally:
            await conn.close()

    _, messages = run(go())
    assert messages[0].sample_rate == 16000
    assert 0.3 < len(decode_sentences(messages)[0]) / 16000 < 3


def test_streams_share_one_connection_and_interleave(serve):
    server = serve(workers=2)
    long_text = tuple(f"This is sentence number {i} of a long announcement." for i in range(6))

    async def go():
        conn = await connect(server)
        try:
            order: list[int] = []
            queues = {}

            def sink_for(q):
                def sink(msg):
                    if isinstance(msg, m.Audio):
                        order.append(msg.stream)
                    q.put_nowait(msg)
                return sink

            ids = []
            for _ in range(2):
                q: asyncio.Queue = asyncio.Queue()
                sid = await conn.request(sink_for(q), long_text, PIPER, m.Codec.PCM16)
                queues[sid] = q
                ids.append(sid)
            results = {}
            for sid, q in queues.items():
                msgs = []
                while not msgs or not isinstance(msgs[-1], m.End | m.Error):
                    msgs.append(await asyncio.wait_for(q.get(), 30))
                results[sid] = msgs
            return ids, order, results
        finally:
            await conn.close()

    ids, order, results = run(go())
    assert ids[0] != ids[1]
    for msgs in results.values():
        assert isinstance(msgs[-1], m.End)
        assert len(decode_sentences(msgs)) == len(long_text)
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b)
    assert switches >= 2, f"streams did not interleave: {order}"


def test_wrong_key_is_refused_and_the_connection_closed(serve):
    server = serve()
    with pytest.raises(RemoteError, match="AUTH_FAILED"):
        run(connect(server, psk=b"the-wrong-key-but-long-enough"))
    assert server.server.metrics.counters["auth_failures"] == 1


def test_client_without_a_key_is_told_to_configure_one(serve):
    server = serve()
    with pytest.raises(AuthenticationFailed, match="needs a pre-shared key"):
        run(connect(server, psk=None))


def test_client_with_a_key_refuses_a_keyless_server(serve):
    server = serve(psk=None, insecure=True)
    with pytest.raises(AuthenticationFailed, match="without a key"):
        run(connect(server, psk=PSK))

    async def keyless():
        conn = await connect(server, psk=None)
        try:
            assert not conn.info.authenticated
            return await collect(conn, sentences=("Hello.",))
        finally:
            await conn.close()

    assert isinstance(run(keyless())[1][-1], m.End)


def test_server_refuses_to_start_without_a_key_unless_insecure_on_loopback():
    with pytest.raises(ConfigError, match="no pre-shared key"):
        check_key(ServerSettings(), None)
    with pytest.raises(ConfigError, match="only allowed on a loopback"):
        check_key(ServerSettings(host="0.0.0.0", insecure=True), None)
    check_key(ServerSettings(host="::1", insecure=True), None)
    check_key(ServerSettings(host="0.0.0.0"), PSK)


def raw_exchange(port: int, data: bytes, wait: float = 5.0) -> tuple[bytes, float]:
    """Send `data`, read until the server closes; returns (bytes, seconds until close)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received, time.monotonic() - started


def errors_in(data: bytes) -> list[m.Error]:
    return [msg for msg in (m.decode(f) for f in FrameDecoder().feed(data)) if isinstance(msg, m.Error)]


def test_header_claiming_two_gib_gets_an_error_and_a_closed_connection(serve):
    server = serve()
    header = struct.pack(">HBBII", 0xED53, 1, MessageType.HELLO, 0, 2**31)
    data, _ = raw_exchange(server.port, header)
    (error,) = errors_in(data)
    assert error.code == ErrorCode.FRAME_TOO_LARGE and error.stream == 0
    assert server.server.metrics.counters["protocol_errors"] == 1


def test_garbage_gets_an_error_and_a_closed_connection(serve):
    server = serve()
    data, _ = raw_exchange(server.port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    (error,) = errors_in(data)
    assert error.code == ErrorCode.PROTOCOL


def test_peer_stalling_mid_frame_is_cut_off_at_the_frame_deadline(serve):
    server = serve(frame_timeout_s=0.4, handshake_timeout_s=30)
    hello = m.encode(m.Hello(b"n" * 16, 1, 65536, "staller"))
    data, took = raw_exchange(server.port, hello[:7])
    (error,) = errors_in(data)
    assert error.code == ErrorCode.TIMEOUT
    assert 0.3 < took < 3


def test_silent_peer_is_dropped_after_the_handshake_deadline(serve):
    server = serve(handshake_timeout_s=0.4)
    data, took = raw_exchange(server.port, b"")
    assert errors_in(data)[0].code == ErrorCode.TIMEOUT
    assert took < 3


def test_truncated_frame_then_close_is_counted_as_a_protocol_error(serve):
    server = serve()
    hello = m.encode(m.Hello(b"n" * 16, 1, 65536, "truncated"))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(hello[:-3])
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(4096):
            pass
    wait_until(lambda: server.server.metrics.counters["protocol_errors"] >= 1, 3, "a protocol error")
    assert server.server.metrics.counters["protocol_errors"] == 1


def test_cancel_ends_the_stream_with_a_cancelled_end(serve):
    server = serve(workers=1)
    long_text = tuple(f"Sentence {i} is here to take some time." for i in range(20))

    async def go():
        conn = await connect(server)
        try:
            q: asyncio.Queue = asyncio.Queue()
            sid = await conn.request(q.put_nowait, long_text, PIPER, m.Codec.PCM16)
            while not isinstance(await asyncio.wait_for(q.get(), 30), m.Audio):
                pass
            await conn.cancel(sid)
            msgs = []
            while not msgs or not isinstance(msgs[-1], m.End | m.Error):
                msgs.append(await asyncio.wait_for(q.get(), 30))
            return msgs
        finally:
            await conn.close()

    msgs = run(go())
    assert isinstance(msgs[-1], m.End) and msgs[-1].cancelled
    sentences_done = {x.sentence for x in msgs if isinstance(x, m.Audio)}
    assert len(sentences_done) < 19
    assert server.server.metrics.counters["streams_cancelled"] == 1


def test_full_queue_answers_busy_and_the_connection_stays_usable(serve):
    server = serve(max_streams=1, workers=1)
    long_text = tuple(f"Sentence {i} keeps the only slot busy." for i in range(8))

    async def go():
        conn = await connect(server)
        try:
            taken = asyncio.Event()
            first = asyncio.ensure_future(collect(conn, sentences=long_text, answered=taken))
            await asyncio.wait_for(taken.wait(), 30)  # the first stream holds the only slot
            _, second = await collect(conn, sentences=("Am I next?",))
            _, first_msgs = await first
            _, third = await collect(conn, sentences=("Now there is room.",))
            return second, first_msgs, third
        finally:
            await conn.close()

    second, first_msgs, third = run(go())
    assert isinstance(second[-1], m.Error) and second[-1].code == ErrorCode.BUSY
    assert isinstance(first_msgs[-1], m.End)
    assert isinstance(third[-1], m.End)


def test_request_that_cannot_start_before_its_deadline_fails_with_deadline(serve):
    server = serve(workers=1)
    long_text = tuple(f"Sentence {i} occupies the worker for a while." for i in range(4))

    async def go():
        conn = await connect(server)
        try:
            taken = asyncio.Event()
            first = asyncio.ensure_future(collect(conn, sentences=long_text, answered=taken))
            await asyncio.wait_for(taken.wait(), 30)  # the only worker has the first stream's sentences
            _, late = await collect(conn, sentences=("Too late.",), deadline_ms=1)
            await first
            return late
        finally:
            await conn.close()

    late = run(go())
    assert isinstance(late[-1], m.Error) and late[-1].code == ErrorCode.DEADLINE
    assert server.server.metrics.counters["deadline_missed"] == 1


@pytest.mark.parametrize(("kwargs", "code"), [
    ({"voice": "no-such-voice"}, ErrorCode.UNKNOWN_VOICE),
    ({"sentences": ("",)}, ErrorCode.BAD_REQUEST),
    ({"sample_rate": 22050, "codec": m.Codec.OPUS}, ErrorCode.UNSUPPORTED_CODEC),
    ({"sample_rate": 96000}, ErrorCode.BAD_REQUEST),
    ({"sentences": ("x" * 6000,)}, ErrorCode.BAD_REQUEST),
])
def test_bad_requests_fail_their_stream_only(serve, kwargs, code):
    server = serve()

    async def go():
        conn = await connect(server)
        try:
            _, bad = await collect(conn, **kwargs)
            _, good = await collect(conn, sentences=("Still here.",))
            return bad, good
        finally:
            await conn.close()

    bad, good = run(go())
    assert isinstance(bad[-1], m.Error) and bad[-1].code == code
    assert isinstance(good[-1], m.End)


def test_reused_stream_id_closes_the_connection(serve):
    server = serve()

    async def go():
        conn = await connect(server)
        try:
            await conn.conn.send(m.Synth(5, PIPER, ("One.",)))
            await conn.conn.send(m.Synth(5, PIPER, ("Two.",)))
            await asyncio.wait_for(conn.closed.wait(), 5)
        finally:
            await conn.close()

    run(go())
    assert server.server.metrics.counters["protocol_errors"] == 1


def test_ping_measures_a_round_trip(serve):
    server = serve()

    async def go():
        conn = await connect(server)
        try:
            return [await conn.ping(2) for _ in range(3)]
        finally:
            await conn.close()

    rtts = run(go())
    assert all(0 < rtt < 0.5 for rtt in rtts)


def test_shutdown_sends_goaway_and_lets_open_streams_finish(serve):
    server = serve(workers=1, shutdown_grace_s=20)
    text = tuple(f"Sentence {i} is still being spoken." for i in range(5))

    async def go():
        conn = await connect(server)
        try:
            q: asyncio.Queue = asyncio.Queue()
            await conn.request(q.put_nowait, text, PIPER, m.Codec.PCM16)
            while not isinstance(await asyncio.wait_for(q.get(), 30), m.Format):
                pass
            shutdown = asyncio.get_running_loop().run_in_executor(
                None, lambda: server.call(server.server.shutdown()))
            msgs = []
            while not msgs or not isinstance(msgs[-1], m.End | m.Error):
                msgs.append(await asyncio.wait_for(q.get(), 30))
            with pytest.raises(Unavailable):
                await conn.request(q.put_nowait, ("New work.",), PIPER, m.Codec.PCM16)
            await shutdown
            return msgs
        finally:
            await conn.close()

    msgs = run(go())
    assert isinstance(msgs[-1], m.End) and not msgs[-1].cancelled
    assert len({x.sentence for x in msgs if isinstance(x, m.Audio)}) == 5


def test_metrics_count_batches_queue_and_rtf(serve):
    server = serve(workers=2)
    text = tuple(f"Metrics sentence {i}." for i in range(4))

    async def go():
        conns = [await connect(server) for _ in range(3)]
        try:
            await asyncio.gather(*(collect(c, sentences=text) for c in conns))
        finally:
            for c in conns:
                await c.close()

    run(go())
    snap = server.server.metrics.snapshot()
    assert snap["counters"]["requests"] == 3
    assert sum(snap["batch_sizes"].values()) == 12
    assert "2" in snap["batch_sizes"]  # two sentences were synthesized together
    assert 0 < snap["rtf_p50"] < 5
    assert snap["queue_depth"] == 0 and snap["in_flight"] == 0


def test_server_needs_at_least_one_voice():
    with pytest.raises(ConfigError):
        SynthServer(ServerSettings(), {}, PSK)


def test_streams_still_open_when_the_grace_period_ends_get_shutting_down(serve):
    server = serve(workers=1, shutdown_grace_s=0.2)
    text = tuple(f"Sentence {i} will not be finished in time." for i in range(30))

    async def go():
        conn = await connect(server)
        try:
            q: asyncio.Queue = asyncio.Queue()
            await conn.request(q.put_nowait, text, PIPER, m.Codec.PCM16)
            while not isinstance(await asyncio.wait_for(q.get(), 30), m.Audio):
                pass
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, lambda: server.call(server.server.shutdown()))
            msgs = []
            while not msgs or not isinstance(msgs[-1], m.End | m.Error | Exception):
                msgs.append(await asyncio.wait_for(q.get(), 30))
            return msgs
        finally:
            await conn.close()

    msgs = run(go())
    assert isinstance(msgs[-1], m.Error) and msgs[-1].code == ErrorCode.SHUTTING_DOWN


def handshake_socket(port: int) -> socket.socket:
    """A blocking socket past the key exchange, for peers that misbehave afterwards."""
    from edge_agent.offload.wire import auth

    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    decoder = FrameDecoder()

    def read_one():
        while True:
            frames = decoder.feed(sock.recv(65536))
            if frames:
                return m.decode(frames[0])

    hello = m.Hello(auth.new_nonce(), 1, 65536, "raw")
    sock.sendall(m.encode(hello))
    challenge = read_one()
    sock.sendall(m.encode(m.Auth(auth.client_proof(PSK, hello.payload(), challenge.payload()))))
    assert isinstance(read_one(), m.Welcome)
    return sock


def test_client_that_stops_reading_is_disconnected_after_the_write_timeout(serve):
    server = serve(workers=2, write_timeout_s=0.5)
    sock = handshake_socket(server.port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    text = tuple(f"Sentence {i} fills buffers that nobody reads." for i in range(60))
    try:
        sock.sendall(m.encode(m.Synth(1, PIPER, text, 48000, m.Codec.PCM16)))  # more bytes per second
        wait_until(lambda: server.server.metrics.counters["streams_disconnected"], 60, "the disconnect")
    finally:
        sock.close()
    assert server.server.metrics.counters["streams_disconnected"] == 1
    assert server.server.metrics.open_streams == 0


def test_other_protocol_versions_are_told_and_closed(serve):
    server = serve()
    data, _ = raw_exchange(server.port, struct.pack(">HBBII", 0xED53, 2, MessageType.HELLO, 0, 22))
    (error,) = errors_in(data)
    assert error.code == ErrorCode.UNSUPPORTED_VERSION and "speaks 1" in error.message


def test_connections_beyond_the_limit_are_answered_busy(serve):
    server = serve(max_connections=1)

    async def go():
        first = await connect(server)
        try:
            with pytest.raises(RemoteError, match="BUSY"):
                await connect(server)
        finally:
            await first.close()

    run(go())
    assert server.server.metrics.counters["rejected_connections"] == 1


# -- abuse: half-open connections, trickled handshakes, one huge sentence -----------------------


def half_open(port: int, count: int) -> list[socket.socket]:
    """Connections that start a HELLO header and never finish it (a slowloris)."""
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"\xed\x53\x01")
        held.append(sock)
    return held


def test_half_open_connections_cannot_lock_an_honest_client_out(serve):
    server = serve(max_connections=4, max_handshakes=8, handshake_timeout_s=30)
    held = half_open(server.port, 60)
    try:
        async def go():
            for _ in range(3):  # each honest client is served, every time
                conn = await connect(server)
                try:
                    _, msgs = await collect(conn, ("Hello there.",))
                    assert isinstance(msgs[-1], m.End)
                finally:
                    await conn.close()

        run(go())
        counters = server.server.metrics.counters
        assert counters["handshakes_evicted"] >= 60 - 8
        assert counters["rejected_connections"] == 0  # half-open ones never took an authenticated slot
        assert len(server.server._handshaking) <= 8
    finally:
        for sock in held:
            sock.close()


def test_half_open_connections_do_not_count_against_max_connections(serve):
    server = serve(max_connections=1, max_handshakes=4, handshake_timeout_s=30)
    held = half_open(server.port, 3)
    try:
        async def go():
            first = await connect(server)
            try:
                with pytest.raises(RemoteError, match="BUSY"):
                    await connect(server)  # the one authenticated slot is taken
            finally:
                await first.close()

        run(go())
    finally:
        for sock in held:
            sock.close()


def test_a_handshake_trickled_mid_frame_ends_at_its_one_deadline(serve):
    """The frame deadline (10 s here) must not stretch the handshake's (0.5 s)."""
    server = serve(handshake_timeout_s=0.5, frame_timeout_s=10)
    hello = m.encode(m.Hello(b"n" * 16, 1, 65536, "trickler"))
    stop = time.monotonic() + 5

    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        started = time.monotonic()
        received = b""
        sock.sendall(hello[:14])  # mid-frame
        sock.settimeout(0.1)
        for byte in hello[14:-1]:  # a byte every 0.1 s keeps every per-read deadline happy
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                sock.sendall(bytes([byte]))
                continue
            received += chunk
            if not chunk or time.monotonic() > stop:
                break
        took = time.monotonic() - started
    (error,) = errors_in(received)
    assert error.code == ErrorCode.TIMEOUT and "deadline" in error.message
    assert took < 3


def test_a_sentence_over_the_limit_is_refused_before_it_costs_memory(serve_process):
    """One 5000-character sentence used to grow the server by gigabytes (attention is quadratic)."""
    proc = serve_process(PIPER)
    port = proc.port

    def rss_mb() -> float:
        with open(f"/proc/{proc.proc.pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024

    async def go():
        conn = await ClientConnection.open(Endpoint("tcp", "127.0.0.1", port), PSK, timeout=5)
        try:
            _, msgs = await collect(conn, (" ".join(f"word{i}" for i in range(900))[:5000],))
            assert isinstance(msgs[-1], m.Error) and msgs[-1].code == ErrorCode.BAD_REQUEST
            assert "5000 characters, at most 300 per sentence" in msgs[-1].message
            _, msgs = await collect(conn, ("The same connection still works.",))
            assert isinstance(msgs[-1], m.End)
        finally:
            await conn.close()

    before = rss_mb()
    run(go())
    assert rss_mb() - before < 150
