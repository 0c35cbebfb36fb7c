"""Accepting a fleet config: verify, stage, commit atomically, health-check, roll back.

State in `fleet.state_dir` (every file replaced atomically: temp, fsync, rename, fsync dir):

    highest.json   {version, digest, outcome}  the highest version ever accepted for apply,
                                               stored before it is activated (anti-replay)
    active.json    {state: trial|applied, current: record, previous: record}
                   record = {envelope, pins: {model id: version key}, catalog}
    catalog-*.json the model catalog a config with model updates runs with
    inbox/         config payloads received and not yet processed

`active.json` is the single commit point: before its rename the old config is
active, after it the new one (in `trial` until the health check passes; a
restart during trial rolls back, so a config that crashes the agent cannot keep
it in a crash loop). Model links are derived from it at every start.

Steps, each a crash point (`EDGE_AGENT_CRASH_AT=fleet:<step>`): verified,
catalog-written, downloaded, version:temp-written, version:renamed, active:temp-written,
active:renamed, links, health-checked, commit:temp-written, commit:renamed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.atomic import atomic_write, fsync_dir, remove_stale_temps
from edge_agent.errors import EdgeError, ModelError
from edge_agent.faults import crash_point
from edge_agent.fleet.envelope import (
    Envelope,
    FleetRejected,
    ModelSpec,
    canonical_json,
    decode_payload,
    parse_envelope,
    trusted_keys,
    verify,
)
from edge_agent.fleet.models import FleetModels
from edge_agent.fleet.settings import FleetSettings
from edge_agent.models.catalog import Catalog, CatalogEntry
from edge_agent.safeyaml import load_yaml_file
from edge_agent.typedtree import build, merge, to_dict

log = logging.getLogger(__name__)

STEPS = (
    "verified", "catalog-written", "downloaded", "version:temp-written", "version:renamed",
    "active:temp-written", "active:renamed", "links", "health-checked",
    "commit:temp-written", "commit:renamed",
)
"""Crash points of one apply, in order (prefixed `fleet:`)."""


@dataclass(frozen=True)
class ActiveConfig:
    """The fleet config in force (version 0: none, only the local config)."""

    version: int = 0
    layer: dict[str, Any] = field(default_factory=dict)
    """Merged over the local config file."""
    pins: dict[str, str] = field(default_factory=dict)
    digest: str = ""


@dataclass(frozen=True)
class Report:
    """The outcome of one config payload, as published on `config/status`."""

    version: int | None
    state: str
    """applied, rejected or rolled_back."""
    error: str | None = None
    active_version: int = 0
    unchanged: bool = False

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"version": self.version, "state": self.state}
        if self.error:
            doc["error"] = self.error
        if self.unchanged:
            doc["unchanged"] = True
        doc["active_version"] = self.active_version
        doc["ts"] = round(time.time(), 3)
        return doc


Activate = Callable[[ActiveConfig], None]
"""Reload what changed and health-check it; raise to roll back."""
Validate = Callable[[dict[str, Any]], None]
"""Raise `ConfigError` if a layer does not make valid settings."""


def _digest(envelope: Envelope) -> str:
    return hashlib.sha256(envelope.signed_bytes()).hexdigest()


def _record_config(record: Mapping[str, Any] | None, state_dir: Path) -> ActiveConfig:
    if not record:
        return ActiveConfig()
    env = record["envelope"]
    layer = dict(env.get("config", {}))
    if record.get("catalog"):
        layer = merge(layer, {"models": {"catalog": str(state_dir / record["catalog"])}})
    pins = dict(record.get("pins", {}))
    body = {k: v for k, v in env.items() if k != "signature"}
    return ActiveConfig(int(env["version"]), layer, pins, hashlib.sha256(canonical_json(body)).hexdigest())


class FleetManager:
    """Applies signed configs for one device."""

    def __init__(self, settings: FleetSettings, *, device: str, group: Callable[[], str],
                 cache_dir: Path, validate: Validate, activate: Activate,
                 base_catalog: Catalog, user_catalog: Path | None = None,
                 report: Callable[[Report], None] | None = None) -> None:
        self.settings = settings
        self.device = device
        self.group = group
        self.dir = settings.state_dir
        self.inbox = self.dir / "inbox"
        self.models = FleetModels(cache_dir, settings)
        self._validate = validate
        self._activate = activate
        self._base_catalog = base_catalog
        self._user_catalog = user_catalog
        self._report = report or (lambda _r: None)
        self._keys = trusted_keys(settings.trusted_keys)
        self._state: dict[str, Any] = {"state": "applied", "current": None, "previous": None}
        self._pending_report: Report | None = None

    # -- state files ---------------------------------------------------------------------

    @property
    def active(self) -> ActiveConfig:
        return _record_config(self._state.get("current"), self.dir)

    def _read_json(self, name: str) -> Any:
        try:
            return json.loads((self.dir / name).read_bytes())
        except FileNotFoundError:
            return None

    def _highest(self) -> dict[str, Any]:
        doc = self._read_json("highest.json")
        return doc if isinstance(doc, dict) else {"version": 0, "digest": "", "outcome": "applied"}

    def _write(self, name: str, doc: Any, step: str) -> None:
        atomic_write(self.dir / name, json.dumps(doc, indent=1, sort_keys=True).encode(), step=step)

    # -- start-up ------------------------------------------------------------------------

    def recover(self) -> ActiveConfig:
        """Settle whatever a crash left and return the config to run with."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.inbox.mkdir(exist_ok=True)
        remove_stale_temps(self.dir)
        remove_stale_temps(self.inbox)
        state = self._read_json("active.json")
        if isinstance(state, dict):
            self._state = state
        if self._state.get("state") == "trial":
            version = self.active.version
            log.error("restarted while config version %d was on trial; rolling back", version,
                      extra={"config_version": version})
            reason = f"the agent restarted before the health check of version {version} passed"
            self._roll_back(version, activate=False)
            self._pending_report = Report(version, "rolled_back", reason, self.active.version)
        self.models.reconcile(self.active.pins)
        return self.active

    # -- inbox (MQTT thread) -------------------------------------------------------------

    def enqueue(self, payload: bytes) -> bool:
        """Persist a received payload for the worker; True once it may be acknowledged."""
        if not payload:
            return True  # a cleared retained message
        if len(payload) > self.settings.max_payload_bytes:
            reason = f"payload is {len(payload)} bytes, the limit is {self.settings.max_payload_bytes}"
            log.warning("config rejected: %s", reason)
            self._publish(Report(None, "rejected", reason, self.active.version))
            return True
        name = f"{time.time_ns():020d}-{hashlib.sha256(payload).hexdigest()[:8]}.msg"
        try:
            atomic_write(self.inbox / name, payload)
        except OSError as exc:
            log.error("cannot store a received config: %s", exc)
            return False
        return True

    def pending(self) -> Iterator[Path]:
        yield from sorted(self.inbox.glob("*.msg"))

    def process_inbox(self) -> list[Report]:
        reports = []
        for path in self.pending():
            try:
                payload = path.read_bytes()
            except OSError:
                continue
            reports.append(self.handle(payload))
            path.unlink(missing_ok=True)
            with suppress(OSError):
                fsync_dir(self.inbox)
        return reports

    # -- one payload ---------------------------------------------------------------------

    def handle(self, payload: bytes) -> Report:
        """Verify and apply one config payload; the report is also published."""
        try:
            envelope = self._check(payload)
        except FleetRejected as exc:
            log.warning("config rejected: %s", exc.reason, extra={"config_version": exc.version})
            return self._publish(Report(exc.version, "rejected", exc.reason, self.active.version))
        if envelope is None:
            active = self.active
            return self._publish(Report(active.version, "applied", None, active.version, unchanged=True))
        return self._publish(self._apply(envelope))

    def _check(self, payload: bytes) -> Envelope | None:
        """Everything that needs no download; None if `payload` is the active config again."""
        envelope = parse_envelope(decode_payload(payload, self.settings.max_payload_bytes))
        version = envelope.version
        verify(envelope, self._keys)
        group = self.group()
        if not envelope.matches(self.device, group):
            raise FleetRejected(f"target {envelope.target} is not this device "
                                f"(device:{self.device}, group:{group})", version)
        if envelope.expired():
            raise FleetRejected(f"expired at {envelope.expires_at:.0f} (now {time.time():.0f})", version)
        digest = _digest(envelope)
        if digest == self.active.digest:
            return None
        highest = self._highest()
        retry = digest == highest.get("digest") and highest.get("outcome") == "pending"
        if version < highest["version"] or (version == highest["version"] and not retry):
            raise FleetRejected(f"version {version} is not newer than {highest['version']} (replay)", version)
        self._check_protected(envelope)
        return envelope

    def _check_protected(self, envelope: Envelope) -> None:
        for path in _leaf_paths(envelope.config):
            for key in self.settings.protected:
                if path == key or path.startswith(key + ".") or key.startswith(path + "."):
                    raise FleetRejected(f"config sets protected key {path} (fleet.protected_keys)",
                                        envelope.version)

    def _apply(self, envelope: Envelope) -> Report:
        version = envelope.version
        crash_point("fleet:verified")
        previous = self._state.get("current")
        try:
            catalog_name = self._write_catalog(envelope)
            record = {"envelope": envelope.to_json(), "pins": {}, "catalog": catalog_name}
            self._validate(_record_config(record, self.dir).layer)
            crash_point("fleet:catalog-written")
            pins = {}
            for spec in envelope.models:
                try:
                    pins[spec.id] = self.models.prepare(spec)
                except ModelError as exc:
                    raise FleetRejected(f"model {spec.id}: {exc}", version) from None
            record["pins"] = pins
            crash_point("fleet:downloaded")
        except FleetRejected as exc:
            log.warning("config rejected: %s", exc.reason, extra={"config_version": version})
            return Report(version, "rejected", exc.reason, self.active.version)
        except EdgeError as exc:
            log.warning("config rejected: %s", exc, extra={"config_version": version})
            return Report(version, "rejected", str(exc), self.active.version)
        digest = _digest(envelope)
        trial = {"state": "trial", "current": record, "previous": previous}
        try:
            self._write("highest.json", {"version": version, "digest": digest, "outcome": "pending"},
                        "fleet:version")
            self._write("active.json", trial, "fleet:active")
        except OSError as exc:
            log.error("cannot store config version %d: %s", version, exc, extra={"config_version": version})
            return Report(version, "rejected", f"cannot store it: {exc}", self.active.version)
        self._state = trial
        active = self.active
        try:
            self.models.reconcile(active.pins)
            crash_point("fleet:links")
            self._activate(active)
            crash_point("fleet:health-checked")
        except Exception as exc:
            reason = _one_line(exc)
            log.error("config version %d failed its health check: %s", version, reason,
                      extra={"config_version": version})
            self._roll_back(version, activate=True)
            return Report(version, "rolled_back", f"health check failed: {reason}", self.active.version)
        self._state = {"state": "applied", "current": record, "previous": previous}
        self._write("active.json", self._state, "fleet:commit")
        self._write("highest.json", {"version": version, "digest": digest, "outcome": "applied"}, "")
        self._prune()
        log.info("config version %d applied", version, extra={"config_version": version})
        return Report(version, "applied", None, version)

    def _roll_back(self, version: int, *, activate: bool) -> None:
        previous = self._state.get("previous")
        self._state = {"state": "applied", "current": previous, "previous": None}
        self._write("active.json", self._state, "fleet:rollback")
        highest = self._highest()
        if highest.get("version") == version:
            self._write("highest.json", {**highest, "outcome": "rolled_back"}, "")
        self.models.reconcile(self.active.pins)
        if activate:
            try:
                self._activate(self.active)
            except Exception as exc:  # the old config worked before; say so loudly if not now
                log.critical("previous config (version %d) fails too after rollback: %s",
                             self.active.version, _one_line(exc))

    def take_startup_report(self) -> Report | None:
        """A rollback done by `recover`, to publish once connected."""
        report, self._pending_report = self._pending_report, None
        return report

    def _publish(self, report: Report) -> Report:
        try:
            self._report(report)
        except Exception:
            log.exception("cannot publish config status")
        return report

    # -- models --------------------------------------------------------------------------

    def _write_catalog(self, envelope: Envelope) -> str | None:
        """The catalog a config with model updates runs with (user entries plus updated ones)."""
        if not envelope.models:
            return None
        entries: dict[str, Any] = {}
        if self._user_catalog is not None:
            doc = load_yaml_file(self._user_catalog)
            for item in (doc or {}).get("models", []):
                entries[item["id"]] = item
        for index, spec in enumerate(envelope.models):
            entries[spec.id] = self._entry(spec, index, envelope.version)
        body = json.dumps({"models": list(entries.values())}, indent=1, sort_keys=True).encode()
        name = f"catalog-{hashlib.sha256(body).hexdigest()[:16]}.json"
        if not (self.dir / name).is_file():
            atomic_write(self.dir / name, body)
        return name

    def _entry(self, spec: ModelSpec, index: int, version: int) -> dict[str, Any]:
        known = self._base_catalog.entries.get(spec.id)
        base: dict[str, Any] = to_dict(known) if known is not None else {}
        if known is None and not (spec.task and spec.runtime):
            raise FleetRejected(f"models[{index}] {spec.id}: 'task' and 'runtime' are needed for a model "
                                "the catalog does not know", version)
        doc = {
            **base,
            "id": spec.id,
            "source": {"kind": "url", "url": spec.url, "packages": []},
            "files": [{"name": f.name, "sha256": f.sha256, "size": f.size, "parts": []} for f in spec.files],
        }
        doc.setdefault("licence", "unknown (fleet update)")
        for key in ("task", "runtime", "licence"):
            if getattr(spec, key):
                doc[key] = getattr(spec, key)
        if spec.sample_rate is not None:
            doc["sample_rate"] = spec.sample_rate
        try:
            build(CatalogEntry, doc)
        except EdgeError as exc:
            raise FleetRejected(f"models[{index}] {spec.id}: {exc}", version) from None
        return doc

    def _prune(self) -> None:
        keep: dict[str, set[str]] = {}
        for record in (self._state.get("current"), self._state.get("previous")):
            for model_id, key in (record or {}).get("pins", {}).items():
                keep.setdefault(model_id, set()).add(key)
        self.models.prune(keep)
        names = {(r or {}).get("catalog") for r in (self._state.get("current"), self._state.get("previous"))}
        for path in self.dir.glob("catalog-*.json"):
            if path.name not in names:
                path.unlink(missing_ok=True)


def _leaf_paths(tree: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            yield from _leaf_paths(value, path)
        else:
            yield path


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
