"""The decoder against hostile bytes: only ProtocolError ever escapes, memory stays bounded."""

import contextlib
import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_agent.offload.wire import messages as m
from edge_agent.offload.wire.codecs import SentenceDecoder, SentenceEncoder, available_codecs
from edge_agent.offload.wire.framing import HEADER_SIZE, FrameDecoder, ProtocolError

MAX_PAYLOAD = 4096
BOUND = HEADER_SIZE + MAX_PAYLOAD
CASES = 100_000


def _corpus():
    frames = [
        m.Hello(b"n" * 16, 3, 65536, "edge-agent"),
        m.Challenge(b"s" * 16, 3, 4096, "srv", noauth=True),
        m.Auth(b"a" * 32),
        m.Welcome(b"w" * 32, 3, (m.VoiceInfo("kokoro-82m", 24000),)),
        m.Synth(1, "kokoro-82m", ("Hello.", "World!"), 24000, m.Codec.OPUS, 1500),
        m.Format(1, 24000, m.Codec.OPUS, 480, 156, 2),
        m.End(1, 100, 1, 2),
        m.Cancel(1),
        m.Error(1, 103, "busy"),
        m.Ping(5),
        m.Pong(5),
        m.GoAway(105, "bye"),
    ]
    tone = (0.3 * np.sin(np.arange(2400) * 0.07)).astype(np.float32)
    for codec in sorted(available_codecs()):
        encoder = SentenceEncoder(codec, 24000, MAX_PAYLOAD - 6, chunk_samples=1200)
        chunks = encoder.encode(tone)
        for i, chunk in enumerate(chunks):
            frames.append(m.Audio(1, 0, chunk.samples, chunk.data, last=i == len(chunks) - 1))
    return [m.encode(f) for f in frames]


CORPUS = _corpus()


def _decoders():
    out = {m.Codec.PCM16: lambda: SentenceDecoder(m.Codec.PCM16, 24000)}
    if m.Codec.OPUS in available_codecs():
        out[m.Codec.OPUS] = lambda: SentenceDecoder(m.Codec.OPUS, 24000, 480, 156)
    return out


DECODERS = _decoders()


def _exercise(chunks):
    """Feed `chunks` as a socket would, decode what completes, decode audio too."""
    decoder = FrameDecoder(MAX_PAYLOAD)
    decoded = 0
    try:
        for chunk in chunks:
            for frame in decoder.feed(chunk):
                message = m.decode(frame)
                decoded += 1
                if isinstance(message, m.Audio):
                    for make in DECODERS.values():
                        with contextlib.suppress(ProtocolError):
                            make().decode(message.samples, message.data)
            assert decoder.buffered <= BOUND
        decoder.close()
    except ProtocolError:
        pass
    assert decoder.buffered <= BOUND
    return decoded


def _mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and data:  # flip a bit
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        elif op == 1 and data:  # replace a byte, often in the header
            i = rng.randrange(min(len(data), HEADER_SIZE + 8) if rng.random() < 0.6 else len(data))
            data[i] = rng.randrange(256)
        elif op == 2:  # insert random bytes
            i = rng.randrange(len(data) + 1)
            data[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op == 3 and data:  # delete a run
            i = rng.randrange(len(data))
            del data[i:i + rng.randint(1, 16)]
        elif op == 4:  # truncate
            del data[rng.randrange(len(data) + 1):]
        else:  # splice another valid frame in
            data += rng.choice(CORPUS)
    return bytes(data)


def _split(rng, data):
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randint(0, 4)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def test_hundred_thousand_mutated_streams_raise_only_protocol_errors():
    rng = random.Random(20261202)
    decoded = 0
    for case in range(CASES):
        if case % 10 == 0:
            data = rng.randbytes(rng.randint(0, 64))
        else:
            base = b"".join(rng.choice(CORPUS) for _ in range(rng.randint(1, 3)))
            data = _mutate(rng, base)
        decoded += _exercise(_split(rng, data))
    assert decoded > CASES // 10, "mutations should leave many frames decodable"


def test_valid_streams_decode_whatever_the_split():
    rng = random.Random(7)
    for _ in range(2000):
        frames = [rng.choice(CORPUS) for _ in range(rng.randint(1, 5))]
        assert _exercise(_split(rng, b"".join(frames))) == len(frames)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=300), max_size=6))
def test_arbitrary_bytes_raise_only_protocol_errors(chunks):
    _exercise(chunks)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CORPUS), st.integers(0, 11), st.integers(0, 255), st.binary(max_size=40))
def test_valid_frames_with_a_corrupted_header_byte_and_tail(frame, index, value, tail):
    data = bytearray(frame)
    data[index] = value
    _exercise([bytes(data) + tail])
