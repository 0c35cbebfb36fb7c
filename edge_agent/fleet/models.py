"""Model updates named by a fleet config: download, verify, test-load, swap, roll back.

Each version of a model lives, complete and verified, in its own directory:

    <models.cache_dir>/.fleet/<id>/<version key>/<files>

and the model store's own path `<models.cache_dir>/<id>` becomes a symlink to the
active one. Swapping is one `rename` of a new symlink over the old; the previous
version's directory stays, so rolling back is another. A real directory that
was there before the first update (a model fetched with `edge-agent models
fetch`) is moved aside to `.fleet/<id>/baseline` and comes back when no config
pins the model any more. The links are derived state: `reconcile(pins)` makes
them match the active config, and is run again at every start, so a crash
between writing the config and swapping the links leaves nothing half done.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from edge_agent.atomic import fsync_dir
from edge_agent.errors import ModelError
from edge_agent.fleet.envelope import ModelSpec
from edge_agent.fleet.settings import FleetSettings
from edge_agent.models.download import download

log = logging.getLogger(__name__)

FLEET_DIR = ".fleet"
BASELINE = "baseline"
_COMPLETE = ".complete"

Progress = Callable[[str], None]


def version_key(spec: ModelSpec) -> str:
    """Names a model version by its content: the same files give the same key."""
    listing = sorted((f.name, f.sha256, f.size) for f in spec.files)
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]


class FleetModels:
    """Versions of fleet-managed models under one model cache."""

    def __init__(self, cache_dir: Path, settings: FleetSettings) -> None:
        self.cache_dir = cache_dir
        self.root = cache_dir / FLEET_DIR
        self.settings = settings

    def version_dir(self, model_id: str, key: str) -> Path:
        return self.root / model_id / key

    # -- preparing a version -------------------------------------------------------------

    def prepare(self, spec: ModelSpec, progress: Progress | None = None) -> str:
        """Make `spec` present as a verified, test-loaded version; return its key."""
        key = version_key(spec)
        final = self.version_dir(spec.id, key)
        if (final / _COMPLETE).is_file():
            return key
        for f in spec.files:
            if f.size > self.settings.max_model_bytes:
                raise ModelError(f"{f.name} is {f.size} bytes, the limit is {self.settings.max_model_bytes} "
                                 "(fleet.max_model_bytes)")
        incoming = self.root / spec.id / ".incoming"
        staging = self.root / spec.id / f".staging-{key}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for f in spec.files:
            # Partial downloads are keyed by hash, so a retry (or a later config naming the
            # same file) resumes them.
            got = download(spec.file_url(f.name), incoming / f.sha256, sha256=f.sha256, size=f.size,
                           timeout=self.settings.download_timeout_s,
                           attempts=self.settings.download_attempts, progress=progress)
            os.replace(got, staging / f.name)
        self.probe([staging / f.name for f in spec.files])
        (staging / _COMPLETE).write_text(json.dumps(spec.to_json()))
        for path in staging.iterdir():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(staging)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        fsync_dir(final.parent)
        return key

    def probe(self, paths: list[Path]) -> None:
        """Test-load in a child process: a crash there costs the child, not the daemon."""
        cmd = [sys.executable, "-m", "edge_agent.fleet.probe", *map(str, paths)]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                    timeout=self.settings.probe_timeout_s)
        except subprocess.TimeoutExpired:
            raise ModelError(f"test-load took more than {self.settings.probe_timeout_s:g} s") from None
        if result.returncode < 0:
            raise ModelError(f"test-load crashed (signal {-result.returncode})")
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or ["unknown error"])[-1]
            raise ModelError(f"test-load failed: {reason}")

    # -- activating ---------------------------------------------------------------------

    def reconcile(self, pins: Mapping[str, str]) -> None:
        """Point `<cache>/<id>` at the pinned versions; unpinned ids get their baseline back."""
        changed = False
        for model_id, key in pins.items():
            if not (self.version_dir(model_id, key) / _COMPLETE).is_file():
                raise ModelError(f"model {model_id} version {key} is not present")
            changed |= self._link(model_id, Path(FLEET_DIR) / model_id / key)
        for link in self._fleet_links():
            if link.name in pins:
                continue
            baseline = self.root / link.name / BASELINE
            if baseline.is_dir():
                changed |= self._link(link.name, Path(FLEET_DIR) / link.name / BASELINE)
            else:
                link.unlink()
                changed = True
        if changed:
            fsync_dir(self.cache_dir)

    def _link(self, model_id: str, target: Path) -> bool:
        link = self.cache_dir / model_id
        if link.is_symlink():
            if Path(os.readlink(link)) == target:
                return False
        elif link.exists():
            baseline = self.root / model_id / BASELINE
            shutil.rmtree(baseline, ignore_errors=True)
            baseline.parent.mkdir(parents=True, exist_ok=True)
            os.replace(link, baseline)
            fsync_dir(baseline.parent)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.cache_dir / f".{model_id}.link"
        tmp.unlink(missing_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, link)
        log.info("model %s -> %s", model_id, target)
        return True

    def _fleet_links(self) -> list[Path]:
        if not self.cache_dir.is_dir():
            return []
        prefix = f"{FLEET_DIR}/"
        return [p for p in self.cache_dir.iterdir()
                if p.is_symlink() and os.readlink(p).startswith(prefix)]

    def active(self) -> dict[str, str]:
        """id -> version key (or `baseline`) of every link now in place."""
        return {p.name: Path(os.readlink(p)).name for p in self._fleet_links()}

    def prune(self, keep: Mapping[str, set[str]]) -> None:
        """Delete versions not in `keep` (id -> keys); baselines and partial downloads stay."""
        if not self.root.is_dir():
            return
        for model_dir in self.root.iterdir():
            for version in model_dir.iterdir():
                if version.name in (BASELINE, ".incoming") or version.name in keep.get(model_dir.name, set()):
                    continue
                shutil.rmtree(version, ignore_errors=True)
                log.info("model %s: removed unused version %s", model_dir.name, version.name)
