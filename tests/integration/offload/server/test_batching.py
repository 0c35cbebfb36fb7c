"""Many streams through one server at once: each gets its own samples, on time, failures kept apart.

The voice is the real Piper voice with its noise off (`noise_scale` = `noise_w` = 0), so
every take of a sentence is the same samples and a stream served beside others can be
compared with the same stream served alone, sample for sample.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from edge_agent.config import TtsSettings
from edge_agent.offload.wire import messages as m
from edge_agent.offload.wire.framing import ErrorCode
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.voice import Voice
from tests.integration.offload.offload_helpers import PIPER
from tests.integration.offload.server.test_synth_server import (
    collect,
    connect,
    decode_sentences,
    handshake_socket,
    run,
)
from tests.waiting import wait_until

TEXTS = [
    ("The front door is open.", "Please close it before you leave."),
    ("Dinner is ready.", "Come to the kitchen while it is warm."),
    ("A parcel was delivered.", "It is waiting on the porch."),
    ("The bus leaves soon.", "Take an umbrella, it is raining."),
]


@pytest.fixture(scope="module")
def quiet_piper(store):
    """The real voice, noise off: the same text always gives the same samples."""
    return VoiceRegistry(store, TtsSettings(threads=1, noise_scale=0.0, noise_w=0.0)).get(PIPER)


def test_streams_served_together_get_exactly_the_samples_each_gets_alone(serve, quiet_piper):
    server = serve(voices={PIPER: quiet_piper}, workers=2)

    async def alone():
        conn = await connect(server)
        try:
            return [decode_sentences((await collect(conn, sentences=t))[1]) for t in TEXTS]
        finally:
            await conn.close()

    async def together():
        conns = [await connect(server) for _ in TEXTS]
        try:
            results = await asyncio.gather(*(collect(c, sentences=t)
                                             for c, t in zip(conns, TEXTS, strict=True)))
            return [decode_sentences(msgs) for _, msgs in results]
        finally:
            for c in conns:
                await c.close()

    solo = run(alone())
    batched = run(together())
    assert max(server.server.metrics.batch_sizes) == 2  # the sentences did run side by side
    for one, many in zip(solo, batched, strict=True):
        assert len(one) == len(many) == 2
        for a, b in zip(one, many, strict=True):
            assert a.size > 0 and np.array_equal(a, b)


class _Failing:
    """The real voice, except that one sentence fails in the model (a fault, not a fake voice)."""

    def __init__(self, voice: Voice, poison: str) -> None:
        self.voice = voice
        self.poison = poison
        self.id = voice.id
        self.sample_rate = voice.sample_rate

    def sentences(self, text: str) -> list[str]:
        return self.voice.sentences(text)

    def synthesize_sentence(self, sentence: str) -> Iterator[np.ndarray]:
        if sentence == self.poison:
            raise RuntimeError("the model failed on this sentence")
        return self.voice.synthesize_sentence(sentence)

    def sessions(self):
        return self.voice.sessions()

    def close(self) -> None:
        pass


def test_a_sentence_that_fails_fails_its_own_stream_alone(serve, quiet_piper):
    poison = "This sentence breaks the model."
    server = serve(voices={PIPER: _Failing(quiet_piper, poison)}, workers=2)

    async def go():
        conns = [await connect(server) for _ in range(3)]
        try:
            return await asyncio.gather(
                collect(conns[0], sentences=TEXTS[0]),
                collect(conns[1], sentences=("First a good one.", poison, "Never reached.")),
                collect(conns[2], sentences=TEXTS[1]))
        finally:
            for c in conns:
                await c.close()

    (_, good1), (_, bad), (_, good2) = run(go())
    assert isinstance(bad[-1], m.Error) and bad[-1].code == ErrorCode.INTERNAL
    assert len(decode_sentences(bad)) == 1  # the sentence before it still came
    for good in (good1, good2):
        assert isinstance(good[-1], m.End) and len(decode_sentences(good)) == 2
    assert server.server.metrics.counters["streams_failed"] == 1


def test_a_client_that_stops_reading_neither_delays_the_others_nor_keeps_its_stream(serve, quiet_piper):
    """One device stops reading in the middle of a long stream; another, asking after it, still
    gets every chunk before its playback deadline, and the stalled stream is dropped (not
    synthesized to the end and held) once it falls behind its own playback, well before the
    write timeout would have closed it."""
    server = serve(voices={PIPER: quiet_piper}, workers=2, write_timeout_s=600, idle_timeout_s=600,
                   chunk_ms=100)
    stalled = handshake_socket(server.port)
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # The kernel's buffers on loopback would hold a minute of audio before the server felt
    # anything; small ones on the server's side of this connection make it seconds.
    (session,) = server.server._sessions
    session.conn._writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    long_text = tuple(f"Sentence {i} fills buffers that nobody reads." for i in range(40))
    try:
        stalled.sendall(m.encode(m.Synth(1, PIPER, long_text, 48000, m.Codec.PCM16)))

        async def reader():
            conn = await connect(server)
            try:
                q: asyncio.Queue = asyncio.Queue()
                asked = time.perf_counter()
                await conn.request(q.put_nowait, TEXTS[2], PIPER, m.Codec.PCM16)
                arrivals, rate = [], 0
                while True:
                    msg = await asyncio.wait_for(q.get(), 60)
                    if isinstance(msg, m.Format):
                        rate = msg.sample_rate
                    elif isinstance(msg, m.Audio):
                        arrivals.append((time.perf_counter(), msg.samples))
                    else:
                        return asked, rate, arrivals, msg
            finally:
                await conn.close()

        _, rate, arrivals, last = run(reader())
        assert isinstance(last, m.End)
        start, played = arrivals[0][0], 0
        for when, samples in arrivals:
            assert when <= start + played / rate + 0.5  # generous: a loaded 2-core machine
            played += samples
        wait_until(lambda: server.server.metrics.counters["streams_late"] == 1, 60,
                   "the stalled stream dropped")
    finally:
        stalled.close()
    metrics = server.server.metrics
    # Dropped: nothing of it is left waiting for a worker or open.
    wait_until(lambda: metrics.open_streams == 0 and metrics.queue_depth == 0 and metrics.in_flight == 0,
               10, "the stalled stream's sentences dropped")


class _Held:
    """The real voice, except that each sentence waits for a permit the test hands out: streams stay
    open exactly as long as the test needs them open, however fast or slow the machine is."""

    def __init__(self, voice: Voice) -> None:
        self.voice = voice
        self.permits = threading.Semaphore(0)
        self.id = voice.id
        self.sample_rate = voice.sample_rate

    def sentences(self, text: str) -> list[str]:
        return self.voice.sentences(text)

    def synthesize_sentence(self, sentence: str) -> Iterator[np.ndarray]:
        if not self.permits.acquire(timeout=60):
            raise RuntimeError("no permit within 60 s")
        return self.voice.synthesize_sentence(sentence)

    def sessions(self):
        return self.voice.sessions()

    def close(self) -> None:
        pass


async def _answered(tasks: list[asyncio.Future], count: int, timeout: float = 30) -> None:
    """Until `count` of `tasks` have their answer (bounded)."""
    enough = asyncio.Event()

    def check(_task: asyncio.Future | None = None) -> None:
        if sum(t.done() for t in tasks) >= count:
            enough.set()

    for task in tasks:
        task.add_done_callback(check)
    check()
    try:
        await asyncio.wait_for(enough.wait(), timeout)
    except TimeoutError:
        raise AssertionError(f"{sum(t.done() for t in tasks)} of {len(tasks)} streams answered "
                             f"within {timeout:g} s, {count} expected") from None


def test_a_client_asking_for_128_streams_at_once_is_held_to_max_streams(serve, quiet_piper):
    """A stream beyond `server.max_streams` (all connections together) is refused the moment it is
    asked for, with BUSY naming the key and the number, never queued; the streams accepted are
    served whole, each with exactly the samples it gets alone; another device is refused while the
    server is full and served once a stream has ended."""
    held = _Held(quiet_piper)
    server = serve(voices={PIPER: held}, workers=2, max_streams=4, max_streams_per_connection=128)
    text = TEXTS[0][:1]

    tasks: list[asyncio.Future] = []

    async def go():
        greedy, other = await connect(server), await connect(server)
        try:
            held.permits.release()
            _, alone = await collect(other, sentences=text)
            tasks[:] = [asyncio.ensure_future(collect(greedy, sentences=text)) for _ in range(128)]
            await _answered(tasks, 124)
            open_now = [t for t in tasks if not t.done()]
            full = server.server.metrics.open_streams
            _, refused_other = await collect(other, sentences=text)
            held.permits.release()  # one sentence: one of the four streams ends
            await _answered(open_now, 1)
            arrived = asyncio.Event()
            late = asyncio.ensure_future(collect(other, sentences=text, answered=arrived))
            await asyncio.wait_for(arrived.wait(), 30)
            held.permits.release(4)
            return alone, open_now, full, refused_other, await late
        finally:
            held.permits.release(1000)  # a failed run leaves no worker waiting on a permit
            for task in tasks:
                task.cancel()
            await greedy.close()
            await other.close()

    alone, open_now, full, refused_other, (_, late) = run(go())
    assert open_now == tasks[:4] and full == 4  # the first four asked are the ones kept
    reference = decode_sentences(alone)
    for _, msgs in (t.result() for t in tasks[:4]):
        assert isinstance(msgs[-1], m.End) and not msgs[-1].cancelled
        assert all(np.array_equal(a, b) for a, b in zip(decode_sentences(msgs), reference, strict=True))
    for _, msgs in (t.result() for t in tasks[4:]):
        assert len(msgs) == 1 and isinstance(msgs[0], m.Error) and msgs[0].code == ErrorCode.BUSY
        assert "server.max_streams=4" in msgs[0].message and "4 open streams" in msgs[0].message
    assert len(refused_other) == 1 and refused_other[0].code == ErrorCode.BUSY
    assert "server.max_streams=4" in refused_other[0].message
    assert isinstance(late[-1], m.End)
    assert all(np.array_equal(a, b) for a, b in zip(decode_sentences(late), reference, strict=True))
    metrics = server.server.metrics
    assert metrics.counters["rejected_busy"] == 125 and metrics.counters["streams_done"] == 6
    wait_until(lambda: metrics.open_streams == 0, 10, "every stream closed")


def test_the_per_connection_cap_still_holds_under_max_streams(serve, quiet_piper):
    """`max_streams_per_connection` below `max_streams`: one device asking for 128 gets its 2
    (TOO_MANY_STREAMS for the rest, naming its limit), another device still gets its own 2 beside
    them, and a third, finding the server full, is refused BUSY; the four accepted end whole."""
    held = _Held(quiet_piper)
    server = serve(voices={PIPER: held}, workers=2, max_streams=4, max_streams_per_connection=2)
    text = TEXTS[1][:1]

    first: list[asyncio.Future] = []
    second: list[asyncio.Future] = []

    async def go():
        conns = [await connect(server) for _ in range(3)]
        try:
            first[:] = [asyncio.ensure_future(collect(conns[0], sentences=text)) for _ in range(128)]
            await _answered(first, 126)
            second[:] = [asyncio.ensure_future(collect(conns[1], sentences=text)) for _ in range(3)]
            await _answered(second, 1)
            _, third = await collect(conns[2], sentences=text)
            held.permits.release(4)
            await asyncio.gather(*first, *second)
            return third
        finally:
            held.permits.release(1000)  # a failed run leaves no worker waiting on a permit
            for task in first + second:
                task.cancel()
            for c in conns:
                await c.close()

    third = run(go())
    results = [[msgs for _, msgs in (t.result() for t in tasks)] for tasks in (first, second)]
    for msgs_of, kept in zip(results, (2, 2), strict=True):
        assert all(isinstance(msgs[-1], m.End) and len(decode_sentences(msgs)) == 1
                   for msgs in msgs_of[:kept])
        refused = [msgs[0] for msgs in msgs_of[kept:]]
        assert all(len(msgs) == 1 for msgs in msgs_of[kept:])
        assert {e.code for e in refused} == {ErrorCode.TOO_MANY_STREAMS}
        assert all("at most 2 open streams per connection" in e.message for e in refused)
    assert len(third) == 1 and third[0].code == ErrorCode.BUSY and "server.max_streams=4" in third[0].message


def test_a_stream_that_cannot_be_served_by_its_deadline_is_refused_at_once(serve, quiet_piper):
    """Ten devices' first sentences (due within their default 1 s) are owed to the only worker; a
    request whose first audio is due within 1 s after them is answered BUSY right away (its
    device speaks locally), not after its deadline; one with room in its deadline is served.
    Earliest deadline first: only work due before the newcomer's counts against it."""
    server = serve(voices={PIPER: quiet_piper}, workers=1, max_streams_per_connection=16)
    sentence = ("The washing machine in the basement has finished its cycle, so please move the "
                "clothes to the dryer before dinner tonight.",)

    async def go():
        conn = await connect(server)
        try:
            await collect(conn, sentences=("Timing the voice.",))  # the server learns its speed
            taken = asyncio.Event()
            owed = [asyncio.ensure_future(collect(conn, sentences=sentence, answered=taken))
                    for _ in range(10)]
            await asyncio.wait_for(taken.wait(), 30)
            asked = time.monotonic()
            _, hurried = await collect(conn, sentences=("Right now, please.",), deadline_ms=1000)
            answered = time.monotonic() - asked
            _, patient = await collect(conn, sentences=("Whenever you can.",), deadline_ms=120_000)
            await asyncio.gather(*owed)
            return hurried, answered, patient
        finally:
            await conn.close()

    hurried, answered, patient = asyncio.run(asyncio.wait_for(go(), 120))
    assert isinstance(hurried[-1], m.Error) and hurried[-1].code == ErrorCode.BUSY
    assert "capacity" in hurried[-1].message and len(hurried) == 1
    assert answered < 0.5  # refused up front, not once the deadline had passed
    assert isinstance(patient[-1], m.End)
    assert server.server.metrics.counters["deadline_missed"] == 0


def test_a_stream_with_nothing_ahead_of_it_is_never_refused(serve, quiet_piper):
    """However slow the voice, refusing a stream that waits for no one makes nothing sooner: after
    streams have come and gone (their bookkeeping summed and taken away), a lone request with a
    deadline shorter than its own sentence is still served."""
    server = serve(voices={PIPER: quiet_piper}, workers=2)

    async def go():
        conns = [await connect(server) for _ in range(3)]
        try:
            for _ in range(2):
                await asyncio.gather(*(collect(c, sentences=TEXTS[i]) for i, c in enumerate(conns)))
            return await collect(conns[0], sentences=TEXTS[3], deadline_ms=1)
        finally:
            for c in conns:
                await c.close()

    _, alone = run(go())
    assert not isinstance(alone[-1], m.Error) or alone[-1].code != ErrorCode.BUSY
