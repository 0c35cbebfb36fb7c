"""HTTP(S) downloads of model files: resumable (HTTP Range), bounded, verified before use.

A partial download stays in `<dest>.part` (fsynced after each attempt), so the
next attempt, or the next process after a crash, asks only for the rest. The
file reaches `dest` only once its size and sha256 match.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import random
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from edge_agent.errors import ModelError

log = logging.getLogger(__name__)

_CHUNK = 1 << 16
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")

Progress = Callable[[str], None]


class _Retry(Exception):
    """A transient failure: try again, resuming."""


def download(url: str, dest: Path, *, sha256: str, size: int, timeout: float = 30.0,
             attempts: int = 5, progress: Progress | None = None) -> Path:
    """Fetch `url` into `dest`, resuming a previous partial download; verify size and sha256."""
    say = progress or (lambda _line: None)
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    last_error = ""
    for attempt in range(1, attempts + 1):
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        if have == size:
            break
        try:
            _fetch(url, part, have, size, timeout)
            if part.stat().st_size == size:
                break
            last_error = f"connection closed at {part.stat().st_size} of {size} bytes"
        except _Retry as exc:
            last_error = str(exc)
        got = part.stat().st_size if part.exists() else 0
        say(f"{url}: attempt {attempt} stopped at {got} of {size} bytes ({last_error})")
        log.warning("download of %s: attempt %d of %d stopped at %d of %d bytes: %s",
                    url, attempt, attempts, got, size, last_error)
        if attempt < attempts:
            time.sleep(min(5.0, 0.2 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0))
    got = part.stat().st_size if part.exists() else 0
    if got != size:
        raise ModelError(f"{url}: download incomplete, {got} of {size} bytes after {attempts} attempts "
                         f"({last_error})")
    digest = _sha256(part)
    if digest != sha256:
        part.unlink()
        raise ModelError(f"{url}: sha256 {digest} does not match the expected {sha256}")
    os.replace(part, dest)
    return dest


def _fetch(url: str, part: Path, have: int, size: int, timeout: float) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "edge-agent"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing after `have`: the part is as long as the file
            return
        if exc.code >= 500 or exc.code in (408, 429):
            raise _Retry(f"HTTP {exc.code}") from None
        raise ModelError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        raise _Retry(_reason(exc)) from None
    with response:
        start = 0
        if response.status == 206:
            match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", ""))
            if not match:
                raise _Retry("206 response without a usable Content-Range")
            start = int(match.group(1))
            if start != have:
                raise _Retry(f"server resumed at byte {start}, not {have}")
        elif have:
            log.info("%s: server ignored the Range request; starting over", url)
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and start + int(length) > size:
            raise ModelError(f"{url}: server offers {start + int(length)} bytes, expected {size}")
        mode = "ab" if start else "wb"
        with part.open(mode) as out:
            written = start
            try:
                while chunk := response.read(_CHUNK):
                    written += len(chunk)
                    if written > size:
                        raise ModelError(f"{url}: server sent more than the expected {size} bytes")
                    out.write(chunk)
            except (OSError, http.client.HTTPException) as exc:
                raise _Retry(_reason(exc)) from None
            finally:
                out.flush()
                os.fsync(out.fileno())


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
