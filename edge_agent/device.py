"""The device itself: who it is (`device`) and how `edge-agent run` keeps it (`daemon`)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.homes import state_home


@dataclass(frozen=True)
class DeviceSettings:
    """Who this device is."""

    id: str = ""
    """Device id used in MQTT topics; empty means the host name."""
    group: str = "default"
    """Fleet group this device belongs to."""

    @property
    def resolved_id(self) -> str:
        return self.id or socket.gethostname().split(".")[0]

    def __post_init__(self) -> None:
        for name in ("id", "group"):
            value = getattr(self, name)
            if any(c in value for c in "/+#\x00 "):
                raise ValueError(f"{name}: {value!r} may not contain '/', '+', '#', NUL or spaces")


@dataclass(frozen=True)
class DaemonSettings:
    """`edge-agent run`."""

    out_dir: Path | None = None
    """Write each announcement to `<out_dir>/<id>.wav` instead of the sound card."""
    metrics_s: float = 60.0
    """How often a metrics snapshot is published; 0 turns it off."""
    listen: bool = True
    """Listen and publish transcripts when an ASR model is present."""
    state_dir: Path = field(default_factory=lambda: state_home() / "daemon")
    """What the user switched at run time (microphone mute, volume from Home Assistant), kept
    across restarts."""

    def __post_init__(self) -> None:
        if self.metrics_s < 0:
            raise ValueError(f"metrics_s: {self.metrics_s} is negative")
