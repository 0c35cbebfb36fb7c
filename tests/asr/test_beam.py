import math

import numpy as np
import pytest

from edge_agent.asr.beam import Beam
from edge_agent.asr.transcriber import Transcriber
from edge_agent.config import AsrSettings
from edge_agent.vad.segmenter import Utterance

EOT = 3
"""A four-token vocabulary: 0, 1, 2 and end-of-text."""


def row(**probs: float) -> np.ndarray:
    """Log-probabilities over the four tokens (t0, t1, t2, eot); unnamed ones get what is left."""
    named = {int(k[1:]) if k != "eot" else EOT: v for k, v in probs.items()}
    rest = (1.0 - sum(named.values())) / max(1, 4 - len(named))
    return np.log(np.array([named.get(i, rest) for i in range(4)], dtype=np.float32))


def test_the_beam_finds_the_sequence_greedy_decoding_misses():
    beam = Beam(2, EOT, "prompt")
    beam.advance([row(t0=0.6, t1=0.39, t2=0.005, eot=0.005)], ["after-prompt"])
    assert [h.tokens for h in beam.live] == [(0,), (1,)]
    beam.advance([row(t2=0.4, eot=0.3), row(eot=0.97)], ["after-0", "after-1"])
    assert beam.done
    tokens, sum_logprob = beam.best()
    assert tokens == (1,)  # greedy takes 0 first and never sees it
    assert sum_logprob == pytest.approx(math.log(0.39) + math.log(0.97), abs=1e-6)


def test_continuations_of_a_hypothesis_carry_the_decoder_state_it_produced():
    beam = Beam(3, EOT, "empty")
    beam.advance([row(t0=0.5, t1=0.3, t2=0.19, eot=0.01)], ["cache-0"])
    assert {h.state for h in beam.live} == {"cache-0"}
    beam.advance([row(t0=0.9), row(t1=0.9), row(t2=0.9)], ["cache-a", "cache-b", "cache-c"])
    assert {h.tokens: h.state for h in beam.live} == {(0, 0): "cache-a", (1, 1): "cache-b", (2, 2): "cache-c"}


def test_a_search_out_of_budget_ranks_its_live_hypotheses_by_mean_logprob():
    beam = Beam(2, EOT, None)
    beam.advance([row(t0=0.5, t1=0.45, t2=0.04, eot=0.01)], [None])
    beam.advance([row(t2=0.2, eot=0.01), row(t0=0.98, eot=0.01)], [None, None])
    assert not beam.done
    assert beam.best()[0] == (1, 0)


def test_suppressed_tokens_are_never_chosen():
    beam = Beam(2, EOT, None)
    logprobs = row(t0=0.7, t1=0.2, t2=0.05, eot=0.05)
    logprobs[0] = -np.inf
    beam.advance([logprobs], [None])
    assert all(h.tokens[0] != 0 for h in beam.live)


def test_a_beam_needs_one_hypothesis_at_least():
    with pytest.raises(ValueError, match="at least 1"):
        Beam(0, EOT, None)
    with pytest.raises(ValueError, match="beam_size"):
        AsrSettings(beam_size=0)


def test_a_beam_of_one_is_greedy_decoding(whisper, espeak_clips, piper_clips):
    for clip in espeak_clips[:2] + piper_clips[:2]:
        mel = whisper.features(clip.audio(), 800)
        cross_k, cross_v = whisper.encode(mel)
        prompt = whisper.prompt("en")
        greedy = whisper.decode(cross_k, cross_v, prompt, 48)
        beam = whisper.decode_beam(cross_k, cross_v, prompt, 48, beam_size=1)
        assert beam[0] == greedy[0], clip.text
        assert beam[1] == pytest.approx(greedy[1])
        assert beam[2] == pytest.approx(greedy[2], abs=1e-3)


def test_the_transcriber_decodes_with_the_configured_beam(whisper, espeak_clips):
    audio = espeak_clips[1].audio()
    utterance = Utterance(samples=audio, start=0.0, end=audio.size / 16000, audio_start=0.0,
                          ended_at=audio.size / 16000, speech_ms=round(audio.size / 16))
    settings = AsrSettings(beam_size=3)
    transcriber = Transcriber(whisper, settings)
    heard = transcriber(utterance)
    expected = whisper.recognize(audio, transcriber.padding, max_tokens=settings.max_tokens, beam_size=3)
    assert heard is not None
    assert heard.tokens == expected.tokens
    assert heard.text == expected.text


def test_a_batched_beam_decodes_the_same_tokens_as_one_hypothesis_per_call(whisper_dir, espeak_clips,
                                                                          piper_clips):
    from edge_agent.asr.whisper import WhisperOnnx

    fp32 = WhisperOnnx.load(whisper_dir, "fp32", threads=2)
    assert fp32._batched  # the export's decoder has a batch axis
    try:
        for clip in espeak_clips[:4] + piper_clips[:4]:
            mel = fp32.features(clip.audio(), 800)
            cross_k, cross_v = fp32.encode(mel)
            prompt = fp32.prompt("en")
            batched = fp32.decode_beam(cross_k, cross_v, prompt, 48, beam_size=5)
            fp32._batched = False  # as an export whose decoder takes one sequence runs it
            one_by_one = fp32.decode_beam(cross_k, cross_v, prompt, 48, beam_size=5)
            fp32._batched = True
            assert batched[0] == one_by_one[0], clip.text
            assert batched[2] == pytest.approx(one_by_one[2], abs=1e-3)
    finally:
        fp32.close()
