"""`edge-agent bench turn`: end of speech -> transcript, live through a FIFO, VAD-only and the model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.clips import Clip, load_16k, piper_clip
from benchmarks.turn import (
    PAUSES_S,
    RATE,
    REAL_DIR,
    Recording,
    Slot,
    TurnClip,
    cut_short,
    kept,
    load_recordings,
    measure,
    real_clips,
    speech_bounds,
    summarise,
    sweep_clips,
    trimmed,
    turn_clip,
)
from edge_agent.errors import UsageError
from edge_agent.vad import WebRtcClassifier
from tests.speech_fixtures import run_cli, silence, write_wav

COMMAND = "Turn off all the lights downstairs."


def test_words_kept_counts_the_references_words_found_once_each():
    assert kept("Call mom. Tell her I'm running late.", "Call mom.") == (2, 7)
    assert kept("Turn it up.", "turn turn it up") == (3, 3)
    assert kept("Set a timer for 10 minutes.", "Set a timer for ten minutes") == (6, 6)


def test_a_turn_whose_last_transcript_came_before_the_speech_ended_was_cut_short():
    clip = TurnClip("real coffee <0.6 s> iced coffee", np.zeros(10, dtype=np.float32),
                    ("coffee, light roast", "iced coffee, soy milk"), 9, real=True)
    # The second command's slot words share "coffee" with the first: half its words are "kept".
    early = Slot("model", clip, speech_written=10.0, speech_end_s=5.0, decided_s=5.2,
                 heard=[(8.5, "Can I have a light roast coffee?")])
    assert cut_short(early, *kept(clip.sentences[-1], early.heard[-1][1]))
    whole = Slot("model", clip, speech_written=10.0, speech_end_s=5.0, decided_s=5.2,
                 heard=[(8.5, "Can I have a light roast coffee?"),
                        (10.4, "Can I have a light roast coffee? An iced coffee with soy milk.")])
    assert not cut_short(whole, *kept(clip.sentences[-1], whole.heard[-1][1]))
    misheard = Slot("model", clip, speech_written=10.0, speech_end_s=5.0, decided_s=5.3,
                    heard=[(10.4, "Can I have a light roast coffee? A nice toffee.")])
    assert not cut_short(misheard, *kept(clip.sentences[-1], misheard.heard[-1][1]))


def test_trimmed_drops_the_silence_after_the_speech_and_optionally_before():
    audio = np.concatenate([silence(0.2), np.full(100, 0.5, dtype=np.float32), silence(0.3)])
    assert trimmed(audio).size == 3200 + 100
    assert trimmed(audio, keep_start=False).size == 100


def noisy(level: float, seconds: float, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, level, round(seconds * RATE)).astype(np.float32)


def test_a_real_recordings_speech_ends_where_its_level_last_stands_clear_of_its_noise():
    tone = 0.3 * np.sin(np.arange(round(0.8 * RATE)) * 2 * np.pi * 220 / RATE).astype(np.float32)
    click = np.zeros(round(0.02 * RATE), dtype=np.float32)
    click[:40] = 0.5  # shorter than a run of frames: not speech
    audio = np.concatenate([noisy(0.01, 0.5), tone, noisy(0.01, 0.4, 1), click, noisy(0.01, 0.6, 2)])
    audio += noisy(0.005, audio.size / RATE, 3)
    start, end = speech_bounds(audio)
    assert abs(start / RATE - 0.5) <= 0.02 and abs(end / RATE - 1.3) <= 0.02
    # A room that gets noisier after the command (a fan starts): the noise after it is not speech.
    louder = np.concatenate([noisy(0.002, 0.5), tone, noisy(0.03, 1.0, 4)])
    assert abs(speech_bounds(louder)[1] / RATE - 1.3) <= 0.02
    assert speech_bounds(noisy(0.01, 0.1)) is None  # too short to have a noise to stand clear of


def test_a_sweep_clip_follows_the_wake_phrase_and_its_speech_ends_by_its_level_over_the_noise(
        tmp_path: Path):
    tone = 0.3 * np.sin(np.arange(round(0.8 * RATE)) * 2 * np.pi * 220 / RATE).astype(np.float32)
    room = np.concatenate([noisy(0.01, 0.5), tone, noisy(0.01, 1.0, 1)])  # noise all through, as the room's
    path = write_wav(tmp_path / "room.wav", room)
    wake = np.full(8000, 0.2, dtype=np.float32)
    (clip,) = sweep_clips([Clip("Lock the front door.", "room:piper@1.0", path)], wake)
    head = wake.size + round(0.1 * RATE)
    assert clip.name == "sweep room:piper@1.0 Lock the front door." and not clip.real
    assert clip.sentences == ("Lock the front door.",)
    assert abs((clip.last_speech - head) / RATE - 1.3) <= 0.02
    assert np.allclose(clip.audio[head:], load_16k(path))
    quiet = write_wav(tmp_path / "quiet.wav", np.zeros(RATE, dtype=np.float32))
    with pytest.raises(UsageError, match=r"quiet\.wav: no speech"):
        sweep_clips([Clip("x", "piper@1.0", quiet)], wake)


def test_two_real_commands_are_joined_with_the_pause_between_their_speech():
    def recording(text: str, seed: int) -> Recording:
        audio = noisy(0.01, 2.0, seed)
        return Recording(text, audio, speech_end=round(1.2 * RATE), onset=round(0.6 * RATE))

    wake = np.full(8000, 0.2, dtype=np.float32)
    recordings = [recording(f"command {i}", i) for i in range(4)]
    clips = real_clips(recordings, wake, one=1, two=2)
    assert [c.name for c in clips] == ["real command 0", f"real command 0 <{PAUSES_S[0]} s> command 2",
                                       f"real command 1 <{PAUSES_S[1]} s> command 3"]
    assert all(c.real for c in clips)
    one, two = clips[0], clips[1]
    assert one.sentences == ("command 0",) and two.sentences == ("command 0", "command 2")
    head = wake.size + round(0.1 * RATE)  # the wake phrase, then a breath
    assert np.array_equal(one.audio[head:], recordings[0].audio)
    assert one.last_speech == head + round(1.2 * RATE) - 1
    # The first command up to its speech's end plus the pause, the second from its onset (less a lead).
    second_at = head + round((1.2 + PAUSES_S[0]) * RATE)
    assert np.array_equal(two.audio[second_at:second_at + 100], recordings[2].audio[round(0.6 * RATE):][:100])
    assert two.last_speech == second_at + round(0.6 * RATE) - 1


def test_the_real_commands_of_the_repository_load_with_their_speech_found():
    recordings = load_recordings(REAL_DIR, WebRtcClassifier(2))
    assert len(recordings) == 31
    assert {r.text for r in recordings} >= {"what's the temperature of the EcoBee", "nevermind"}
    for r in recordings:
        assert 0 <= r.onset < r.speech_end <= r.audio.size, r.text
        assert 0.4 <= r.speech_end / RATE <= 3.2, r.text


def test_a_folders_references_name_what_recordings_named_by_id_say(tmp_path: Path):
    """A corpus names its files by id: `references.json` says what each one says; a file it does not
    list is still named by what it says."""
    source = sorted(REAL_DIR.glob("*.flac"))[:2]
    (tmp_path / "a1b2.flac").write_bytes(source[0].read_bytes())
    (tmp_path / source[1].name).write_bytes(source[1].read_bytes())
    (tmp_path / "references.json").write_text(json.dumps({"a1b2.flac": "iced mocha, light roast"}))
    recordings = load_recordings(tmp_path, WebRtcClassifier(2))
    assert [r.text for r in recordings] == ["iced mocha, light roast", source[1].stem]


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"a1b2.flac": ""}', '{"a1b2.flac": 3}'])
def test_unreadable_references_are_a_usage_error(tmp_path: Path, content: str):
    (tmp_path / "a1b2.flac").write_bytes(sorted(REAL_DIR.glob("*.flac"))[0].read_bytes())
    (tmp_path / "references.json").write_text(content)
    with pytest.raises(UsageError, match=r"references\.json"):
        load_recordings(tmp_path, WebRtcClassifier(2))


def test_a_folder_without_readable_recordings_is_a_usage_error(tmp_path: Path):
    with pytest.raises(UsageError, match=r"no \.flac or \.wav"):
        load_recordings(tmp_path, WebRtcClassifier(2))
    (tmp_path / "turn it up.flac").write_bytes(b"fLaC not really")
    with pytest.raises(UsageError, match=r"turn it up\.flac: not a readable recording"):
        load_recordings(tmp_path, WebRtcClassifier(2))
    with pytest.raises(UsageError, match="not a folder"):
        load_recordings(tmp_path / "missing", WebRtcClassifier(2))


def test_one_sentence_ends_sooner_with_the_model_live_through_a_fifo(whisper_dir, turn_model, shared_cache,
                                                                     clip_cache: Path, piper_voice):
    audio = load_16k(piper_clip(f"Okay Nabu. {COMMAND}", clip_cache, piper_voice))
    clip = turn_clip("piper", audio, (COMMAND,))
    passed = ["--set", f"asr.model={whisper_dir}", "--set", f"models.cache_dir={shared_cache}"]
    result = summarise(measure([clip], passed), [clip])
    assert "real" not in result and result["goals"]["on"] == "synthetic"
    vad, model = result["synthetic"]["vad"], result["synthetic"]["model"]
    assert vad["missed"] == model["missed"] == 0, result
    assert vad["words_kept"] == model["words_kept"] == 1.0, (vad["heard"], model["heard"])
    # Where the turn ended, in audio after the speech: the VAD waits its 500 ms hangover, the model
    # ends the turn at the 150 ms pause. Positions in the stream, so load on the machine cannot move them.
    assert model["decided_after_p50_s"] < vad["decided_after_p50_s"] - 0.2, result
    # The transcript itself also waits for Whisper, whose time a loaded machine stretches: generous.
    assert model["p50_s"] < 3.0, model["latencies_s"]


@pytest.mark.bench
def test_bench_turn_reports_both_ends_side_by_side(whisper_dir, turn_model, shared_cache):
    result = run_cli("bench", "turn", "--json", "--one", "1", "--two", "1", "--voices", "piper:joe",
                     "--real-one", "1", "--real-two", "1",
                     "--set", f"asr.model={whisper_dir}", "--set", f"models.cache_dir={shared_cache}",
                     timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["bench"] == "turn" and report["clips"] == 4
    for kind in ("real", "synthetic"):  # side by side, never mixed
        for end in ("vad", "model"):
            figures = report[kind][end]
            assert figures["turns"] == 2 and figures["cpu_cores"] > 0 and figures["peak_rss_mb"] > 0
    assert [name for name, _ in report["real"]["vad"]["heard"]] == [
        "real activate Mood Lighting", "real activate Mood Lighting <0.4 s> set Kitchen lights to green"]
    assert report["goals"]["on"] == "real"  # real speech decides
    assert {"on", "p50_le_0.30", "p90_le_0.50", "two_sentence_words_kept_ge_vad", "rss_le_330_mb"} == set(
        report["goals"])


def test_bench_turn_refuses_a_missing_real_folder_and_a_run_with_no_clips(
        turn_model, piper_voice, shared_cache, tmp_path: Path):
    cache = ["--set", f"models.cache_dir={shared_cache}"]
    missing = run_cli("bench", "turn", "--real", str(tmp_path / "nowhere"), *cache, timeout=300)
    assert missing.returncode == 2 and "--real: " in missing.stderr and "is not a folder" in missing.stderr
    empty = run_cli("bench", "turn", "--real", "none", "--one", "0", "--two", "0", *cache, timeout=300)
    assert empty.returncode == 2 and "no clips" in empty.stderr, empty.stderr
