"""espeak-ng phonemization, shared by every voice that uses it.

espeak-ng keeps global state, so one phonemization at a time per process: the
server synthesizes on several threads, and the daemon may phonemize for the
speaker while a fleet reload loads another voice.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_LOCK = threading.Lock()


def espeak_phonemes(text: str, voice: str) -> list[list[str]]:
    """IPA phonemes of `text`, one list per sentence as espeak-ng splits it."""
    from piper_phonemize import phonemize_espeak

    with _LOCK:
        result: list[list[str]] = phonemize_espeak(text, voice)
    return result


def cut_at(items: list[T], limit: int, sep: T | None) -> Iterator[list[T]]:
    """Split an over-long run (phonemes, token ids) into pieces of at most `limit`, at the last
    `sep` (a word boundary) that fits, anywhere as a last resort; the `sep` cut at is dropped.

    A model call's cost grows faster than its input (attention is quadratic), so the input
    of one call is bounded whatever the text expanded to.
    """
    while len(items) > limit:
        window = items[:limit + 1]
        at = max((i for i, t in enumerate(window) if t == sep), default=0) if sep is not None else 0
        at = at if at > 0 else limit
        yield items[:at]
        items = items[at + 1:] if at < len(items) and items[at] == sep else items[at:]
    if items:
        yield items
