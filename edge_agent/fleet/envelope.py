"""The signed fleet config envelope.

    {version: int, target: "device:<id>" | "group:<g>" | "all", issued_at, expires_at?,
     config: {...}, models?: [...], signature}

`signature` is Ed25519 over the canonical JSON of everything else: UTF-8, keys
sorted, no whitespace, no NaN/Infinity (`json.dumps(doc, sort_keys=True,
separators=(",", ":"), ensure_ascii=False, allow_nan=False)`), base64-encoded.
Times are unix seconds. A payload may be JSON or YAML; its size is checked
before it is parsed and YAML is read under alias, depth and node limits.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edge_agent.errors import ConfigError, EdgeError
from edge_agent.models.catalog import MODEL_ID_PATTERN, SHA256_PATTERN
from edge_agent.safeyaml import YamlLimits, load_yaml

FIELDS = ("version", "target", "issued_at", "expires_at", "config", "models", "signature")
_TARGET = re.compile(r"^(all|device:[^/+#\s\x00]+|group:[^/+#\s\x00]+)$")
MAX_DEPTH = YamlLimits.max_depth
MAX_NODES = YamlLimits.max_nodes


class FleetRejected(EdgeError):
    """A fleet config that will not be applied, and why."""

    def __init__(self, reason: str, version: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.version = version


@dataclass(frozen=True)
class ModelFileSpec:
    """One file of a model update."""

    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ModelSpec:
    """A model a config asks for: each file is fetched from `<url>/<name>`."""

    id: str
    url: str
    files: tuple[ModelFileSpec, ...]
    task: str = ""
    """Needed for a model the catalog does not know; otherwise taken from the catalog."""
    runtime: str = ""
    sample_rate: int | None = None
    licence: str = ""

    def file_url(self, name: str) -> str:
        return f"{self.url.rstrip('/')}/{name}"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": self.id, "url": self.url,
                               "files": [{"name": f.name, "sha256": f.sha256, "size": f.size}
                                         for f in self.files]}
        for key in ("task", "runtime", "licence"):
            if getattr(self, key):
                doc[key] = getattr(self, key)
        if self.sample_rate is not None:
            doc["sample_rate"] = self.sample_rate
        return doc


@dataclass(frozen=True)
class Envelope:
    """A parsed (not yet verified) envelope."""

    version: int
    target: str
    issued_at: float
    expires_at: float | None
    config: dict[str, Any]
    models: tuple[ModelSpec, ...]
    signature: str
    body: dict[str, Any]
    """Every field but `signature`: what the signature covers."""

    def signed_bytes(self) -> bytes:
        return canonical_json(self.body)

    def to_json(self) -> dict[str, Any]:
        return {**self.body, "signature": self.signature}

    def matches(self, device: str, group: str) -> bool:
        return self.target in ("all", f"device:{device}", f"group:{group}")

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (time.time() if now is None else now) >= self.expires_at


def canonical_json(doc: Any) -> bytes:
    try:
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise FleetRejected(f"not representable as canonical JSON: {exc}") from None


# -- parsing ---------------------------------------------------------------------------------


def decode_payload(payload: bytes, max_bytes: int) -> Any:
    """JSON or YAML under limits; the size is checked before any parsing."""
    if len(payload) > max_bytes:
        raise FleetRejected(f"payload is {len(payload)} bytes, the limit is {max_bytes}")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FleetRejected(f"payload is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if text.lstrip().startswith(("{", "[")):
        try:
            doc = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            raise FleetRejected(f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
        except RecursionError:
            raise FleetRejected(f"JSON nests deeper than {MAX_DEPTH} levels") from None
        except ValueError as exc:
            raise FleetRejected(f"invalid JSON: {exc}") from None
        _check_shape(doc)
        return doc
    try:
        doc = load_yaml(text, source="config payload",
                        limits=YamlLimits(max_bytes=max_bytes, max_depth=MAX_DEPTH, max_nodes=MAX_NODES))
    except ConfigError as exc:
        raise FleetRejected(str(exc)) from None
    _check_shape(doc)
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise ValueError(f"duplicate key {key!r}")
        doc[key] = value
    return doc


def _check_shape(doc: Any) -> None:
    """Depth, size and JSON types only (YAML can produce dates, sets, non-string keys)."""
    count = 0
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise FleetRejected(f"document nests deeper than {MAX_DEPTH} levels")
        if count > MAX_NODES:
            raise FleetRejected(f"document has more than {MAX_NODES} nodes")
        if isinstance(node, dict):
            for key, value in node.items():
                if not isinstance(key, str):
                    raise FleetRejected(f"mapping key {key!r} is not a string")
                stack.append((value, depth + 1))
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node)
        elif isinstance(node, float) and not math.isfinite(node):
            raise FleetRejected("NaN and Infinity are not allowed")
        elif node is not None and not isinstance(node, str | int | float | bool):
            raise FleetRejected(f"value of type {type(node).__name__} is not allowed (JSON types only)")


def parse_envelope(doc: Any) -> Envelope:
    """Check the envelope's fields; the signature is checked by `verify`."""
    if not isinstance(doc, dict):
        raise FleetRejected("a config envelope must be a mapping")
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise FleetRejected(f"unknown envelope field {unknown[0]!r} (expected: {', '.join(FIELDS)})")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise FleetRejected("'version' must be an integer >= 1")

    def reject(reason: str) -> FleetRejected:
        return FleetRejected(reason, version)

    target = doc.get("target")
    if not isinstance(target, str) or not _TARGET.fullmatch(target):
        raise reject("'target' must be device:<id>, group:<name> or all")
    issued_at = doc.get("issued_at")
    if not _number(issued_at):
        raise reject("'issued_at' must be a number (unix seconds)")
    expires_at = doc.get("expires_at")
    if expires_at is not None and not _number(expires_at):
        raise reject("'expires_at' must be a number (unix seconds)")
    config = doc.get("config")
    if not isinstance(config, dict):
        raise reject("'config' must be a mapping")
    models = tuple(_model(m, i, version) for i, m in enumerate(_list(doc.get("models", []), version)))
    ids = [m.id for m in models]
    if len(set(ids)) != len(ids):
        raise reject("a model id appears twice in 'models'")
    signature = doc.get("signature")
    if not isinstance(signature, str):
        raise reject("'signature' is missing")
    body = {k: v for k, v in doc.items() if k != "signature"}
    return Envelope(version, target, float(issued_at),  # type: ignore[arg-type]
                    float(expires_at) if expires_at is not None else None, config, models, signature, body)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _list(value: Any, version: int) -> list[Any]:
    if not isinstance(value, list):
        raise FleetRejected("'models' must be a list", version)
    return value


def _model(doc: Any, index: int, version: int) -> ModelSpec:
    where = f"models[{index}]"

    def reject(reason: str) -> FleetRejected:
        return FleetRejected(f"{where}: {reason}", version)

    if not isinstance(doc, dict):
        raise reject("must be a mapping")
    model_id = doc.get("id")
    if not isinstance(model_id, str) or not MODEL_ID_PATTERN.fullmatch(model_id):
        raise reject("'id' must be a model id (letters, digits, ._-)")
    url = doc.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise reject("'url' must be an http:// or https:// URL")
    base: str
    if "files" in doc:
        base = url
        raw_files = doc["files"]
        if not isinstance(raw_files, list) or not raw_files:
            raise reject("'files' must be a non-empty list")
    else:  # one file: {id, url, sha256, size}
        base, _, file_name = url.rstrip("/").rpartition("/")
        raw_files = [{"name": file_name, "sha256": doc.get("sha256"), "size": doc.get("size")}]
    files = []
    for j, f in enumerate(raw_files):
        if not isinstance(f, dict):
            raise reject(f"files[{j}] must be a mapping")
        name, sha, size = f.get("name"), f.get("sha256"), f.get("size")
        if not isinstance(name, str) or not name or "/" in name or name.startswith(".") or "\\" in name:
            raise reject(f"files[{j}]: 'name' must be a plain file name")
        if not isinstance(sha, str) or not SHA256_PATTERN.fullmatch(sha):
            raise reject(f"files[{j}]: 'sha256' must be 64 lowercase hex digits")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise reject(f"files[{j}]: 'size' must be a byte count")
        files.append(ModelFileSpec(name, sha, size))
    if len({f.name for f in files}) != len(files):
        raise reject("a file name appears twice")
    sample_rate = doc.get("sample_rate")
    if sample_rate is not None and (isinstance(sample_rate, bool) or not isinstance(sample_rate, int)):
        raise reject("'sample_rate' must be an integer")
    extra = {k: doc.get(k, "") for k in ("task", "runtime", "licence")}
    if not all(isinstance(v, str) for v in extra.values()):
        raise reject("'task', 'runtime' and 'licence' must be strings")
    return ModelSpec(model_id, base, tuple(files), str(extra["task"]), str(extra["runtime"]),
                     sample_rate, str(extra["licence"]))


# -- signing ----------------------------------------------------------------------------------


def public_key_text(key: Ed25519PublicKey) -> str:
    """The form `fleet.trusted_keys` takes: base64 of the 32 raw bytes."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def parse_public_key(text: str) -> Ed25519PublicKey:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise ConfigError(f"{text[:16]!r}...: not a base64 Ed25519 public key") from None


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read key: {exc.strerror}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{path}: not an Ed25519 key")
    return key


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def sign(body: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """`body` plus its signature."""
    body = {k: v for k, v in body.items() if k != "signature"}
    signature = base64.b64encode(key.sign(canonical_json(body))).decode()
    return {**body, "signature": signature}


def verify(envelope: Envelope, trusted: Sequence[Ed25519PublicKey]) -> int:
    """Index of the trusted key that signed `envelope`; `FleetRejected` if none did."""
    if not trusted:
        raise FleetRejected("no trusted keys configured (fleet.trusted_keys)", envelope.version)
    try:
        signature = base64.b64decode(envelope.signature, validate=True)
    except (binascii.Error, ValueError):
        raise FleetRejected("'signature' is not base64", envelope.version) from None
    message = envelope.signed_bytes()
    for index, key in enumerate(trusted):
        try:
            key.verify(signature, message)
            return index
        except InvalidSignature:
            continue
    raise FleetRejected("bad signature: no trusted key verifies it", envelope.version)


def trusted_keys(texts: Iterable[str]) -> list[Ed25519PublicKey]:
    return [parse_public_key(t) for t in texts]
