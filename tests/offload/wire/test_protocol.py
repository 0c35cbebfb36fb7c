import struct
import tracemalloc

import pytest

from edge_agent.offload.wire import messages as m
from edge_agent.offload.wire.framing import (
    HEADER_SIZE,
    BadFlags,
    BadMagic,
    BadStreamId,
    FrameDecoder,
    FrameTooLarge,
    MalformedPayload,
    MessageType,
    ProtocolError,
    Truncated,
    UnknownMessageType,
    UnsupportedVersion,
    encode_frame,
)

ALL = [
    m.Hello(b"n" * 16, 3, 65536, "edge-agent 0.1"),
    m.Challenge(b"s" * 16, 1, 4096, "server", noauth=True),
    m.Auth(b"a" * 32),
    m.Welcome(b"w" * 32, 3, (m.VoiceInfo("kokoro-82m", 24000), m.VoiceInfo("en_US-joe-medium", 22050))),
    m.Synth(7, "kokoro-82m", ("Hello there.", "Ünïcode — fine!"), 24000, m.Codec.OPUS, 1500),
    m.Format(7, 24000, m.Codec.OPUS, 480, 156, 2),
    m.Audio(7, 1, 3, b"\x01\x00\x02\x00\x03\x00", last=True),
    m.End(7, 48000, 12, 800, cancelled=True),
    m.Cancel(7),
    m.Error(0, 4, "authentication failed"),
    m.Error(9, 103, "busy"),
    m.Ping(2**64 - 1),
    m.Pong(0),
    m.Pong(5, m.Load(queue_depth=3, streams=2)),
    m.GoAway(105, "bye"),
]


def header(kind=0x20, flags=0, stream=0, length=8, magic=0xED53, version=1):
    return struct.pack(">HBBII", magic, version, kind, (flags << 24) | stream, length)


@pytest.mark.parametrize("message", ALL, ids=lambda x: type(x).__name__)
def test_every_message_round_trips(message):
    frames = FrameDecoder().feed(m.encode(message))
    assert len(frames) == 1
    assert m.decode(frames[0]) == message


def test_byte_by_byte_feeding_gives_the_same_messages():
    wire = b"".join(m.encode(x) for x in ALL)
    decoder = FrameDecoder()
    got = []
    for i in range(len(wire)):
        got.extend(m.decode(f) for f in decoder.feed(wire[i:i + 1]))
        assert decoder.buffered <= HEADER_SIZE + decoder.max_payload
    assert got == ALL
    decoder.close()


def test_header_layout_is_twelve_big_endian_bytes():
    wire = m.encode(m.Audio(0x010203, 5, 1, b"\x00\x00", last=True))
    assert len(wire) == HEADER_SIZE + 8
    assert wire[:HEADER_SIZE] == bytes([0xED, 0x53, 1, 0x12, 0x01, 0x01, 0x02, 0x03, 0, 0, 0, 8])


def test_header_claiming_two_gib_is_rejected_before_any_allocation():
    decoder = FrameDecoder(max_payload=65536)
    tracemalloc.start()
    try:
        with pytest.raises(FrameTooLarge, match="2147483648 bytes"):
            decoder.feed(header(kind=MessageType.AUDIO, stream=1, length=2**31))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    assert decoder.buffered == 0


def test_oversized_frame_is_rejected_even_when_the_header_arrives_in_pieces():
    decoder = FrameDecoder(max_payload=4096)
    wire = header(kind=MessageType.AUDIO, stream=1, length=4097)
    decoder.feed(wire[:5])
    with pytest.raises(FrameTooLarge):
        decoder.feed(wire[5:])


def test_decoder_is_dead_after_a_violation():
    decoder = FrameDecoder()
    with pytest.raises(BadMagic):
        decoder.feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(BadMagic):
        decoder.feed(m.encode(m.Ping(1)))


def test_truncated_frame_at_close_is_an_error():
    wire = m.encode(m.Synth(1, "v", ("Hello.",)))
    for cut in (1, HEADER_SIZE - 1, HEADER_SIZE, len(wire) - 1):
        decoder = FrameDecoder()
        assert decoder.feed(wire[:cut]) == []
        assert decoder.mid_frame
        with pytest.raises(Truncated):
            decoder.close()


def test_close_between_frames_is_clean():
    decoder = FrameDecoder()
    decoder.feed(m.encode(m.Ping(1)))
    assert not decoder.mid_frame
    decoder.close()


@pytest.mark.parametrize(("wire", "error"), [
    (header(version=2), UnsupportedVersion),
    (header(kind=0x7F), UnknownMessageType),
    (header(kind=MessageType.PING, flags=1), BadFlags),
    (header(kind=MessageType.AUDIO, flags=0x02, stream=1, length=6), BadFlags),
    (header(kind=MessageType.PING, stream=3), BadStreamId),
    (header(kind=MessageType.SYNTH, stream=0, length=20), BadStreamId),
    (header(kind=MessageType.PING, length=9), MalformedPayload),
    (header(kind=MessageType.AUTH, length=31), MalformedPayload),
    (header(kind=MessageType.CANCEL, stream=1, length=1), MalformedPayload),
])
def test_header_violations_raise_their_own_error(wire, error):
    with pytest.raises(error):
        FrameDecoder().feed(wire)


@pytest.mark.parametrize(("kind", "stream", "payload"), [
    (MessageType.SYNTH, 1, bytes([1]) + struct.pack(">II", 0, 0) + bytes([5]) + b"ab"),  # voice runs off
    (MessageType.SYNTH, 1, bytes([1]) + struct.pack(">II", 0, 0) + bytes([1]) + b"v\xff\xfe"),  # bad UTF-8
    (MessageType.SYNTH, 1, bytes([9]) + struct.pack(">II", 0, 0) + bytes([1]) + b"vtext"),  # unknown codec
    (MessageType.HELLO, 0, b"n" * 16 + bytes([1]) + struct.pack(">I", 65536) + bytes([3]) + b"ab"),
    (MessageType.ERROR, 0, struct.pack(">HH", 1, 2) + b"abc"),  # trailing byte
    (MessageType.WELCOME, 0, b"w" * 32 + bytes([1, 2]) + bytes([1]) + b"v" + struct.pack(">I", 1)),
    (MessageType.FORMAT, 1, struct.pack(">IBHHH", 0, 1, 0, 0, 1)),  # zero sample rate
])
def test_malformed_payloads_are_rejected(kind, stream, payload):
    frames = FrameDecoder().feed(encode_frame(kind, 0, stream, payload))
    with pytest.raises(MalformedPayload):
        m.decode(frames[0])


def test_every_protocol_error_is_a_protocol_error_with_a_code():
    for error in (BadMagic, UnsupportedVersion, FrameTooLarge, MalformedPayload, Truncated):
        assert issubclass(error, ProtocolError)
        assert int(error.code) > 0


def test_sentences_travel_one_per_line():
    message = m.Synth(3, "", ("One.", "Two?", "Three!"))
    assert m.decode(FrameDecoder().feed(m.encode(message))[0]).sentences == ("One.", "Two?", "Three!")
    with pytest.raises(ValueError, match="newline"):
        m.encode(m.Synth(3, "", ("One.\nTwo.",)))


def test_streams_interleave_on_one_connection():
    wire = b"".join(m.encode(m.Audio(sid, 0, 1, b"\x00\x00", last=i == 2))
                    for i in range(3) for sid in (1, 3))
    got = [m.decode(f) for f in FrameDecoder().feed(wire)]
    assert [x.stream for x in got] == [1, 3, 1, 3, 1, 3]
    assert [x.last for x in got if x.stream == 3] == [False, False, True]


def test_pong_load_is_optional_and_clamped_to_its_field():
    assert len(m.Pong(1).payload()) == 8  # what a client (or an older server) sends
    wire = m.encode(m.Pong(1, m.Load(queue_depth=70000, streams=4)))
    (frame,) = FrameDecoder().feed(wire)
    assert m.decode(frame) == m.Pong(1, m.Load(0xFFFF, 4))


def test_pong_with_a_partial_load_field_is_malformed():
    wire = header(kind=0x21, length=10) + bytes(10)
    (frame,) = FrameDecoder().feed(wire)
    with pytest.raises(MalformedPayload):
        m.decode(frame)
