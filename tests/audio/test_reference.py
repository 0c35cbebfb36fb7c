"""The playback reference: what the loudspeaker played, on the microphone's clock."""

from __future__ import annotations

import numpy as np

from edge_agent.audio.reference import RATE, PlaybackReference, ReferenceSink
from edge_agent.audio.sinks import NullSink


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def ramp(n: int, start: float = 0.0) -> np.ndarray:
    return (start + np.arange(n, dtype=np.float32) / 1e5).astype(np.float32)


def test_blocks_written_ahead_of_playing_are_laid_end_to_end():
    clock = Clock()
    ref = PlaybackReference(clock=clock)
    start = ref.index(clock.now)
    ref.write(ramp(1600))
    ref.write(ramp(1600, 1.0))  # written at once (a sound card buffers it): it plays after the first
    got = ref.read(start, 3200)
    assert np.array_equal(got[:1600], ramp(1600)) and np.array_equal(got[1600:], ramp(1600, 1.0))
    assert ref.playing_at(clock.now + 0.19) and not ref.playing_at(clock.now + 0.2)


def test_a_block_after_the_timeline_ran_dry_starts_when_written_with_silence_before():
    clock = Clock()
    ref = PlaybackReference(clock=clock)
    start = ref.index(clock.now)
    ref.write(np.ones(160, dtype=np.float32))
    clock.now += 1.0
    ref.write(np.full(160, 0.5, dtype=np.float32))
    got = ref.read(start, RATE + 160)
    assert got[:160].tolist() == [1.0] * 160 and not got[160:RATE].any()
    assert got[RATE:].tolist() == [0.5] * 160


def test_an_aborted_sink_takes_back_what_it_had_not_played():
    clock = Clock()
    ref = PlaybackReference(clock=clock)
    start = ref.index(clock.now)
    sink = ReferenceSink(NullSink(RATE), ref)
    sink.write(np.ones(RATE, dtype=np.float32))  # one second queued on the card
    clock.now += 0.25
    sink.abort()
    got = ref.read(start, RATE)
    assert got[:RATE // 4 - 1].all() and not got[RATE // 4 + 1:].any()


def test_what_the_ring_no_longer_holds_reads_as_silence_and_writes_never_grow_it():
    clock = Clock()
    ref = PlaybackReference(keep_s=1.0, clock=clock)
    start = ref.index(clock.now)
    ref.write(np.ones(5 * RATE, dtype=np.float32))  # five seconds into a one-second ring
    assert ref._ring.size == RATE
    got = ref.read(start, 5 * RATE)
    assert not got[:4 * RATE].any() and got[4 * RATE:].all()


def test_a_sink_at_another_rate_is_recorded_at_16_khz():
    clock = Clock()
    ref = PlaybackReference(clock=clock)
    sink = ReferenceSink(NullSink(22050), ref)
    sink.write(np.ones(22050, dtype=np.float32))
    sink.close()
    assert abs(ref.end - ref.index(clock.now) - RATE) <= 32 and sink.inner.frames == 22050
