"""A mel-spectrogram vocoder exported by `edge-export vocoder`, run in windows on a worker pool.

An acoustic model that produces mel frames (HiFi-GAN's analysis: the export's
`manifest.json` says which) hands them to `MelVocoder.stream`, which yields audio
window by window: the first window is small so playback can start early, the
others are spread over `threads` single-threaded workers and come back in order.
Windows decode to the same samples as the whole spectrogram (`edge_agent.tts.windowed`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_agent.audio.frames import Samples
from edge_agent.errors import ModelError
from edge_agent.models.jsonfile import read_json
from edge_agent.models.store import sha256_file
from edge_agent.runtime.providers import CPU, Accelerator
from edge_agent.runtime.sessions import make_session
from edge_agent.tts.pool import PriorityPool
from edge_agent.tts.windowed import Vocoder, VocoderInfo, plan_windows, window_profile

log = logging.getLogger(__name__)

FORMAT = "edge-speech/vocoder-onnx"
MANIFEST = "manifest.json"
URGENT, WINDOW = 0, 1
"""Pool priorities: the first window (playback waits for it), then the rest in order."""


@dataclass(frozen=True)
class VocoderExport:
    """What the runtime reads from an export directory's manifest."""

    directory: Path
    sample_rate: int
    mel: dict[str, Any]
    """The analysis the mel frames must follow (n_fft, hop, n_mels, fmin, fmax, log)."""
    info: VocoderInfo
    variants: dict[str, dict[str, Any]]
    files: dict[str, dict[str, Any]]
    default_variant: str

    @staticmethod
    def load(directory: Path) -> VocoderExport:
        path = directory / MANIFEST
        doc = read_json(path, "not a vocoder export: run `edge-export vocoder`")
        found = doc.get("format") if isinstance(doc, dict) else None
        if found != FORMAT:
            raise ModelError(f"{path}: not a vocoder export (format {found!r}, expected {FORMAT!r})")
        try:
            return VocoderExport(directory, int(doc["sample_rate"]), dict(doc["mel"]),
                                 VocoderInfo.from_json(doc["window"]), dict(doc["variants"]),
                                 dict(doc["files"]), str(doc["default_variant"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{path}: incomplete vocoder manifest ({exc})") from None

    def windowed_file(self, variant: str | None) -> Path:
        """The windowed graph of `variant` (default: the measured default), its hash checked."""
        name = variant or self.default_variant
        usable = [n for n, v in self.variants.items() if "error" not in v]
        if name not in usable:
            raise ModelError(f"{self.directory}: no usable variant {name!r} (usable: {', '.join(usable)})")
        file = str(self.variants[name]["files"]["windowed"])
        path = self.directory / file
        entry = self.files.get(file, {})
        if not path.is_file():
            raise ModelError(f"{path}: missing")
        if path.stat().st_size != entry.get("size") or sha256_file(path) != entry.get("sha256"):
            raise ModelError(f"{path}: does not match the manifest's size and sha256 (altered or truncated)")
        return path


class MelVocoder:
    """Mel frames `[n_mels, frames]` in, float32 audio out, in windows on `threads` workers."""

    def __init__(self, export: VocoderExport, session: Any, variant: str, threads: int) -> None:
        self.export = export
        self.variant = variant
        self.sample_rate = export.sample_rate
        self.hop = export.info.hop
        self._vocoder = Vocoder(session, export.info)
        self._workers = max(1, threads)
        self._pool = PriorityPool(self._workers, "vocoder")

    @staticmethod
    def load(directory: Path, variant: str | None = None, threads: int = 2, *,
             accel: Accelerator = CPU) -> MelVocoder:
        """`variant` (default: the manifest's) of the export in `directory`, on `accel`'s providers."""
        return MelVocoder.load_export(VocoderExport.load(directory), variant, threads, accel=accel)

    @staticmethod
    def load_export(export: VocoderExport, variant: str | None = None, threads: int = 2, *,
                    accel: Accelerator = CPU) -> MelVocoder:
        path = export.windowed_file(variant)
        started = time.perf_counter()
        # One thread per window, `threads` windows at once (as the Piper voice's vocoder runs).
        session = make_session(path, 1, shapes_vary=True, accel=accel, profile=window_profile(export.info))
        names = {i.name for i in session.get_inputs()}
        if export.info.latent not in names:
            raise ModelError(f"{path}: has no input {export.info.latent!r} ({', '.join(sorted(names))})")
        log.info("vocoder %s (%s) loaded in %.2f s", export.directory.name, path.name,
                 time.perf_counter() - started)
        return MelVocoder(export, session, variant or export.default_variant, threads)

    def _check(self, mel: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
        channels = self.export.info.channels
        if mel.ndim == 2:
            mel = mel[None]
        if mel.ndim != 3 or mel.shape[0] != 1 or mel.shape[1] != channels:
            raise ValueError(f"mel of shape {tuple(mel.shape)}: expected [{channels}, frames]")
        if not np.isfinite(mel).all():
            raise ValueError("mel holds NaN or infinite values")
        return np.ascontiguousarray(mel, dtype=np.float32)

    def stream(self, mel: npt.NDArray[Any]) -> Iterator[Samples]:
        """Audio for `mel`, window by window, in order; closing early cancels what is queued."""
        z = self._check(mel)
        windows = plan_windows(z.shape[-1], first=True, workers=self._workers)
        jobs = [self._pool.submit(URGENT if n == 0 else WINDOW, self._vocoder.decode, z, start, end)
                for n, (start, end) in enumerate(windows)]
        try:
            for job in jobs:
                yield np.clip(job.result(), -1.0, 1.0).astype(np.float32, copy=False)
        finally:
            for job in jobs:
                job.cancel()

    def synthesize(self, mel: npt.NDArray[Any]) -> Samples:
        """All the audio of `mel` (`frames * hop` samples)."""
        pieces = list(self.stream(mel))
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)

    def close(self) -> None:
        self._pool.shutdown()
