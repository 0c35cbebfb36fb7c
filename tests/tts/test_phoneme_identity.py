"""Both phonemizer distributions give the phonemes the voices were checked with.

`piper-phonemize` 1.1.0 (Python 3.10/3.11) and `piper-phonemize-fix` 1.2.2
(3.12/3.13, chosen by an environment marker in pyproject.toml) install the same
`piper_phonemize` module with their own espeak-ng data. The fixture was written
with 1.1.0; `scripts/test` runs this test again in a Python 3.13 venv, where the
other distribution is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

from edge_agent.tts.phonemes import espeak_phonemes
from tests.tts.phoneme_sentences import SENTENCES, VOICE, installed_phonemizer

FIXTURE = Path(__file__).parent / "fixtures" / "phonemes-en-us.json"


def test_fixture_covers_the_sentences_list() -> None:
    doc = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert doc["voice"] == VOICE
    assert doc["written_with"] == "piper-phonemize==1.1.0"
    assert [case["text"] for case in doc["sentences"]] == SENTENCES


def test_installed_phonemizer_gives_the_fixture_phonemes() -> None:
    doc = json.loads(FIXTURE.read_text(encoding="utf-8"))
    different = [
        (case["text"], expected, got)
        for case in doc["sentences"]
        for expected in [[list(s) for s in case["phonemes"]]]
        for got in [espeak_phonemes(case["text"], VOICE)]
        if got != expected
    ]
    assert not different, f"{installed_phonemizer()} differs from {doc['written_with']}: {different}"
