"""Audio Home Assistant hands over as a URL (a TTS answer, an announcement, media to play).

Fetched with a bound on bytes and on the whole transfer's time (a server that
dribbles is cut at the deadline, not after each read's timeout), then decoded.
Only WAV is taken: the device's media player tells Home Assistant it plays WAV
(`FORMATS`), so Home Assistant's TTS and its ffmpeg proxy convert to that and no
compressed-audio decoder is needed on the device. Anything else is refused with
a `MediaError` saying what came.
"""

from __future__ import annotations

import io
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from edge_agent.audio.frames import Samples
from edge_agent.audio.wav import decode, read_wav_header
from edge_agent.errors import AudioError, EdgeError

READ_BYTES = 65536


class MediaError(EdgeError):
    """A URL that cannot be played: not http(s), too large, too slow, not WAV."""


@dataclass(frozen=True)
class Fetched:
    samples: Samples
    sample_rate: int


def fetch_wav(url: str, *, max_bytes: int, timeout_s: float) -> Fetched:
    """The WAV at `url`, mixed down to mono (blocking: call it from a worker thread)."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("http", "https"):
        raise MediaError(f"{_short(url)}: only http(s) URLs are fetched, not {scheme or 'a path'}")
    deadline = time.monotonic() + timeout_s
    body = bytearray()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                raise MediaError(f"{_short(url)}: {declared} bytes (at most {max_bytes})")
            while chunk := response.read(READ_BYTES):
                body += chunk
                if len(body) > max_bytes:
                    raise MediaError(f"{_short(url)}: more than {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise MediaError(f"{_short(url)}: not fetched within {timeout_s:g} s")
    except urllib.error.HTTPError as exc:
        raise MediaError(f"{_short(url)}: HTTP {exc.code} {exc.reason}") from None
    except OSError as exc:  # refused, reset, timed out, no such host
        raise MediaError(f"{_short(url)}: cannot fetch: {getattr(exc, 'reason', exc)}") from None
    return decode_wav(bytes(body), _short(url))


def decode_wav(data: bytes, name: str) -> Fetched:
    """WAV bytes (a streamed file's unknown data size included) to mono samples."""
    fh = io.BytesIO(data)
    try:
        header = read_wav_header(fh, name, len(data))
    except AudioError as exc:
        kind = data[:4]
        if kind[:3] == b"ID3" or kind[:2] in (b"\xff\xfb", b"\xff\xf3") or kind == b"fLaC":
            raise MediaError(f"{name}: compressed audio ({'FLAC' if kind == b'fLaC' else 'MP3'}); "
                             "this device plays WAV only") from None
        raise MediaError(str(exc)) from None
    frame = header.channels * header.width
    usable = min(header.data_bytes, len(data) - header.data_offset) // frame * frame
    pcm = data[header.data_offset:header.data_offset + usable]
    return Fetched(decode(pcm, header.encoding, header.width, header.channels, Path(name)), header.rate)


def _short(url: str) -> str:
    """The URL without its query (Home Assistant's TTS URLs carry tokens)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
