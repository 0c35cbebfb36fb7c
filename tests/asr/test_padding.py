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
    pad = Padding.from_settings(AsrSettings(padding="bucket", bucket_s=1.0, margin_s=3.0))
    assert pad == Padding("bucket", 1.0, 3.0)


def result(text, n_tokens):
    return Recognition(text, tuple(range(n_tokens)), 0.0, -0.1, 600)


def test_repetition_loops_are_degenerate_and_normal_commands_are_not():
    loop = "turn on the kitchen lights " * 8
    assert compression_ratio(loop) > 2.4
    assert degenerate(result(loop, 50), token_budget(1.5))
    assert degenerate(result("la", token_budget(1.0)), token_budget(1.0))
    assert not degenerate(result("Turn on the kitchen lights.", 6), token_budget(1.5))
    assert not degenerate(result("Remind me to call my mother at six o'clock this evening.", 14), 40)


def test_log_softmax_in_float32_matches_float64_and_ignores_suppressed_tokens():
    import numpy as np

    from edge_agent.asr.whisper import _log_softmax_at

    logits = np.random.default_rng(0).normal(0, 4, 51864).astype(np.float32)
    logits[::7] = -np.inf
    token = int(np.argmax(logits))
    finite = logits[np.isfinite(logits)].astype(np.float64)
    expected = logits[token] - finite.max() - np.log(np.exp(finite - finite.max()).sum())
    assert _log_softmax_at(logits, token) == pytest.approx(expected, abs=1e-5)
