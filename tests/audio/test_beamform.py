"""The beamformer (`audio.mic_geometry`): steering on real people's speech in a simulated room, bad boards."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from edge_agent.audio.beamform import (
    FRAME,
    HOP,
    PRESETS,
    SPEED_OF_SOUND,
    Beamformer,
    bank_delays,
    parse_geometry,
)
from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.sources import PipeSource, WavFileSource, release_pipes
from edge_agent.text.wer import words
from tests.speech_fixtures import run_cli, silence, write_wav

RATE = 16000
LATENCY = FRAME - HOP
REAL = Path(__file__).resolve().parents[1] / "data" / "real" / "wake"
REAL_TALKER = REAL / "alexa" / "0.flac"
REAL_BABBLE = (REAL / "near" / "computer" / "8e565da3-7a12-4095-89d9-8f37cabcce91.flac",
               REAL / "near" / "snowboy" / "11874e00-d382-4e7f-9261-f9b7aa7e100a.flac",
               REAL / "near" / "view_glass" / "11c839b8-0b6d-4b0c-9e3f-82524f2c0515.flac")
"""Four real people (`tests/data/real/NOTICE.md`): one talks to the device, three others at once."""


def real(path: Path) -> np.ndarray:
    """A real recording, its level brought to the talkers' (-26 dBFS RMS) and its silence cut."""
    import soundfile

    from benchmarks.realroom import trimmed

    x, rate = soundfile.read(str(path), dtype="float32")
    assert rate == RATE
    x = trimmed(x)
    return (x * 0.05 / np.sqrt(np.mean(x ** 2))).astype(np.float32)


def noise_burst(seconds: float, seed: int = 1) -> np.ndarray:
    """A quiet quarter second (the floor), then a broadband sound 60 dB louder (what steers)."""
    x = np.random.default_rng(seed).standard_normal(int(seconds * RATE)) * 0.1
    x[:RATE // 4] *= 1e-3
    return x.astype(np.float32)


def delayed(x: np.ndarray, d: int) -> np.ndarray:
    return np.concatenate([np.zeros(d, dtype=np.float32), x[:x.size - d]])


def corr(a: np.ndarray, b: np.ndarray) -> float:
    n = min(a.size, b.size)
    return float(np.corrcoef(a[:n], b[:n])[0, 1])


def tbr_db(t: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(t.astype(np.float64) ** 2) / np.sum(b.astype(np.float64) ** 2)))


def test_presets_and_positions_parse_and_bad_geometry_is_refused():
    assert parse_geometry("respeaker_2mic") == PRESETS["respeaker_2mic"]
    assert parse_geometry("-0.03,0 0.03,0") == ((-0.03, 0.0), (0.03, 0.0))
    with pytest.raises(ValueError, match="beamformer"):
        AudioSettings(mic_geometry="respeaker_2mic", beamformer="mvdr")
    for bad in ("nonsense", "0,0", "0,0 1", "0,0 5,0", "nan,0 0,0"):
        with pytest.raises(ValueError, match="mic_geometry"):
            AudioSettings(mic_geometry=bad)


def in_a_room(preset: str) -> tuple[np.ndarray, np.ndarray]:
    """One real person talking to a board in a simulated room (5 x 4 x 2.7 m, RT60 0.45 s) and three
    others at once, 10 dB below at the first microphone: the talker's and the babble's channels,
    (microphones, samples) each."""
    pra = pytest.importorskip("pyroomacoustics")
    talker = np.concatenate([silence(0.5), real(REAL_TALKER), silence(0.3)]).astype(np.float32)
    n = talker.size
    pos = np.asarray(PRESETS[preset])
    mics = np.c_[pos + np.array([2.5, 2.0]), np.full(len(pos), 0.9)].T
    absorption, order = pra.inverse_sabine(0.45, [5.0, 4.0, 2.7])

    def heard(signal: np.ndarray, where: list[float]) -> np.ndarray:
        room = pra.ShoeBox([5.0, 4.0, 2.7], fs=RATE, materials=pra.Material(absorption), max_order=order)
        room.add_source(where, signal=signal)
        room.add_microphone_array(mics)
        room.simulate()
        out: np.ndarray = room.mic_array.signals[:, :n]
        return out

    t = heard(talker, [3.9, 3.4, 1.2])
    b = sum(heard(np.resize(real(path), n), where)
            for path, where in zip(REAL_BABBLE, ([0.6, 0.8, 1.2], [4.5, 0.7, 1.1], [0.8, 3.5, 1.3]),
                                   strict=True))
    b = b * 10 ** (-10 / 20) * np.sqrt(np.sum(t[0] ** 2) / np.sum(b[0] ** 2))  # 10 dB at the first mic
    return t, b


@pytest.mark.parametrize(("preset", "method", "least_db"), [
    # Measured on these four people: delay-and-sum +0.14 dB (2 mics) and +0.26 dB (4); superdirective
    # +1.51 and +4.73 dB.
    ("respeaker_2mic", "delay_sum", 0.05), ("respeaker_4mic", "delay_sum", 0.1),
    ("respeaker_2mic", "superdirective", 1.0), ("respeaker_4mic", "superdirective", 3.0)])
def test_steered_at_a_talker_it_raises_the_talker_to_babble_ratio_in_a_simulated_room(
        preset, method, least_db):
    t, b = in_a_room(preset)
    channels = t.shape[0]
    # Steer on the mixture, then put the talker and the babble alone through the same steering,
    # hop by hop, to measure what it did to each.
    steering: list[np.ndarray] = []
    live = Beamformer(PRESETS[preset], channels, RATE, method=method)
    track = live._track

    def tracked(spectrum: np.ndarray) -> None:
        track(spectrum)
        steering.append(live.delays.copy())

    live._track = tracked  # type: ignore[method-assign]
    live.process((t + b).T.astype(np.float32))

    def replayed(part: np.ndarray) -> np.ndarray:
        bf = Beamformer(PRESETS[preset], channels, RATE, method=method)
        steps = iter(steering)
        bf._track = lambda _s: setattr(bf, "delays", next(steps))  # type: ignore[method-assign]
        return bf.process(part.T.astype(np.float32))

    averaged = tbr_db(t.mean(axis=0), b.mean(axis=0))
    steered = tbr_db(replayed(t), replayed(b))
    logging.getLogger(__name__).warning("%s %s: talker-to-babble %.2f dB averaged, %.2f dB steered",
                                        preset, method, averaged, steered)
    assert steered > averaged + least_db, (averaged, steered)
    assert live.problem is None


def fixed_beams(preset: str, frames: np.ndarray, method: str = "superdirective") -> np.ndarray:
    """(beams, n): every fixed beam of `preset`'s bank over (n, channels) `frames`."""
    bf = Beamformer(PRESETS[preset], frames.shape[1], RATE, method=method)
    bf.open_bank()
    rows: list[np.ndarray] = []
    bf.tap = rows.append
    bf.process(frames.astype(np.float32))
    return np.concatenate(rows, axis=1)


@pytest.mark.parametrize(("preset", "beams", "least_db"), [
    # Measured on these four people: the best beam +0.9 dB over averaging (2 mics), +3.5 dB (4), a
    # little less than the beam steered on the mixture (+1.5, +4.7); the worst 4.6 and 5.3 dB below
    # averaging (it points at the others).
    ("respeaker_2mic", 5, 0.5), ("respeaker_4mic", 8, 2.5)])
def test_a_bank_of_fixed_beams_has_one_toward_the_talker_that_raises_the_talker_to_babble_ratio(
        preset, beams, least_db):
    t, b = in_a_room(preset)
    talker, babble = fixed_beams(preset, t.T), fixed_beams(preset, b.T)  # fixed weights: linear
    assert talker.shape[0] == beams
    ratios = [tbr_db(talker[k], babble[k]) for k in range(beams)]
    averaged = tbr_db(t.mean(axis=0), b.mean(axis=0))
    logging.getLogger(__name__).warning("%s: talker-to-babble %.2f dB averaged, %s by beam", preset,
                                        averaged, [round(r, 2) for r in ratios])
    assert max(ratios) > averaged + least_db, (averaged, ratios)
    assert max(ratios) - min(ratios) > 1.0  # the beams point different ways


def test_the_bank_covers_a_line_s_half_circle_and_a_circle_all_round():
    pair = bank_delays(PRESETS["respeaker_2mic"], RATE)
    end = 0.058 / SPEED_OF_SOUND * RATE
    assert [round(float(d[1]), 3) for d in pair] == pytest.approx(
        [-end, -end / 2 ** 0.5, 0.0, end / 2 ** 0.5, end], abs=1e-3)  # endfire to endfire
    assert len(bank_delays(PRESETS["respeaker_4mic"], RATE)) == 8
    assert len(bank_delays(((0.0, 0.0), (0.0, 0.03), (0.0, 0.06)), RATE)) == 5  # any line


def test_the_bank_leaves_the_steered_output_as_it_was():
    x = noise_burst(1.0)
    frames = np.c_[x, delayed(x, 2)].astype(np.float32)
    banked = Beamformer(PRESETS["respeaker_2mic"], 2, RATE)
    assert banked.open_bank() == 5
    rows: list[np.ndarray] = []
    banked.tap = rows.append
    alone = Beamformer(PRESETS["respeaker_2mic"], 2, RATE)
    heard = 0
    for part in (frames[:5000], frames[5000:]):
        out = banked.process(part)
        np.testing.assert_array_equal(out, alone.process(part))
        heard += out.size
    beams = np.concatenate(rows, axis=1)
    assert beams.shape == (5, heard)  # every beam, sample for sample with the output
    assert Beamformer(PRESETS["respeaker_4mic"], 3, RATE).open_bank() == 0  # the geometry lacks one


def test_with_a_dead_channel_every_fixed_beam_is_the_live_channel():
    x = noise_burst(1.0)
    frames = np.c_[x, np.zeros_like(x)].astype(np.float32)
    beams = fixed_beams("respeaker_2mic", frames)
    for row in beams:
        assert corr(row[RATE // 2:], x[RATE // 2 - LATENCY:beams.shape[1] - LATENCY]) > 0.99


def test_blocks_of_any_size_give_the_same_output():
    x = noise_burst(1.0)
    frames = np.c_[x, delayed(x, 2)].astype(np.float32)
    whole = Beamformer(PRESETS["respeaker_2mic"], 2, RATE).process(frames)
    bf = Beamformer(PRESETS["respeaker_2mic"], 2, RATE)
    rng = np.random.default_rng(3)
    parts, start = [], 0
    while start < frames.shape[0]:
        step = int(rng.integers(1, 700))
        parts.append(bf.process(frames[start:start + step]))
        start += step
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_a_delayed_channel_is_aligned_either_way_round():
    x = noise_burst(1.0)
    for frames, delay in ((np.c_[x, delayed(x, 2)], 2.0), (np.c_[delayed(x, 2), x], -2.0)):
        bf = Beamformer(PRESETS["respeaker_2mic"], 2, RATE)
        out = bf.process(frames.astype(np.float32))
        assert bf.delays[1] - bf.delays[0] == pytest.approx(delay, abs=0.3)
        assert corr(out[LATENCY + 4000:], frames[4000:, bf.reference]) > 0.98
        assert bf.problem is None


def test_channels_a_few_samples_out_of_step_are_aligned():
    x = noise_burst(1.0)
    bf = Beamformer(PRESETS["respeaker_2mic"], 2, RATE)  # the geometry allows 2.7 samples
    out = bf.process(np.c_[x, delayed(x, 7)].astype(np.float32))
    assert bf.delays[1] == pytest.approx(7.0, abs=0.3)
    assert corr(out[LATENCY + 4000:], x[4000:]) > 0.98


def test_channels_far_out_of_step_fall_back_to_one_channel_with_a_reason():
    x = noise_burst(1.0)
    problems: list[str | None] = []
    bf = Beamformer(PRESETS["respeaker_2mic"], 2, RATE)
    bf.on_problem = problems.append
    frames = np.c_[x, delayed(x, 40)].astype(np.float32)
    out = bf.process(frames)
    assert not bf.beaming and problems and "out of step" in str(problems[-1])
    end = out.size
    assert corr(out[end - 4000:], frames[end - 4000 - LATENCY:end - LATENCY, bf.reference]) > 0.99


def test_a_dead_channel_falls_back_to_the_live_one_never_silence():
    x = noise_burst(1.0)
    for dead in (0, 1):
        frames = np.c_[x, x].astype(np.float32)
        frames[:, dead] = 0.0
        problems: list[str | None] = []
        bf = Beamformer(PRESETS["respeaker_2mic"], 2, RATE)
        bf.on_problem = problems.append
        out = bf.process(frames)
        assert problems == [f"audio.mic_geometry: channel {dead} is dead (silent or 30 dB below the "
                            f"others): hearing channel {1 - dead} alone"]
        assert corr(out[LATENCY + 2000:], x[2000:]) > 0.99
        assert np.sqrt(np.mean(out[4000:] ** 2)) > 0.09  # at the live channel's level, not halved


def test_a_channel_count_the_geometry_lacks_hears_the_loudest_channel():
    x = noise_burst(1.0)
    bf = Beamformer(PRESETS["respeaker_4mic"], 3, RATE)
    assert bf.problem == ("audio.mic_geometry: 3 channel(s) but the geometry has 4 microphones: "
                          "hearing the loudest channel alone")
    out = bf.process(np.c_[0.1 * x, x, 0.2 * x].astype(np.float32))
    assert bf.reference == 1
    assert corr(out[LATENCY + 2000:], x[2000:]) > 0.99


REAL_COMMAND = REAL.parent / "commands" / "what time is it.flac"


def stereo() -> np.ndarray:
    """A real person saying "Alexa" and another asking "what time is it" on two microphones, the
    second 2 samples later, with a little noise on each."""
    x = np.concatenate([silence(0.5), real(REAL_TALKER), silence(0.4), real(REAL_COMMAND),
                        silence(2.0)]).astype(np.float32)
    rng = np.random.default_rng(5)
    return np.c_[x, delayed(x, 2)] + rng.standard_normal((x.size, 2)).astype(np.float32) * 0.002


def test_a_stereo_file_heard_through_the_front_end_as_a_wav_source(tmp_path):
    frames = stereo()
    path = write_wav(tmp_path / "board.wav", frames, channels=2)
    source = WavFileSource(path, mic_geometry="respeaker_2mic")
    out = np.concatenate(list(source.blocks()))
    assert source.mixer is not None and source.mixer.problem is None
    assert 0 <= out.size - (frames.shape[0] + LATENCY) < HOP  # everything, 16 ms late
    assert corr(out[LATENCY:], frames[:, 0]) > 0.99


def test_an_odd_channel_count_on_the_input_pipe_is_heard_on_its_loudest_channel(tmp_path):
    fifo = tmp_path / "mic.pcm"
    x = noise_burst(1.0)
    frames = np.c_[0.1 * x, 0.2 * x, x]  # three channels where the geometry has four
    src = PipeSource(str(fifo), channels=3, mic_geometry="respeaker_4mic")
    try:
        assert src.mixer is not None and "3 channel(s) but the geometry has 4" in str(src.mixer.problem)
        writer = threading.Thread(target=fifo.write_bytes, args=(encode_pcm_frames(frames),))
        writer.start()
        heard: list[np.ndarray] = []
        for block in src.blocks():
            heard.append(block)
            if sum(b.size for b in heard) >= x.size - HOP:
                break
        writer.join(timeout=10)
    finally:
        src.close()
        release_pipes()
    out = np.concatenate(heard)
    assert corr(out[LATENCY + 4000:], x[4000:out.size - LATENCY]) > 0.99  # the loudest, never silence


@pytest.mark.parametrize("steering", ["track", "wake"])
def test_listen_front_end_over_a_file_gives_the_events_of_the_same_audio_on_the_input_pipe(
        tmp_path, whisper_dir, steering):
    frames = stereo()
    wav = write_wav(tmp_path / "board.wav", frames, channels=2)
    device = ["--set", f"asr.model={whisper_dir}", "--set", "audio.mic_geometry=respeaker_2mic",
              "--set", f"audio.steering={steering}", "--set", "wake.models=[alexa]",
              "--set", "audio.noise_suppression=2", "--set", "audio.auto_gain_dbfs=10"]
    from_file = run_cli("listen", "--json", "--input", str(wav), "--front-end", *device)
    assert from_file.returncode == 0, from_file.stderr
    live = subprocess.run(
        [sys.executable, "-m", "edge_agent", "listen", "--json", *device, "--set", 'audio.input_pipe="-"',
         "--set", "audio.input_channels=2"],
        input=encode_pcm_frames(frames), capture_output=True, timeout=300, check=False)
    assert live.returncode == 0, live.stderr.decode()

    decided = ("transcript", "turn_end")

    def events(out: str) -> list[tuple[object, ...]]:
        # A transcript and a turn's end are decided at the end of the block that carries the
        # decision (a file's blocks are 0.5 s, the pipe's 30 ms, with or without the front end),
        # and a complete turn stays open for the hangover after its transcript: their times are
        # compared to within one file block. The gain adapts block by block, so Whisper may hear a
        # sample or two differently: the words are compared, not their capitals.
        docs = [json.loads(line) for line in out.splitlines()]
        return [(d["event"], d.get("model"), d.get("reason"), " ".join(words(d.get("text") or "")),
                 d.get("start"), d.get("end"), d.get("time") if d["event"] not in decided else None)
                for d in docs]

    def ends(out: str) -> list[float]:
        return [d["time"] for d in map(json.loads, out.splitlines()) if d["event"] in decided]

    heard = events(from_file.stdout)
    assert [e[0] for e in heard] == ["wake", "transcript", "turn_end"]
    assert "time is it" in str(heard[1][3]).lower()
    assert heard == events(live.stdout.decode())
    assert ends(from_file.stdout) == pytest.approx(ends(live.stdout.decode()), abs=0.5)


def encode_pcm_frames(frames: np.ndarray) -> bytes:
    """Interleaved 16-bit PCM of (n, channels) float frames."""
    ints = np.round(np.clip(frames, -1, 1) * 32767).astype("<i2")
    return ints.tobytes()


def test_listen_front_end_refuses_stdin():
    result = run_cli("listen", "--input", "-", "--front-end")
    assert result.returncode == 2
    assert "--front-end hears a WAV file" in result.stderr

