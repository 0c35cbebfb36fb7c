"""Typed settings: the sections of every package, assembled into one tree, loaded and validated.

Each section lives beside its package (`audio/settings.py`, `vad/settings.py`,
`offload/settings.py`, `runtime/settings.py`, ...) and imports nothing above it; this module only
assembles them: `Settings`, loading and merging the layers, and the checks that span sections.
No package below the daemon and the commands imports it (tests/test_architecture.py): each is
handed its own section.

Layers, later wins: the defaults written in the sections' dataclasses, then a YAML
file, then command-line overrides (`--set tts.threads=1` or a verb's own flag).
Every error names the key path (`tts.voice: unknown voice 'x'`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.announce.settings import AnnouncementSettings
from edge_agent.asr.settings import AsrSettings
from edge_agent.audio.settings import AudioSettings
from edge_agent.device import DaemonSettings, DeviceSettings
from edge_agent.endpoints import Endpoint, parse_uri
from edge_agent.errors import ConfigError
from edge_agent.esphome.settings import EsphomeSettings
from edge_agent.fleet.settings import FLEET_ALWAYS_PROTECTED, FleetSettings
from edge_agent.hermes.settings import HermesSettings
from edge_agent.listen.settings import ListenSettings
from edge_agent.logs import LoggingSettings
from edge_agent.models.catalog import load_catalog
from edge_agent.models.settings import ModelSettings
from edge_agent.mqtt.settings import MqttSettings
from edge_agent.offload.settings import OffloadSettings, ServerSettings
from edge_agent.runtime.settings import CudaSettings, RuntimeSettings, TensorrtSettings
from edge_agent.safeyaml import YamlLimits, load_yaml, load_yaml_file
from edge_agent.sendspin.settings import SendspinSettings
from edge_agent.tts.settings import TtsSettings
from edge_agent.typedtree import build, describe, merge, upgrade, upgrade_key
from edge_agent.vad.settings import VadSettings
from edge_agent.wake.settings import WAKE_BUILTIN, WakeSettings
from edge_agent.wyoming.settings import WyomingSettings

__all__ = [
    "CONFIG_ENV", "FLEET_ALWAYS_PROTECTED", "WAKE_BUILTIN", "AnnouncementSettings", "AsrSettings",
    "AudioSettings", "CudaSettings", "DaemonSettings", "DeviceSettings", "Endpoint", "EsphomeSettings",
    "FleetSettings", "HermesSettings", "ListenSettings", "LoggingSettings", "ModelSettings", "MqttSettings",
    "OffloadSettings", "RuntimeSettings", "SendspinSettings", "ServerSettings", "Settings",
    "TensorrtSettings", "TtsSettings", "VadSettings", "WakeSettings", "WyomingSettings", "load_settings",
    "parse_override", "parse_uri", "validate",
]
"""The sections are named here too, so the code that assembles settings (the commands, the
daemon, the tests) imports them from one place."""

CONFIG_ENV = "EDGE_AGENT_CONFIG"
"""Environment variable naming the config file when `--config` is not given."""


@dataclass(frozen=True)
class Settings:
    """Everything the agent can be configured with."""

    device: DeviceSettings = field(default_factory=DeviceSettings)
    audio: AudioSettings = field(default_factory=AudioSettings)
    tts: TtsSettings = field(default_factory=TtsSettings)
    vad: VadSettings = field(default_factory=VadSettings)
    asr: AsrSettings = field(default_factory=AsrSettings)
    wake: WakeSettings = field(default_factory=WakeSettings)
    listen: ListenSettings = field(default_factory=ListenSettings)
    models: ModelSettings = field(default_factory=ModelSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    mqtt: MqttSettings = field(default_factory=MqttSettings)
    offload: OffloadSettings = field(default_factory=OffloadSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    announcements: AnnouncementSettings = field(default_factory=AnnouncementSettings)
    fleet: FleetSettings = field(default_factory=FleetSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    wyoming: WyomingSettings = field(default_factory=WyomingSettings)
    hermes: HermesSettings = field(default_factory=HermesSettings)
    esphome: EsphomeSettings = field(default_factory=EsphomeSettings)
    sendspin: SendspinSettings = field(default_factory=SendspinSettings)


def parse_override(text: str) -> tuple[str, Any]:
    """Parse `KEY.PATH=VALUE` (VALUE is YAML, so `3`, `true`, `[a, b]` keep their types)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. tts.threads=1")
    value = load_yaml(raw, source=f"override {key}", limits=YamlLimits(max_bytes=4096))
    return key.strip(), value


def _apply_override(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])}: is not a section")
        node = child
    node[parts[-1]] = value


def load_settings(
    path: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    layers: Sequence[Mapping[str, Any]] = (),
) -> Settings:
    """Defaults, then `path` (or $EDGE_AGENT_CONFIG), then `layers` (plain trees, deep-merged
    in order: a fleet config), then `overrides` (dotted keys)."""
    env = os.environ if env is None else env
    if path is None and env.get(CONFIG_ENV):
        path = Path(env[CONFIG_ENV])
    tree: dict[str, Any] = {}
    if path is not None:
        doc = load_yaml_file(path)
        if doc is not None and not isinstance(doc, dict):
            raise ConfigError(f"{path}: top level must be a mapping, got {describe(doc)}")
        tree = upgrade(Settings, doc or {})
    # Renamed keys take their new names layer by layer, so a later layer wins whichever name each used.
    for layer in layers:
        tree = merge(tree, copy.deepcopy(upgrade(Settings, layer)))  # overrides below mutate the tree
    for dotted, value in (overrides or {}).items():
        _apply_override(tree, upgrade_key(Settings, dotted), value)
    settings = build(Settings, tree)
    validate(settings)
    return settings


def validate(settings: Settings) -> None:
    """Checks that span sections or need the model catalog (voices are catalog ids)."""
    catalog = load_catalog(settings.models.catalog)
    catalog.check_voice("tts.voice", settings.tts.voice)
    if settings.offload.policy == "remote" and not settings.offload.targets:
        raise ConfigError("offload.policy: 'remote' needs offload.server or offload.servers (tcp://HOST:PORT)")
    for key, voice in [("offload.voice", settings.offload.voice)] + [
        (f"server.voices[{i}]", v) for i, v in enumerate(settings.server.voices)
    ]:
        if voice:
            catalog.check_voice(key, voice)
