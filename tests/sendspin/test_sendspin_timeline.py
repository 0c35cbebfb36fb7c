"""The music buffer and the playout thread on their own (no aiosendspin needed): bounded memory,
clock jumps, formats refused."""

from __future__ import annotations

import time

import numpy as np
import pytest

from edge_agent.audio.sinks import WavSink
from edge_agent.audio.wav import read_wav
from edge_agent.sendspin.playout import Playout, Stream
from edge_agent.sendspin.timeline import MAX_CHUNKS, StreamFormat, Timeline, UnsupportedFormat
from tests.waiting import wait_until

RATE = 48000


def pcm16(samples: np.ndarray, channels: int = 2) -> bytes:
    ints = np.round(samples * 32767).astype("<i2")
    return np.repeat(ints[:, None], channels, axis=1).tobytes()


@pytest.mark.parametrize(("fmt", "why"), [
    (StreamFormat("flac", 48000, 2, 16), "codec 'flac'"),
    (StreamFormat("opus", 48000, 2, 16), "codec 'opus'"),
    (StreamFormat("pcm", 48000, 2, 8), "8-bit PCM"),
    (StreamFormat("pcm", 48000, 6, 16), "6 channels"),
    (StreamFormat("pcm", 1000, 2, 16), "1000 Hz"),
])
def test_a_format_we_cannot_decode_is_refused_with_the_reason(fmt, why):
    with pytest.raises(UnsupportedFormat, match=why):
        fmt.check()


def test_stereo_pcm_of_each_offered_depth_decodes_to_the_same_mono():
    x = np.linspace(-0.5, 0.5, 480, dtype=np.float32)
    fmt16 = StreamFormat("pcm", RATE, 2, 16)
    ints24 = np.round(x * 8388607).astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3]
    fmt24 = StreamFormat("pcm", RATE, 1, 24)
    assert np.max(np.abs(fmt16.decode(pcm16(x)) - x)) < 1e-4
    assert np.max(np.abs(fmt24.decode(ints24.tobytes()) - x)) < 1e-6


def test_the_buffer_holds_at_most_its_bound_whatever_is_sent():
    timeline = Timeline(RATE, max_samples=RATE)  # one second
    chunk = np.zeros(RATE // 10, dtype=np.float32)
    outcomes = [timeline.push(i * 100_000, chunk, cursor=0, max_ahead=3600 * RATE) for i in range(1000)]
    assert timeline.held <= RATE
    assert outcomes.count("queued") == 10 and outcomes.count("overflow") == 990
    assert timeline.stats.overflow == 990


def test_late_and_far_ahead_chunks_are_dropped_and_counted():
    timeline = Timeline(RATE, max_samples=10 * RATE)
    chunk = np.ones(480, dtype=np.float32)
    assert timeline.push(1_000_000, chunk, cursor=None, max_ahead=RATE) == "queued"  # the anchor
    assert timeline.push(1_000_000, chunk, cursor=4800, max_ahead=RATE) == "late"
    assert timeline.push(1_000_000 + 5_000_000, chunk, cursor=4800, max_ahead=RATE) == "ahead"
    assert (timeline.stats.late, timeline.stats.ahead, timeline.held) == (1, 1, 480)


def test_blocks_come_off_the_grid_contiguously_with_silence_where_nothing_arrived():
    timeline = Timeline(RATE, max_samples=RATE)
    timeline.push(0, np.full(100, 0.5, dtype=np.float32), None, RATE)
    timeline.push(round(150 * 1e6 / RATE), np.full(100, 0.25, dtype=np.float32), 0, RATE)
    block, filled = timeline.take(0, 300)
    assert filled == 200
    assert np.all(block[:100] == 0.5) and np.all(block[100:150] == 0) and np.all(block[150:250] == 0.25)
    assert timeline.held == 0


def test_chunks_out_of_order_take_their_place_and_tiny_ones_cannot_grow_the_bookkeeping():
    timeline = Timeline(RATE, max_samples=RATE)
    for grid, level in ((0, 0.1), (300, 0.3), (200, 0.2)):  # the last one arrives late, out of order
        timeline.push(round(grid * 1e6 / RATE), np.full(100, level, dtype=np.float32), 0, RATE)
    block, filled = timeline.take(0, 400)
    assert filled == 300
    assert np.allclose(block, np.repeat(np.float32([0.1, 0.0, 0.2, 0.3]), 100))
    flood = Timeline(RATE, max_samples=10 * RATE)
    one = np.zeros(1, dtype=np.float32)
    outcomes = [flood.push(round(i * 1e6 / RATE), one, 0, 60 * RATE) for i in range(MAX_CHUNKS + 100)]
    assert outcomes.count("overflow") == 100 and flood.held == MAX_CHUNKS


class JumpingClock:
    """The server's clock as the player sees it: the local one plus an offset that can jump."""

    def __init__(self) -> None:
        self.offset_us = 0

    def to_server(self, local_us: int) -> int:
        return local_us + self.offset_us

    def to_local(self, server_us: int) -> int:
        return server_us - self.offset_us


def now_us() -> int:
    return time.monotonic_ns() // 1000


def test_a_server_clock_that_jumps_moves_the_output_there_and_keeps_memory_bounded(tmp_path, caplog):
    caplog.set_level("INFO", logger="edge_agent.sendspin")
    clock = JumpingClock()
    states: list[str] = []
    playout = Playout(lambda rate, name: WavSink(tmp_path / f"{name}.wav", rate), now_us, lambda: 1.0,
                      block_ms=20, stall_s=5.0, on_state=lambda _id, state: states.append(state))
    fmt = StreamFormat("pcm", RATE, 2, 16)
    timeline = Timeline(RATE, max_samples=4 * RATE)
    stream = Stream("s1", fmt, timeline, clock.to_server, clock.to_local)
    start = now_us() + 100_000
    ramp = np.arange(3 * RATE, dtype=np.float32) / (4 * RATE)  # each sample says where it is
    with playout.lock:
        for i in range(0, len(ramp), 960):
            timeline.push(start + round(i * 1e6 / RATE), fmt.decode(pcm16(ramp[i:i + 960])), None, 60 * RATE)
        stream.last_chunk_us = now_us()
    playout.set_stream(stream)
    playout.start()
    try:
        wait_until(lambda: playout.stats.audio_blocks > 25, 10, "half a second played")
        clock.offset_us += 1_000_000  # the server's clock leaps a second ahead
        wait_until(lambda: playout.stats.resyncs == 1, 10, "the jump noticed")
        wait_until(lambda: playout.stats.blocks > 60 and stream.cursor is not None, 10, "more blocks")
        clock.offset_us += 3_600_000_000  # an hour: past everything buffered
        wait_until(lambda: playout.stats.resyncs == 2 and timeline.held == 0, 10, "the buffer released")
        with playout.lock:  # the server goes on stamping from its old timeline: all late now
            stream.last_chunk_us = now_us()
            outcome = timeline.push(start + 3_500_000, np.zeros(960, dtype=np.float32), stream.cursor,
                                    60 * RATE)
        assert outcome == "late"
    finally:
        playout.set_stream(None)
        playout.stop()
    assert "off the group's clock; moved there" in caplog.text
    out = read_wav(tmp_path / f"{playout.stats.segments[0].name}.wav").samples
    steps = np.diff(out[np.abs(out) > 0])
    jumps = np.nonzero(np.abs(steps) > 1e-3)[0]
    # one forward leap of about a second of the ramp, the rest contiguous
    assert len(jumps) >= 1 and abs(steps[jumps[0]] - 1.0 / 4) < 0.01


def test_an_output_that_fails_is_reported_and_retried_without_taking_the_thread_down(tmp_path):
    from edge_agent.errors import AudioError

    opened = []

    def broken(rate, name):
        opened.append(name)
        raise AudioError("no such device")

    states: list[str] = []
    playout = Playout(broken, now_us, lambda: 1.0, block_ms=20, stall_s=5.0,
                      on_state=lambda _id, state: states.append(state))
    fmt = StreamFormat("pcm", RATE, 1, 16)
    timeline = Timeline(RATE, max_samples=RATE)
    clock = JumpingClock()
    stream = Stream("s1", fmt, timeline, clock.to_server, clock.to_local)
    with playout.lock:
        timeline.push(now_us() + 50_000, np.zeros(960, dtype=np.float32), None, RATE)
    playout.set_stream(stream)
    playout.start()
    try:
        wait_until(lambda: "output failed" in states, 10, "the failure reported")
        assert timeline.held == 0  # dropped, not piled up while the output is away
        assert playout.alive
    finally:
        playout.stop()
    assert opened == ["music-s1-1"]
