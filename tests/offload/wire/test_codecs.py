import numpy as np
import pytest

from edge_agent.offload.wire.codecs import (
    OPUS_RATES,
    SentenceDecoder,
    SentenceEncoder,
    available_codecs,
    opus_rate,
)
from edge_agent.offload.wire.framing import MalformedPayload
from edge_agent.offload.wire.messages import Codec

needs_opus = pytest.mark.skipif(Codec.OPUS not in available_codecs(), reason="libopus not loadable")


def speechlike(seconds=1.3, rate=24000):
    t = np.arange(int(seconds * rate)) / rate
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    tone = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((180, 360, 540, 1200, 2400), 1))
    return (0.2 * envelope * tone).astype(np.float32)


def round_trip(codec, audio, rate=24000, max_data=65530, chunk=4096):
    enc = SentenceEncoder(codec, rate, max_data, chunk_samples=chunk)
    chunks = enc.encode(audio)
    dec = SentenceDecoder(codec, rate, enc.frame_samples, enc.pre_skip)
    return chunks, np.concatenate([dec.decode(c.samples, c.data) for c in chunks])


def test_pcm16_round_trip_is_exact_to_16_bits():
    audio = speechlike()
    chunks, out = round_trip(Codec.PCM16, audio)
    assert len(out) == len(audio)
    assert np.max(np.abs(out - audio)) < 1 / 16384
    assert all(len(c.data) == 2 * c.samples <= 8192 for c in chunks)


def test_opus_is_in_the_default_install():
    assert Codec.OPUS in available_codecs()


@needs_opus
@pytest.mark.parametrize("rate", [16000, 24000, 48000])
def test_opus_round_trip_keeps_length_and_waveform(rate):
    audio = speechlike(rate=rate)
    _chunks, out = round_trip(Codec.OPUS, audio, rate=rate)
    assert len(out) == len(audio)
    # Opus at speech bitrates is perceptual, not waveform-exact: check alignment (the
    # pre-skip trim), level and the energy envelope rather than sample-wise SNR.
    inner = slice(2000, -2000)
    best = max(range(-40, 41), key=lambda lag: float(np.dot(audio[inner], np.roll(out, lag)[inner])))
    assert abs(best) <= 8
    level = np.sqrt(np.mean(out[inner] ** 2) / np.mean(audio[inner] ** 2))
    assert 0.8 < level < 1.25
    frames = len(audio) // 240
    env_in = np.sqrt(np.mean(audio[: frames * 240].reshape(frames, 240) ** 2, axis=1))
    env_out = np.sqrt(np.mean(out[: frames * 240].reshape(frames, 240) ** 2, axis=1))
    assert np.corrcoef(env_in, env_out)[0, 1] > 0.95


@needs_opus
def test_opus_is_far_smaller_than_pcm():
    audio = speechlike(seconds=3.0)
    opus, _ = round_trip(Codec.OPUS, audio)
    pcm, _ = round_trip(Codec.PCM16, audio)
    assert sum(len(c.data) for c in opus) * 8 < sum(len(c.data) for c in pcm)


@needs_opus
def test_opus_chunks_respect_the_frame_limit():
    chunks, out = round_trip(Codec.OPUS, speechlike(seconds=2.0), max_data=300, chunk=24000)
    assert all(len(c.data) <= 300 for c in chunks)
    assert len(chunks) > 3
    assert len(out) == int(2.0 * 24000)


@pytest.mark.parametrize("codec", sorted(available_codecs()))
def test_empty_sentence_still_yields_one_chunk(codec):
    chunks, out = round_trip(codec, np.zeros(0, dtype=np.float32))
    assert len(chunks) == 1
    assert len(out) == 0


def test_opus_rate_rounds_up_to_a_rate_opus_supports():
    assert opus_rate(22050) == 24000
    assert opus_rate(16000) == 16000
    assert opus_rate(96000) == 48000
    assert set(OPUS_RATES) >= {opus_rate(r) for r in (8000, 11025, 44100)}
    with pytest.raises(ValueError, match="22050"):
        SentenceEncoder(Codec.OPUS, 22050, 65530)


def test_pcm_chunk_with_a_wrong_sample_count_is_malformed():
    with pytest.raises(MalformedPayload):
        SentenceDecoder(Codec.PCM16, 22050).decode(3, b"\x00\x00")


@needs_opus
def test_opus_chunk_claiming_more_samples_than_it_holds_is_malformed():
    chunks, _ = round_trip(Codec.OPUS, speechlike(seconds=0.2))
    dec = SentenceDecoder(Codec.OPUS, 24000, 480, 156)
    with pytest.raises(MalformedPayload):
        dec.decode(chunks[0].samples + 10_000, chunks[0].data)


@needs_opus
@pytest.mark.parametrize("data", [b"\x00", b"\x00\x00", b"\x00\x10abc", b"\x00\x03\xff\xff\xff"])
def test_corrupt_opus_data_is_malformed(data):
    with pytest.raises(MalformedPayload):
        SentenceDecoder(Codec.OPUS, 24000, 480, 0).decode(480, data)


@needs_opus
def test_implausible_opus_format_is_malformed():
    with pytest.raises(MalformedPayload):
        SentenceDecoder(Codec.OPUS, 22050, 480, 0)
    with pytest.raises(MalformedPayload):
        SentenceDecoder(Codec.OPUS, 24000, 0, 0)
