"""A frame over the limit is answered with FRAME_TOO_LARGE that the sender can read, not a reset."""

from __future__ import annotations

import time

import pytest

from edge_agent.offload.wire import messages as m
from edge_agent.offload.wire.framing import ErrorCode, FrameDecoder
from edge_agent.offload.wire.transport import LINGER_BYTES
from tests.integration.offload.offload_helpers import PIPER
from tests.integration.offload.server.test_synth_server import handshake_socket


def test_a_one_megabyte_synth_is_answered_with_frame_too_large(serve):
    """The client is still sending when the server answers; closing at once would reset the
    connection and the client would lose the error (ECONNRESET instead of FRAME_TOO_LARGE)."""
    server = serve()
    sock = handshake_socket(server.port)
    frame = m.encode(m.Synth(1, PIPER, ("x" * (1024 * 1024),), 0, m.Codec.PCM16))
    assert len(frame) > 1024 * 1024
    received = b""
    try:
        sock.settimeout(10)
        sock.sendall(frame)  # the server must keep reading (and dropping) what follows its answer
        while chunk := sock.recv(65536):
            received += chunk
    finally:
        sock.close()
    errors = [x for x in (m.decode(f) for f in FrameDecoder().feed(received)) if isinstance(x, m.Error)]
    assert [(e.stream, e.code) for e in errors] == [(0, ErrorCode.FRAME_TOO_LARGE)]
    assert server.server.metrics.counters["protocol_errors"] == 1


def test_a_peer_that_never_stops_sending_is_cut_off(serve):
    """The drain after the answer is bounded: a sender that goes on forever is closed within the
    linger's time (or its byte cap), not served for as long as it likes."""
    server = serve()
    sock = handshake_socket(server.port)
    block = m.encode(m.Synth(1, PIPER, ("x" * 100_000,), 0, m.Codec.PCM16))
    started = time.monotonic()
    sent = 0
    try:
        sock.settimeout(5)
        with pytest.raises(OSError):  # reset or broken pipe once the server has closed
            while time.monotonic() - started < 30:
                sock.sendall(block)
                sent += len(block)
    finally:
        sock.close()
    assert time.monotonic() - started < 10
    assert sent <= LINGER_BYTES + 8 * 1024 * 1024  # the cap, plus what the kernel's buffers hold
    assert server.server.metrics.counters["protocol_errors"] == 1
