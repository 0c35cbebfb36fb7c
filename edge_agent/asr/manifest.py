"""The manifest `edge-export whisper` writes beside the ONNX encoder and decoder.

Only what the runtime needs is read; unknown keys are ignored so newer exports
load. Every file the manifest lists is checked for its size on load and for its
sha256 once (then remembered by size and mtime in `.verified.json`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_agent.errors import ModelError
from edge_agent.models.store import sha256_file

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_STAMP = ".verified.json"
_MAX_MANIFEST = 4 << 20


@dataclass(frozen=True)
class Dims:
    """Whisper's model dimensions."""

    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    n_vocab: int


@dataclass(frozen=True)
class SpecialTokens:
    """Ids of Whisper's control tokens."""

    sot: int
    eot: int
    transcribe: int
    translate: int
    no_timestamps: int
    no_speech: int | None
    sot_sequence: tuple[int, ...]
    """`<|startoftranscript|>` and, for multilingual models, the default language and task."""
    languages: dict[str, int]
    """Language code -> token id (empty for English-only models)."""


@dataclass(frozen=True)
class Variant:
    """One exported precision of the encoder and decoder."""

    name: str
    encoder: str
    decoder: str
    info: dict[str, Any]
    """What the exporter measured (size, load time, RTF, WER, logit difference)."""


@dataclass(frozen=True)
class Manifest:
    """A parsed `manifest.json`."""

    directory: Path
    dims: Dims
    multilingual: bool
    tokens: SpecialTokens
    suppress_tokens: tuple[int, ...]
    begin_suppress_tokens: tuple[int, ...]
    """Suppressed on the first sampled step only (blank and end of text)."""
    sample_rate: int
    variants: dict[str, Variant]
    default_variant: str
    files: dict[str, dict[str, Any]]
    source: Any

    def variant(self, name: str | None) -> Variant:
        chosen = name or self.default_variant
        try:
            return self.variants[chosen]
        except KeyError:
            known = ", ".join(sorted(self.variants)) or "none"
            raise ModelError(f"{self.directory}: no variant {chosen!r} (exported: {known})") from None

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / "tokenizer.json"


EXPORT_HINT = ("export it once with `edge-export whisper --source whisper-tiny.en`, which "
               "`pip install './tools[export]'` installs from the source tree (CPU torch first: "
               "docs/models.md), or set asr.model to an export's directory")
"""The next step wherever an exported Whisper is missing."""


def load_manifest(directory: Path) -> Manifest:
    """Read and check `directory/manifest.json`."""
    path = directory / MANIFEST
    try:
        if path.stat().st_size > _MAX_MANIFEST:
            raise ModelError(f"{path}: larger than {_MAX_MANIFEST} bytes")
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{directory}: no exported Whisper here (no {MANIFEST}); {EXPORT_HINT}") from None
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: unreadable manifest ({exc})") from None
    try:
        return _parse(doc, directory)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelError(f"{path}: malformed manifest ({type(exc).__name__}: {exc})") from None


def _parse(doc: dict[str, Any], directory: Path) -> Manifest:
    dims = Dims(**{name: int(doc["dims"][name]) for name in Dims.__dataclass_fields__})
    special = doc.get("tokens") or doc.get("special_tokens") or doc
    languages = special.get("languages") or special.get("language_tokens") or {}
    tokens = SpecialTokens(
        sot=int(special["sot"]),
        eot=int(special["eot"]),
        transcribe=int(special["transcribe"]),
        translate=int(special["translate"]),
        no_timestamps=int(special["no_timestamps"]),
        no_speech=None if special.get("no_speech") is None else int(special["no_speech"]),
        sot_sequence=tuple(int(t) for t in special["sot_sequence"]),
        languages={str(k): int(v) for k, v in languages.items()},
    )
    variants = {}
    for name, info in doc["variants"].items():
        files = info.get("files") or {}
        if info.get("error") or not files:
            continue  # the exporter records variants that failed; they have no files
        if isinstance(files, dict):
            encoder, decoder = files.get("encoder"), files.get("decoder")
        else:
            encoder = next((f for f in files if str(f).startswith("encoder")), None)
            decoder = next((f for f in files if str(f).startswith("decoder")), None)
        if not encoder or not decoder:
            raise ValueError(f"variant {name!r} does not name its encoder and decoder files")
        variants[name] = Variant(name, str(encoder), str(decoder), dict(info))
    default = str(doc.get("default_variant") or next(iter(variants), ""))
    return Manifest(
        directory=directory,
        dims=dims,
        multilingual=bool(doc.get("multilingual", False)),
        tokens=tokens,
        suppress_tokens=tuple(int(t) for t in doc.get("suppress_tokens", ())),
        begin_suppress_tokens=tuple(int(t) for t in doc.get("begin_suppress_tokens", ())),
        sample_rate=int(doc.get("sample_rate", 16000)),
        variants=variants,
        default_variant=default,
        files={str(k): dict(v) for k, v in (doc.get("files") or {}).items()},
        source=doc.get("source"),
    )


def verify_files(manifest: Manifest, names: list[str]) -> None:
    """Check the named files against the manifest: size every time, sha256 once per change."""
    stamp_path = manifest.directory / _STAMP
    stamps = _read_stamps(stamp_path)
    changed = False
    for name in names:
        path = manifest.directory / name
        try:
            st = path.stat()
        except FileNotFoundError:
            raise ModelError(f"{path}: missing from the export") from None
        expected = manifest.files.get(name)
        if expected is None:
            log.warning("%s is not listed in the manifest; not verified", path)
            continue
        if "size" in expected and st.st_size != int(expected["size"]):
            raise ModelError(f"{path}: {st.st_size} bytes, the manifest says {expected['size']}")
        digest = str(expected.get("sha256", ""))
        key = f"{name}:{st.st_size}:{st.st_mtime_ns}"
        if not digest or stamps.get(name) == key:
            continue
        actual = sha256_file(path)
        if actual != digest:
            raise ModelError(f"{path}: sha256 {actual} does not match the manifest's {digest}")
        stamps[name] = key
        changed = True
    if changed:
        _write_stamps(stamp_path, stamps)


def _read_stamps(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_stamps(path: Path, stamps: dict[str, str]) -> None:
    try:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(stamps, indent=1))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only export only costs a rehash next time
        log.debug("cannot record verification stamp %s: %s", path, exc)
