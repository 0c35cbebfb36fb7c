"""espeak-ng phonemization, shared by every voice that uses it.

espeak-ng keeps global state, so one phonemization at a time per process: the
server synthesizes on several threads, and the daemon may phonemize for the
speaker while a fleet reload loads another voice.
"""

from __future__ import annotations

import threading

_LOCK = threading.Lock()


def espeak_phonemes(text: str, voice: str) -> list[list[str]]:
    """IPA phonemes of `text`, one list per sentence as espeak-ng splits it."""
    from piper_phonemize import phonemize_espeak

    with _LOCK:
        result: list[list[str]] = phonemize_espeak(text, voice)
    return result
