import io
import sys
import wave

import numpy as np
import pytest

from edge_agent.audio.sinks import AudioUnavailable
from edge_agent.audio.sources import TARGET_RATE, PcmStreamSource, SoundDeviceSource, WavFileSource
from edge_agent.audio.wav import encode_pcm
from edge_agent.errors import AudioError
from tests.speech_fixtures import RATE, write_wav


def tone(freq: float, seconds: float, rate: int) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def read_all(source) -> np.ndarray:
    return np.concatenate(list(source.blocks()))


def dominant_frequency(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
@pytest.mark.parametrize("channels", [1, 2])
def test_any_rate_and_channel_count_becomes_16k_mono(tmp_path, rate, channels):
    path = write_wav(tmp_path / "in.wav", tone(440, 2.0, rate), rate, channels)
    out = read_all(WavFileSource(path, block_s=0.1))
    assert out.dtype == np.float32 and out.ndim == 1
    assert abs(len(out) - 2 * TARGET_RATE) <= 2
    assert dominant_frequency(out, TARGET_RATE) == pytest.approx(440, abs=2)
    assert np.max(np.abs(out)) == pytest.approx(0.5, abs=0.02)


def test_stereo_channels_are_averaged(tmp_path):
    left = tone(300, 1.0, RATE)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)
    out = read_all(WavFileSource(write_wav(tmp_path / "st.wav", stereo, RATE, 2)))
    np.testing.assert_allclose(out, left / 2, atol=1e-4)


@pytest.mark.parametrize("width", [1, 2, 4])
def test_sample_widths_decode_to_the_same_signal(tmp_path, width):
    signal = tone(200, 0.5, RATE)
    out = read_all(WavFileSource(write_wav(tmp_path / "w.wav", signal, RATE, 1, width)))
    np.testing.assert_allclose(out, signal, atol=0.02 if width == 1 else 1e-4)


def test_blocks_are_the_requested_length_until_the_end(tmp_path):
    path = write_wav(tmp_path / "b.wav", tone(100, 1.05, RATE), RATE)
    sizes = [len(b) for b in WavFileSource(path, block_s=0.25).blocks()]
    assert sizes[:4] == [4000] * 4 and sum(sizes) == 16800


def test_truncated_wav_is_refused_before_reading(tmp_path):
    path = write_wav(tmp_path / "t.wav", tone(100, 1.0, RATE), RATE)
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(AudioError, match="truncated"):
        WavFileSource(path)


@pytest.mark.parametrize(("content", "reason"), [
    (b"", "empty file"),
    (b"hello", "too short"),
    (b"ID3\x04" + bytes(200), "RIFF"),
])
def test_non_wav_input_is_named(tmp_path, content, reason):
    path = tmp_path / "x.wav"
    path.write_bytes(content)
    with pytest.raises(AudioError, match=f"not a PCM WAV file .*{reason}"):
        WavFileSource(path)


def test_wav_without_frames_is_empty_input(tmp_path):
    path = write_wav(tmp_path / "e.wav", np.zeros(0), RATE)
    with pytest.raises(AudioError, match="contains no audio"):
        WavFileSource(path)


@pytest.mark.parametrize("rate", [100, 1_000_000])
def test_implausible_sample_rate_is_refused(tmp_path, rate):
    path = tmp_path / "r.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(bytes(4000))
    with pytest.raises(AudioError, match=r"sample rate .* is outside"):
        WavFileSource(path)


def test_missing_file_and_directory_are_named(tmp_path):
    with pytest.raises(AudioError, match="no such file"):
        WavFileSource(tmp_path / "nope.wav")
    with pytest.raises(AudioError, match="is a directory"):
        WavFileSource(tmp_path)


def test_raw_pcm_stream_is_converted_and_a_partial_frame_ignored():
    signal = tone(440, 1.0, 48000)
    stereo = np.repeat(signal[:, None], 2, axis=1)
    raw = (stereo * 32767).astype("<i2").tobytes() + b"\x01"
    out = read_all(PcmStreamSource(io.BytesIO(raw), rate=48000, channels=2))
    assert abs(len(out) - TARGET_RATE) <= 2
    assert dominant_frequency(out, TARGET_RATE) == pytest.approx(440, abs=2)


def test_empty_raw_stream_is_an_error():
    with pytest.raises(AudioError, match="no audio"):
        list(PcmStreamSource(io.BytesIO(b"")).blocks())


def test_raw_stream_with_a_bad_rate_is_refused():
    with pytest.raises(AudioError, match="sample rate 10 Hz"):
        PcmStreamSource(io.BytesIO(b""), rate=10)


def test_microphone_without_portaudio_or_device_is_a_clear_error():
    from edge_agent.audio.sinks import import_sounddevice

    try:
        import_sounddevice()  # as the agent imports it: the signal mask put back
    except AudioUnavailable:
        pass
    else:
        pytest.skip("PortAudio is installed here; the no-library path cannot be shown")
    with pytest.raises(AudioUnavailable, match="PortAudio is not installed"):
        SoundDeviceSource()


def riff(fmt_tag, channels, rate, bits, data, extra_chunks=b"", extensible_tag=None, data_size=None):
    """A WAV file built by hand: any format tag, optional WAVE_FORMAT_EXTENSIBLE, extra chunks."""
    import struct

    align = channels * bits // 8
    fmt = struct.pack("<HHIIHH", fmt_tag, channels, rate, rate * align, align, bits)
    if extensible_tag is not None:
        guid_tail = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        fmt += struct.pack("<HHI", 22, bits, 0) + struct.pack("<H", extensible_tag) + guid_tail
    size = len(data) if data_size is None else data_size
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra_chunks
            + b"data" + struct.pack("<I", size) + data)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_float_wav_is_read(tmp_path):
    signal = tone(440, 1.0, RATE)
    path = tmp_path / "f.wav"
    path.write_bytes(riff(3, 1, RATE, 32, signal.astype("<f4").tobytes()))
    np.testing.assert_allclose(read_all(WavFileSource(path)), signal, atol=1e-6)


def test_extensible_24_bit_four_channel_wav_with_extra_chunks_is_read(tmp_path):
    signal = tone(440, 1.0, 48000)
    ints = np.round(np.repeat(signal[:, None], 4, axis=1) * (2**23 - 1)).astype("<i4")
    data = b"".join(int(v).to_bytes(4, "little", signed=True)[:3] for v in ints.reshape(-1))
    listing = b"LIST" + (5).to_bytes(4, "little") + b"INFOx\x00"  # odd size: padded
    path = tmp_path / "x.wav"
    path.write_bytes(riff(0xFFFE, 4, 48000, 24, data, listing, extensible_tag=1))
    out = read_all(WavFileSource(path))
    assert abs(len(out) - RATE) <= 2 and dominant_frequency(out, RATE) == pytest.approx(440, abs=2)


def test_streamed_wav_with_unknown_data_size_reads_to_the_end(tmp_path):
    signal = tone(300, 0.5, RATE)
    path = tmp_path / "s.wav"
    path.write_bytes(riff(1, 1, RATE, 16, (signal * 32767).astype("<i2").tobytes(), data_size=0xFFFFFFFF))
    assert len(read_all(WavFileSource(path))) == len(signal)


def test_compressed_wav_is_named_as_such(tmp_path):
    path = tmp_path / "mp3.wav"
    path.write_bytes(riff(0x55, 1, RATE, 16, bytes(1000)))
    with pytest.raises(AudioError, match="format tag 0x55; compressed audio"):
        WavFileSource(path)


def test_a_fifo_is_read_as_writers_come_and_go_until_closed(tmp_path):
    import threading

    from edge_agent.audio.sources import PipeSource
    from tests.waiting import wait_until

    fifo = tmp_path / "mic.pcm"
    source = PipeSource(str(fifo), rate=8000)  # created: nobody has to make it first
    got: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: got.extend(source.blocks()), daemon=True)
    reader.start()
    pcm = encode_pcm(tone(250, 0.5, 8000), 2)
    for piece in (pcm[:4000], pcm[4000:6000], pcm[6000:]):
        with fifo.open("wb") as writer:  # each writer closes: no end of stream for the reader
            writer.write(piece)
    # 8000 samples at 16 kHz were sent; the resampler keeps its last ~1400 until more comes
    wait_until(lambda: sum(map(len, list(got))) >= 6000, what="the audio of both writers")
    assert reader.is_alive()
    source.close()  # nothing is being written: the reader still stops
    reader.join(5)
    assert not reader.is_alive()
    out = np.concatenate(got)
    assert dominant_frequency(out, TARGET_RATE) == pytest.approx(250, abs=3)


# A recorder writing into a FIFO (`arecord -t raw > fifo`): a continuous 250 Hz tone at 8 kHz,
# s16le, in pieces that cut samples in half, paced like a microphone; SIGPIPE kills it as it
# kills arecord when its reader goes away.
FIFO_WRITER = """
import os, signal, sys, time
import numpy as np
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
fd = os.open(sys.argv[1], os.O_WRONLY)
t = np.arange(8000 * 600) / 8000
pcm = (0.5 * 32767 * np.sin(2 * np.pi * 250 * t)).astype("<i2").tobytes()
start = time.monotonic()
for at in range(0, len(pcm), 333):
    os.write(fd, pcm[at:at + 333])
    time.sleep(max(0.0, at / 16000 - (time.monotonic() - start)))  # pacing: 16000 bytes a second
"""


def test_a_fifo_writer_lives_through_a_closed_source_and_the_next_source_hears_it_in_step(tmp_path):
    import signal
    import subprocess
    import sys

    from edge_agent.audio.sources import HeldPipe, PipeSource, release_pipes
    from tests.waiting import wait_until

    fifo = tmp_path / "mic.pcm"
    first = PipeSource(str(fifo), rate=8000)  # the device listening
    writer = subprocess.Popen([sys.executable, "-c", FIFO_WRITER, str(fifo)])
    try:
        blocks = first.blocks()
        assert next(blocks).size  # audio flows
        first.close()  # muted: the hearing stops here
        blocks.close()
        pipe = HeldPipe._held[str(fifo)]
        wait_until(lambda: pipe.drained >= 16000, what="a second of audio written and discarded while muted")
        assert writer.poll() is None  # the writer still has a reader

        second = PipeSource(str(fifo), rate=8000)  # unmuted
        heard: list[np.ndarray] = []
        for block in second.blocks():
            heard.append(block)
            if sum(map(len, heard)) >= TARGET_RATE:
                break
        second.close()
        # Whatever the drain's reads cut, the second source starts on a sample boundary: a
        # byte off and the tone would be noise.
        assert dominant_frequency(np.concatenate(heard), TARGET_RATE) == pytest.approx(250, abs=3)
        assert writer.poll() is None

        release_pipes()  # the daemon's shutdown: now the writer has no reader
        assert writer.wait(30) == -signal.SIGPIPE
    finally:
        writer.kill()
        writer.wait()
        release_pipes()


def test_a_fifo_writer_that_leaves_half_a_sample_does_not_shift_the_next_one(tmp_path, caplog):
    import logging
    import threading

    from edge_agent.audio.sources import HeldPipe, PipeSource
    from tests.waiting import wait_until

    # Seen: one odd byte left by a writer shifted every later writer's samples by a byte, for
    # good: the device heard noise and said nothing.
    fifo = tmp_path / "mic.pcm"
    source = PipeSource(str(fifo), rate=8000)
    got: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: got.extend(source.blocks()), daemon=True)
    try:
        with caplog.at_level(logging.WARNING):
            reader.start()
            with fifo.open("wb") as writer:
                writer.write(encode_pcm(tone(250, 0.5, 8000), 2) + b"\x01")  # and half a sample
            pipe = HeldPipe._held[str(fifo)]
            wait_until(lambda: pipe.partials_dropped == 1, what="the half sample dropped")
            before = sum(map(len, list(got)))
            with fifo.open("wb") as writer:
                writer.write(encode_pcm(tone(400, 1.0, 8000), 2))
            wait_until(lambda: sum(map(len, list(got))) >= before + 12000, what="the second writer heard")
    finally:
        source.close()
        reader.join(5)
    second = np.concatenate(got)[before + 2000:before + 12000]  # past the resampler's seam
    assert dominant_frequency(second, TARGET_RATE) == pytest.approx(400, abs=3)
    assert np.max(np.abs(second)) == pytest.approx(0.5, abs=0.02)  # a byte off: noise at full scale
    assert "a writer left in the middle of a sample; dropped its 1 byte(s)" in caplog.text


def test_a_fifo_writer_a_byte_out_of_step_is_set_in_step_and_the_trouble_told(tmp_path):
    import threading

    from edge_agent.audio.sources import PipeSource
    from tests.waiting import wait_until

    # A writer that stays: no end of its stream tells that it wrote half a sample first.
    fifo = tmp_path / "mic.pcm"
    source = PipeSource(str(fifo), rate=8000)
    said: list[str | None] = []
    source.on_trouble = said.append
    got: list[np.ndarray] = []
    reader = threading.Thread(target=lambda: got.extend(source.blocks()), daemon=True)
    reader.start()
    try:
        # A tone in a room's hiss: random low bytes, as every microphone's (a pure tone's are
        # periodic, and a byte off it is no noise).
        hiss = np.random.default_rng(0).normal(0, 0.01, 6 * 8000).astype(np.float32)
        with fifo.open("wb") as writer:
            writer.write(b"\x01" + encode_pcm(tone(400, 6.0, 8000) + hiss, 2))
            wait_until(lambda: None in said, what="the stream in step again")
            before = sum(map(len, list(got)))
            writer.write(encode_pcm(tone(400, 1.0, 8000), 2))
            wait_until(lambda: sum(map(len, list(got))) >= before + 12000, what="a second heard after")
    finally:
        source.close()
        reader.join(5)
    assert said[0] == (f"audio.input_pipe ({fifo}): the stream was a byte out of step "
                       "(half a sample written?); skipped a byte")
    assert said[-1] is None and source.realigned == 1
    after = np.concatenate(got)[before:before + 12000]
    assert dominant_frequency(after, TARGET_RATE) == pytest.approx(400, abs=3)
    assert np.max(np.abs(after)) < 0.6  # a byte off: noise at full scale


def test_a_fifo_that_brings_only_noise_is_told_as_trouble(tmp_path):
    import subprocess
    import threading

    from edge_agent.audio.sources import PipeSource, release_pipes
    from tests.waiting import wait_until

    fifo = tmp_path / "mic.pcm"
    source = PipeSource(str(fifo))
    said: list[str | None] = []
    source.on_trouble = said.append
    writer = subprocess.Popen(["sh", "-c", f"exec cat /dev/urandom > {fifo}"])
    reader = threading.Thread(target=lambda: list(source.blocks()), daemon=True)
    reader.start()
    try:
        wait_until(lambda: said, what="the noise told")
    finally:
        source.close()
        reader.join(5)
        writer.kill()
        writer.wait()
        release_pipes()
    assert said == [f"audio.input_pipe ({fifo}): hears only noise at full scale "
                    "(is it 16000 Hz, 16-bit little-endian PCM?)"]


def test_a_fifo_written_faster_than_real_time_is_heard_at_a_bounded_pace_and_loses_nothing(tmp_path):
    import subprocess
    import time

    from edge_agent.audio.sources import MAX_INPUT_SPEED, PACE_BURST_S, PipeSource, release_pipes

    # Seen: a writer copying as fast as it could kept a core busy hearing it.
    fifo = tmp_path / "mic.pcm"
    source = PipeSource(str(fifo), rate=8000)
    pcm = encode_pcm(tone(250, 8.0, 8000), 2)  # 8 s, written at once
    writer = subprocess.Popen([sys.executable, "-c",
                               "import sys; open(sys.argv[1], 'wb').write(sys.stdin.buffer.read())",
                               str(fifo)], stdin=subprocess.PIPE)
    try:
        started = time.monotonic()
        writer.stdin.write(pcm)
        writer.stdin.close()
        heard: list[np.ndarray] = []
        for block in source.blocks():
            heard.append(block)
            if sum(map(len, heard)) >= 7.5 * TARGET_RATE:
                break
        elapsed = time.monotonic() - started
        assert writer.wait(10) == 0
    finally:
        source.close()
        writer.kill()
        release_pipes()
    # A lower bound, which load can only lengthen: after the head start, no faster than the pace.
    assert elapsed >= (7.5 - PACE_BURST_S) / MAX_INPUT_SPEED
    assert dominant_frequency(np.concatenate(heard), TARGET_RATE) == pytest.approx(250, abs=2)


def test_a_path_that_is_not_a_fifo_is_refused(tmp_path):
    from edge_agent.audio.sources import PipeSource

    regular = tmp_path / "file.pcm"
    regular.write_bytes(b"\0" * 100)
    with pytest.raises(AudioUnavailable, match="not a FIFO"):
        PipeSource(str(regular))
    with pytest.raises(AudioUnavailable, match="cannot open"):
        PipeSource(str(tmp_path / "no-such-dir" / "mic.pcm"))
