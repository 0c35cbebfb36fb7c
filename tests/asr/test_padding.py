import pytest

from edge_agent.asr.whisper import Padding, Recognition, compression_ratio, degenerate, token_budget
from edge_agent.config import AsrSettings


def test_full_padding_is_always_whispers_30_s_window():
    assert Padding("full").frames(16000) == Padding("full").frames(29 * 16000) == 3000


@pytest.mark.parametrize(("seconds", "frames"), [(0.5, 600), (1.0, 600), (1.01, 800), (2.9, 800),
                                                 (3.2, 1000), (24.0, 3000), (30.0, 3000)])
def test_bucket_padding_adds_the_margin_and_rounds_up_to_the_bucket(seconds, frames):
    assert Padding("bucket", bucket_s=2.0, margin_s=5.0).frames(round(seconds * 16000)) == frames


def test_bucket_lengths_are_even_and_capped():
    pad = Padding("bucket", bucket_s=0.55, margin_s=0.0)
    for n in range(1, 40 * 16000, 7919):
        frames = pad.frames(n)
        assert frames % 2 == 0 and 2 <= frames <= 3000


def test_padding_comes_from_the_settings():
    settings = AsrSettings(padding="bucket", bucket_s=1.0, margin_s=3.0, retry_window_s=20.0)
    pad = Padding.from_settings(settings)
    assert pad == Padding("bucket", 1.0, 3.0, retry_window_s=20.0)


@pytest.mark.parametrize(("window_s", "frames", "retry"), [(30.0, 800, 3000), (20.0, 800, 2000),
                                                           (20.0, 2000, 3000), (20.0, 2400, 3000),
                                                           (12.5, 600, 1250)])
def test_an_unsure_decode_goes_again_in_the_retry_window_or_whispers_own_when_it_was_longer(
        window_s, frames, retry):
    assert Padding("bucket", retry_window_s=window_s).retry_frames(frames) == retry


def test_the_retry_window_is_checked():
    with pytest.raises(ValueError, match=r"retry_window_s: 5\.0 is outside 10\.\.30"):
        AsrSettings(retry_window_s=5.0)


def result(text, n_tokens):
    return Recognition(text, tuple(range(n_tokens)), 0.0, -0.1, 600)


def test_repetition_loops_are_degenerate_and_normal_commands_are_not():
    loop = "turn on the kitchen lights " * 8
    assert compression_ratio(loop) > 2.4
    assert degenerate(result(loop, 50), token_budget(1.5))
    assert degenerate(result("la", token_budget(1.0)), token_budget(1.0))
    assert not degenerate(result("Turn on the kitchen lights.", 6), token_budget(1.5))
    assert not degenerate(result("Remind me to call my mother at six o'clock this evening.", 14), 40)


def test_a_command_said_twice_in_one_decode_is_degenerate_though_gzip_misses_it():
    doubled = ("Open the garage door and turn on the porch light. "
               "Open the garage door and turn on the porch light.")
    assert compression_ratio(doubled) < 2.4  # what tiny.en gave in a 6 s window; the full one had it once
    assert degenerate(result(doubled, 24), token_budget(3.5))
    assert degenerate(result("Set a timer. Set a timer for ten minutes.", 12), 40)
    # Two words again, or a word said three times, are speech, not a loop.
    assert not degenerate(result("Turn it up, up, up a bit more.", 10), 40)
    assert not degenerate(result("Very very loud music in the living room.", 10), 40)
    assert not degenerate(result("Tell me the time and tell me the weather.", 12), 40)


def test_log_softmax_in_float32_matches_float64_and_ignores_suppressed_tokens():
    import numpy as np

    from edge_agent.asr.whisper import _log_softmax_at

    logits = np.random.default_rng(0).normal(0, 4, 51864).astype(np.float32)
    logits[::7] = -np.inf
    token = int(np.argmax(logits))
    finite = logits[np.isfinite(logits)].astype(np.float64)
    expected = logits[token] - finite.max() - np.log(np.exp(finite - finite.max()).sum())
    assert _log_softmax_at(logits, token) == pytest.approx(expected, abs=1e-5)


def test_the_default_padding_keeps_every_word_of_the_truncation_clip(whisper, clip_cache, shared_cache):
    """Issue 23's clip, at three speaking rates: the default transcript is never shorter than
    Whisper's own 30 s window's by more than a word."""
    from benchmarks.clips import load_16k
    from edge_agent.text.wer import words
    from tests.speech_fixtures import TWO_SENTENCES, piper_speed_clip

    for speed in (0.8, 1.0, 1.25):
        audio = load_16k(piper_speed_clip(TWO_SENTENCES, clip_cache, shared_cache, speed))
        default = whisper.recognize(audio, Padding.from_settings(AsrSettings())).text
        full = whisper.recognize(audio, Padding("full")).text
        assert len(words(default)) >= len(words(full)) - 1, (speed, default, full)
        assert "table" in default.lower(), (speed, default)


def test_an_unsure_short_window_result_is_decoded_again_in_30_s(whisper, clip_cache, shared_cache):
    """The truncation itself: in a 6 s window the encoder's states differ (its attention spans
    the window) and Whisper ends after one word; that word's end-of-text is unsure, so the
    retry hears the whole clip in 30 s."""
    from benchmarks.clips import load_16k
    from tests.speech_fixtures import TWO_SENTENCES, piper_speed_clip

    audio = load_16k(piper_speed_clip(TWO_SENTENCES, clip_cache, shared_cache, 1.25))
    short = whisper.recognize(audio, Padding("bucket", bucket_s=6.0, margin_s=0.0, retry_logprob=-10.0))
    assert short.frames == 600 and short.text == "Then" and short.avg_logprob < -0.6
    retried = whisper.recognize(audio, Padding("bucket", bucket_s=6.0, margin_s=0.0))
    assert retried.fallback and retried.frames == 3000
    assert retried.text == whisper.recognize(audio, Padding("full")).text
    assert "table" in retried.text.lower()
