import os
import stat
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli


def read(path: Path) -> tuple[int, np.ndarray]:
    with wave.open(str(path), "rb") as wav:
        assert wav.getnchannels() == 1 and wav.getsampwidth() == 2
        return wav.getframerate(), np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")


def test_say_writes_a_wav_of_real_speech(tmp_path):
    out = tmp_path / "hello.wav"
    result = run_cli("say", "Hello from the edge", "--out", str(out))
    assert result.returncode == 0, result.stderr
    rate, samples = read(out)
    assert rate == 22050
    assert 0.5 < len(samples) / rate < 4.0
    assert np.abs(samples).max() > 3000, "speech, not silence"
    assert not list(tmp_path.glob(".*.part")), "no temp file left behind"


def test_say_reads_text_from_stdin(tmp_path):
    out = tmp_path / "stdin.wav"
    result = run_cli("say", "-", "--out", str(out), stdin="Dinner is ready.\n")
    assert result.returncode == 0, result.stderr
    assert read(out)[1].size > 0


def one_error_line(result) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("edge-agent: error: ")
    return lines[0]


@pytest.mark.parametrize("text", ["", "   \n "])
def test_empty_text_is_exit_2_with_one_line(text):
    assert "TEXT is empty" in one_error_line(run_cli("say", text))


def test_unknown_voice_is_exit_2_with_one_line():
    line = one_error_line(run_cli("say", "hi", "--voice", "nobody"))
    assert "tts.voice: unknown voice 'nobody'" in line


@pytest.mark.parametrize("target", ["missing-dir/x.wav", "a-file/x.wav", "a-dir"])
def test_unwritable_out_is_exit_2_with_one_line(tmp_path, target):
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "a-dir").mkdir()
    line = one_error_line(run_cli("say", "hi", "--out", str(tmp_path / target)))
    assert str(tmp_path) in line


def test_out_must_be_a_wav(tmp_path):
    line = one_error_line(run_cli("say", "hi", "--out", str(tmp_path / "x.mp3")))
    assert "only .wav" in line and f"--out {tmp_path / 'x.wav'}" in line


def test_bad_config_names_the_key_path(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("tts:\n  threads: many\n")
    line = one_error_line(run_cli("say", "hi", "--config", str(config)))
    assert "tts.threads: expected an integer" in line


def test_hostile_config_is_refused_with_one_line(tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcdefg", "bcdefgh", strict=True)))
    line = one_error_line(run_cli("say", "hi", "--config", str(config)))
    assert "more than 64 aliases" in line or "expands to more than" in line


def test_without_a_sound_card_say_falls_back_with_one_clear_message(tmp_path):
    fallback = tmp_path / "fallback"
    result = run_cli("say", "Hello", "--set", "audio.fallback=wav",
                     "--set", f"audio.fallback_dir={fallback}")
    assert result.returncode == 0, result.stderr
    messages = [line for line in result.stderr.splitlines() if "falling back" in line]
    assert len(messages) == 1, result.stderr
    assert "PortAudio" in messages[0] or "sound output" in messages[0]
    written = list(fallback.glob("*.wav"))
    assert len(written) == 1 and read(written[0])[1].size > 0


def test_without_a_sound_card_and_fallback_error_say_fails_cleanly():
    line = one_error_line(run_cli("say", "Hello", "--set", "audio.fallback=error"))
    assert line.startswith("edge-agent: error: no sound output")
    assert "Error querying device" not in line  # PortAudio's words name no next step
    assert "audio.output_command" in line and "--out FILE.wav" in line


def test_without_a_sound_card_say_exits_2_instead_of_playing_nothing(tmp_path):
    """The default fallback (null) keeps the daemon running; `say` that played nothing fails."""
    result = run_cli("say", "Hello")
    line = one_error_line(result)
    assert "no sound output" in line and "audio.output_command" in line and "--out FILE.wav" in line
    assert result.stdout == ""


def test_say_tells_where_the_wav_fallback_went(tmp_path):
    fallback = tmp_path / "fallback"
    result = run_cli("say", "Hello", "--set", "audio.fallback=wav", "--set", f"audio.fallback_dir={fallback}")
    assert result.returncode == 0, result.stderr
    written = list(fallback.glob("*.wav"))
    assert len(written) == 1
    assert result.stdout.startswith(f"{written[0]}: ") and "audio.fallback is wav" in result.stdout


def test_say_to_wav_files_by_choice_prints_the_path_without_a_fallback_note(tmp_path):
    result = run_cli("say", "Hello", "--set", "audio.output=wav", "--set", f"audio.fallback_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    written = list(tmp_path.glob("*.wav"))
    assert len(written) == 1 and result.stdout.startswith(f"{written[0]}: ")
    assert "fallback" not in result.stdout and result.stderr == ""


def test_the_wav_say_writes_follows_the_umask(tmp_path):
    out = tmp_path / "hello.wav"
    old = os.umask(0o022)
    try:
        result = run_cli("say", "Hello", "--out", str(out))
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # readable by the player, as `cp` would make it


def test_say_plays_through_an_output_command_at_its_rate(tmp_path):
    import shlex

    played = tmp_path / "played.raw"
    command = shlex.join(["sh", "-c", f"cat > {shlex.quote(str(played))}"])  # `aplay -r 16000 ...` here
    result = run_cli("say", "Hello from the edge", "--set", f"audio.output_command={command}",
                     "--set", "audio.output_rate=16000")
    assert result.returncode == 0, result.stderr
    reference = tmp_path / "hello.wav"
    assert run_cli("say", "Hello from the edge", "--out", str(reference)).returncode == 0
    rate, spoken = read(reference)
    raw = np.frombuffer(played.read_bytes(), dtype="<i2")
    assert abs(len(raw) / 16000 - len(spoken) / rate) < 0.25  # the same speech, at the command's rate
    assert np.abs(raw).max() > 3000, "speech, not silence"
