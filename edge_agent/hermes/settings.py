"""Hermes settings (`hermes.*`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HermesSettings:
    """Hermes (Rhasspy's MQTT protocol) on the daemon's broker."""

    enabled: bool = False
    """Speak Hermes on the daemon's MQTT broker (`edge-agent run`)."""
    site_id: str = ""
    """Hermes site id this device answers to; empty means the device id."""

    def __post_init__(self) -> None:
        if any(c in self.site_id for c in "/+#\x00"):
            raise ValueError(f"site_id: {self.site_id!r} may not contain '/', '+', '#' or NUL")
