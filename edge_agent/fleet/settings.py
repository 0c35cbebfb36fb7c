"""Fleet config settings (`fleet.*`): trusted keys, protected keys, state."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.homes import state_home

FLEET_ALWAYS_PROTECTED = ("device.id", "fleet")
"""Keys no fleet config may set, whatever `fleet.protected_keys` says."""


@dataclass(frozen=True)
class FleetSettings:
    """Signed configuration pushed by the fleet operator."""

    trusted_keys: tuple[str, ...] = ()
    """Ed25519 public keys (base64 of the 32 raw bytes, as `edge-agent fleet keygen` prints)
    whose signatures are accepted; empty refuses every fleet config."""
    protected_keys: tuple[str, ...] = (
        "device.id", "fleet", "mqtt", "models", "announcements.state_dir", "daemon",
    )
    """Dotted keys (a section protects everything below it) a fleet config may not set.
    `device.id` and `fleet` are always protected."""
    state_dir: Path = field(default_factory=lambda: state_home() / "fleet")
    """Active and previous config, the highest version applied, the inbox."""
    max_payload_bytes: int = 262144
    """Larger config payloads are rejected unparsed."""
    max_model_bytes: int = 2147483648
    """Largest model file a fleet config may ask to download."""
    download_timeout_s: float = 30.0
    """Socket timeout of model downloads (per read, not for the whole file)."""
    download_attempts: int = 5
    """Tries per file; each resumes where the last stopped (HTTP Range)."""
    probe_timeout_s: float = 120.0
    """Time allowed to test-load a downloaded model in a separate process."""

    def __post_init__(self) -> None:
        for key in self.trusted_keys:
            try:
                raw = base64.b64decode(key, validate=True)
            except ValueError:
                raw = b""
            if len(raw) != 32:
                raise ValueError(f"trusted_keys: {key[:16]!r}... is not a base64 Ed25519 public key")
        if self.max_payload_bytes < 1024 or self.max_model_bytes < 1:
            raise ValueError("max_payload_bytes (>= 1024) and max_model_bytes must be positive")
        if self.download_attempts < 1 or self.download_timeout_s <= 0 or self.probe_timeout_s <= 0:
            raise ValueError("download_attempts, download_timeout_s and probe_timeout_s must be positive")

    @property
    def protected(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*FLEET_ALWAYS_PROTECTED, *self.protected_keys)))
