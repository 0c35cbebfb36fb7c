"""The sentences whose espeak-ng phonemes are pinned in `fixtures/phonemes-en-us.json`.

Both phonemizer distributions (`piper-phonemize` 1.1.0 on Python 3.10/3.11,
`piper-phonemize-fix` 1.2.2 on 3.12/3.13) install the module `piper_phonemize`;
the fixture was written with the first, and the test holds whichever is
installed to it. Regenerate (only with `piper-phonemize` 1.1.0 installed):

    python -m tests.tts.phoneme_sentences > tests/tts/fixtures/phonemes-en-us.json
"""

from __future__ import annotations

import json
from importlib import metadata

VOICE = "en-us"
"""The espeak voice of `en_US-joe-medium` and of Kokoro's English."""

SENTENCES = [
    # What `normalize` hands the phonemizer (tests/tts/test_normalize.py).
    "It is seven thirty p m and twenty-one degrees Celsius.",
    "Meeting on December second, twenty twenty-six.",
    "On the third of March nineteen ninety-nine",
    "Costs five dollars and twenty cents",
    "one thousand two hundred thirty-four visitors",
    "Speed fifty kilometers per hour",
    "Call Doctor Smith. Fly to Saint Louis.",
    "Code zero zero four two",
    # Announcements as users write them.
    "The front door is open.",
    "Someone is at the door!",
    "Did you remember to close the garage?",
    "Dinner is ready; please come downstairs.",
    "Warning: the washing machine has finished, and the dryer is still running.",
    "Thank you.",
    "Hello from the edge",
    "Okay Nabu, turn on the kitchen lights.",
    "Hey Jarvis, what's the weather like tomorrow?",
    "\"Quoted\" words, (parentheses), and - dashes - too...",
    # What espeak itself reads: digits, abbreviations, capitals, non-ASCII letters.
    "Room 101 is on floor 3.",
    "The NASA and BBC reports from 1984.",
    "A naïve café owner in Zürich.",
    "Read the record, then record the read.",
    "Lead the way to the lead mine.",
    "It's 5 o'clock somewhere, isn't it?",
    "First sentence. Second sentence! Third one?",
    "Tomorrow's forecast: rain, 12 millimeters, wind from the north-west.",
]


def phonemize_all() -> list[dict[str, object]]:
    """`[{text, phonemes}]` with the installed `piper_phonemize`, one string per espeak sentence.

    Each phoneme is one code point, so a string holds a sentence's list exactly
    (`list(string)` gives it back; the test compares lists, so a phoneme of two
    code points would show as a difference).
    """
    from piper_phonemize import phonemize_espeak

    return [{"text": s, "phonemes": ["".join(p) for p in phonemize_espeak(s, VOICE)]} for s in SENTENCES]


def installed_phonemizer() -> str:
    """`name==version` of the installed distribution that provides `piper_phonemize`."""
    for name in ("piper-phonemize", "piper-phonemize-fix"):
        try:
            return f"{name}=={metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


if __name__ == "__main__":
    print(json.dumps({"voice": VOICE, "written_with": installed_phonemizer(), "sentences": phonemize_all()},
                     ensure_ascii=False, indent=1))
