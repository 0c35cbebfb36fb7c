"""The topic layout of DESIGN.md, for one device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edge_agent.errors import ConfigError

Kind = Literal["announce", "config"]

RESERVED_IDS = ("all", "group")
"""Device ids that would collide with the broadcast and group topic levels."""


@dataclass(frozen=True)
class Topics:
    """Every topic a device uses, from the prefix, its id and its group."""

    prefix: str
    device: str
    group: str

    def __post_init__(self) -> None:
        if self.device in RESERVED_IDS:
            raise ConfigError(f"device.id: {self.device!r} is reserved (it is a topic level of its own)")
        for name, value in (("device.id", self.device), ("device.group", self.group)):
            if not value or any(c in value for c in "/+#\x00"):
                raise ConfigError(f"{name}: {value!r} is not usable as an MQTT topic level")

    # -- inbound -----------------------------------------------------------------

    @property
    def announce(self) -> str:
        return f"{self.prefix}/{self.device}/announce"

    @property
    def group_announce(self) -> str:
        return f"{self.prefix}/group/{self.group}/announce"

    @property
    def all_announce(self) -> str:
        return f"{self.prefix}/all/announce"

    @property
    def config(self) -> str:
        return f"{self.prefix}/{self.device}/config"

    @property
    def group_config(self) -> str:
        return f"{self.prefix}/group/{self.group}/config"

    @property
    def all_config(self) -> str:
        """Configs targeted at `all` (an addition to DESIGN.md's table)."""
        return f"{self.prefix}/all/config"

    def subscriptions(self) -> tuple[str, ...]:
        return (self.announce, self.group_announce, self.all_announce,
                self.config, self.group_config, self.all_config)

    def kind(self, topic: str) -> Kind | None:
        """What an inbound topic carries, or None if it is not one of ours."""
        if topic in (self.announce, self.group_announce, self.all_announce):
            return "announce"
        if topic in (self.config, self.group_config, self.all_config):
            return "config"
        return None

    # -- outbound ----------------------------------------------------------------

    @property
    def announce_status(self) -> str:
        return f"{self.prefix}/{self.device}/announce/status"

    @property
    def status(self) -> str:
        return f"{self.prefix}/{self.device}/status"

    @property
    def transcript(self) -> str:
        return f"{self.prefix}/{self.device}/transcript"

    @property
    def wake(self) -> str:
        return f"{self.prefix}/{self.device}/wake"

    @property
    def config_status(self) -> str:
        return f"{self.prefix}/{self.device}/config/status"

    @property
    def metrics(self) -> str:
        return f"{self.prefix}/{self.device}/metrics"


def config_topic(prefix: str, target: str) -> str:
    """Where a config for `target` (`device:<id>`, `group:<g>`, `all`) is published."""
    if target == "all":
        return f"{prefix}/all/config"
    kind, _, name = target.partition(":")
    if kind == "device" and name:
        return f"{prefix}/{name}/config"
    if kind == "group" and name:
        return f"{prefix}/group/{name}/config"
    raise ConfigError(f"target {target!r}: expected device:<id>, group:<name> or all")
