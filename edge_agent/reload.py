"""Hot reload: a fleet config becomes the running settings without a restart, or is rolled back.

`FleetManager` calls `Reloader.validate` on a config before it takes it, then `activate`. That
builds the whole new bundle first (the announcements' output, a new voice that has spoken the
health check) and swaps it in at once (`Announcer.swap`), so nothing fails half-way: a raise
before the swap leaves everything as it was, and the fleet rolls the config back. A replaced
voice is closed once the announcement that may still use it is over. The user's run-time
choices (`controls.Controls`) stay over the config's, until a config sets a new volume.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edge_agent.announce.pipeline import Announcer
from edge_agent.announce.playout import SinkOpener
from edge_agent.config import Settings, load_settings
from edge_agent.controls import Controls
from edge_agent.errors import EdgeError
from edge_agent.fleet.manager import ActiveConfig, FleetManager
from edge_agent.outputs import HEALTH_TEXT, close_synth, tts_voices
from edge_agent.tts.voice import Synthesizer

log = logging.getLogger(__name__)

RETIRE_WAIT_S = 300.0
"""How long a replaced synthesizer waits for the announcement still using it before it is closed."""


@dataclass(frozen=True)
class SettingsSource:
    """How to rebuild settings: the local file and command-line overrides, plus a fleet layer."""

    path: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def build(self, layer: dict[str, Any] | None = None) -> Settings:
        return load_settings(self.path, self.overrides, layers=[layer] if layer else [])

    def validate(self, layer: dict[str, Any]) -> None:
        """Raise `ConfigError` if `layer` does not make valid settings."""
        self.build(layer)


def with_volume(settings: Settings, volume: float) -> Settings:
    return replace(settings, audio=replace(settings.audio, volume=volume))


def with_wake_words(settings: Settings, wake_words: tuple[str, ...]) -> Settings:
    return replace(settings, wake=replace(settings.wake, models=wake_words))


def with_choices(settings: Settings, controls: Controls, *, volume: bool = True) -> Settings:
    """`settings` with what the user chose at run time (the wake words, and unless `volume` is
    False the volume) over the config's."""
    state = controls.state
    if state.wake_words is not None:
        settings = with_wake_words(settings, state.wake_words)
    return settings if state.volume is None or not volume else with_volume(settings, state.volume)


class FleetWorker:
    """Carries fleet configs from the MQTT thread to `FleetManager.process_inbox`, which verifies,
    validates and activates them one at a time, in a worker thread of the daemon's loop."""

    def __init__(self, fleet: FleetManager) -> None:
        self.fleet = fleet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    def received(self, payload: bytes) -> bool:
        """A config came (the MQTT thread): into the inbox, then the worker wakes. True once stored."""
        ok = self.fleet.enqueue(payload)
        if ok and self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        return ok

    async def run(self) -> None:
        """Process the inbox now and whenever a config comes (runs until cancelled)."""
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        while True:
            await asyncio.to_thread(self.fleet.process_inbox)
            await self._wake.wait()
            self._wake.clear()


Applied = Callable[[Settings, set[str], bool], None]
"""The daemon takes a reloaded config: (new settings, the sections that changed, whether the
config's volume replaced the user's)."""


class Reloader:
    """Swaps in what a fleet config changes (`FleetManager`'s validate and activate)."""

    def __init__(self, source: SettingsSource, announcements: Announcer, controls: Controls, *,
                 current: Callable[[], Settings], applied: Applied,
                 make_synth: Callable[[Settings], Synthesizer],
                 make_opener: Callable[[Settings], SinkOpener]) -> None:
        self.source = source
        self.announcements = announcements
        self.controls = controls
        self.current = current
        self.applied = applied
        self.make_synth = make_synth
        self.make_opener = make_opener

    def activate(self, active: ActiveConfig) -> None:
        """Reload the parts a config changes and check them; raise to make the fleet roll back."""
        new = self.source.build(active.layer)
        config_volume = new.audio.volume
        # A config with a new volume replaces the user's (the latest word wins); the wake words
        # the user chose stay whatever the config says.
        new = with_choices(new, self.controls, volume=config_volume == self.controls.config_volume)
        old = self.current()
        changed = {f.name for f in dataclasses.fields(Settings)
                   if getattr(old, f.name) != getattr(new, f.name)}
        # Build and check the whole new bundle first; nothing below the swap can fail half-way.
        current = self.announcements.speaking
        speaking = replace(current, settings=new.announcements)
        if changed & {"audio", "daemon"}:
            speaking = replace(speaking, opener=self.make_opener(new))
        if changed & {"tts", "models", "offload"}:
            speaking = replace(speaking, synth=self.checked_synth(new), voices=tts_voices(new))
        self.announcements.swap(speaking)
        if speaking.synth is not current.synth:
            self.retire(current.synth)
        if "logging" in changed:
            logging.getLogger().setLevel(new.logging.level.upper())
        if "mqtt" in changed:
            log.warning("changed mqtt settings take effect at the next start")
        self.applied(new, changed, self.controls.reconfigured(config_volume))
        log.info("config version %d active (reloaded: %s)", active.version,
                 ", ".join(sorted(changed)) or "nothing", extra={"config_version": active.version})

    def checked_synth(self, settings: Settings) -> Synthesizer:
        """A new synthesizer that has spoken the health check; closed again if it fails it."""
        synth = self.make_synth(settings)
        try:
            samples = sum(len(chunk.samples) for chunk in synth.stream(HEALTH_TEXT))
            if samples == 0:
                raise EdgeError("the reloaded voice produced no audio")
        except BaseException:
            close_synth(synth)
            raise
        return synth

    def retire(self, synth: Synthesizer) -> None:
        """Close a replaced synthesizer once the announcement that may still use it is over."""
        def wait_then_close() -> None:
            if not self.announcements.wait_idle(RETIRE_WAIT_S):
                log.warning("closing the replaced voice while an announcement still speaks (%.0f s on)",
                            RETIRE_WAIT_S)
            close_synth(synth)

        threading.Thread(target=wait_then_close, name="retire-synth", daemon=True).start()
