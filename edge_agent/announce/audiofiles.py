"""Audio announcements' files: `<journal directory>/audio/<id>.wav`, stored, played in 1 s pieces, removed.

A trigger that already has the audio (a Wyoming `announce`, a voice pipeline's answer) hands it
over as samples; it is kept as a mono 16-bit WAV written atomically and fsynced (the rename too)
before the journal record that names it, so after a crash a journaled audio announcement finds its
file. A file is removed once its announcement is final, and at start when no pending announcement
names it (what a crash between the two left behind).

Only files inside this directory are ever read as an announcement's audio or removed: the path
travels in the journal, and nothing a producer sends can point it elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterator
from pathlib import Path

from edge_agent.atomic import fsync_dir
from edge_agent.audio.frames import AudioChunk, Samples
from edge_agent.audio.wav import WavWriter, decode, open_wav
from edge_agent.errors import AudioError

log = logging.getLogger(__name__)

PIECE_S = 1.0
"""Audio is played in pieces this long, each counted as a sentence: a more urgent announcement
interrupts it at a piece boundary and it resumes from the next piece."""

ENGINE = "audio"
"""The engine name an audio announcement's statuses carry."""


class AudioFiles:
    """The directory of audio announcements' WAV files."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, ann_id: str) -> Path:
        return self.directory / f"{ann_id}.wav"

    def save(self, ann_id: str, samples: Samples, sample_rate: int) -> Path:
        """Write `<id>.wav` durably (file and rename fsynced); raises `OSError` leaving nothing."""
        path = self.path(ann_id)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            writer = WavWriter(path, sample_rate)
        except AudioError as exc:
            raise OSError(str(exc)) from None
        try:
            writer.write(samples)
            writer.close()  # fsyncs the file, then renames it into place
            fsync_dir(self.directory)
        except BaseException:
            with contextlib.suppress(OSError):  # it removes its temp file whatever else fails
                writer.abort()
            path.unlink(missing_ok=True)
            raise
        return path

    def owns(self, path: str | Path) -> bool:
        """`path` is a file of this directory (not a path a journal line could point anywhere)."""
        candidate = Path(path)
        return candidate.parent == self.directory and candidate.suffix == ".wav"

    def problem(self, path: str) -> str | None:
        """Why `path` cannot be played (missing, unreadable, not ours); None when it can."""
        if not self.owns(path):
            return f"audio file {path} is outside {self.directory}"
        try:
            fh, header = open_wav(Path(path))
        except AudioError as exc:
            return f"cannot play the announcement's audio: {exc}"
        fh.close()
        if header.channels != 1 or header.frames == 0:
            return f"cannot play the announcement's audio: {path} is not mono audio"
        return None

    def remove(self, path: str) -> None:
        """Delete an announcement's file once nothing needs it (only ever one of ours)."""
        if not self.owns(path):
            log.warning("not removing %s: outside %s", path, self.directory)
            return
        try:
            Path(path).unlink(missing_ok=True)
        except OSError as exc:  # left for the sweep at the next start
            log.warning("cannot remove %s: %s", path, exc.strerror or exc)

    def sweep(self, keep: Collection[str]) -> int:
        """Remove every file here that no pending announcement names (`keep`); how many."""
        wanted = {Path(p).name for p in keep}
        count = 0
        try:
            for entry in self.directory.iterdir():
                if entry.name not in wanted and entry.is_file():
                    entry.unlink(missing_ok=True)
                    count += 1
        except FileNotFoundError:
            return 0
        except OSError as exc:  # left for the next start; playing does not depend on it
            log.warning("cannot clean %s: %s", self.directory, exc.strerror or exc)
        if count:
            log.info("removed %d audio announcement files nothing needs from %s", count, self.directory)
        return count


def pieces(path: Path, first: int = 0) -> Iterator[AudioChunk]:
    """`path` as `PIECE_S` chunks, each its own sentence, from piece `first` on (read lazily)."""
    try:
        fh, header = open_wav(path)
    except AudioError as exc:
        raise AudioError(f"cannot play the announcement's audio: {exc}") from None
    with fh:
        frames = max(1, round(header.rate * PIECE_S))
        count = -(-header.frames // frames)
        step = header.channels * header.width
        fh.seek(header.data_offset + first * frames * step)
        for index in range(first, count):
            data = fh.read(min(frames, header.frames - index * frames) * step)
            samples = decode(data, header.encoding, header.width, header.channels, path)
            yield AudioChunk(samples, header.rate, index, last=True, engine=ENGINE)
