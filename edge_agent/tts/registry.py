"""Voices by id: loaded on first use, unloaded when idle."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from edge_agent.errors import ModelError
from edge_agent.models.catalog import base_voice
from edge_agent.models.store import ModelStore
from edge_agent.runtime.providers import CPU, Accelerator
from edge_agent.tts.piper import PiperVoice
from edge_agent.tts.settings import TtsSettings
from edge_agent.tts.voice import Voice

log = logging.getLogger(__name__)

Loader = Callable[[str], Voice]

PREPARED_SUBDIR = "prepared"
"""Split Piper graphs live in `<models.cache_dir>/prepared/<voice id>-<sha256 prefix>/`."""


@dataclass
class _Loaded:
    voice: Voice
    last_used: float


class VoiceRegistry:
    """Loads voices from the model store on demand; `unload_idle` frees unused ones."""

    def __init__(self, store: ModelStore, settings: TtsSettings,
                 clock: Callable[[], float] = time.monotonic, *, accel: Accelerator = CPU) -> None:
        self._store = store
        self.accel = accel
        """Providers the voices run on (a `register_runtime` loader should use them too)."""
        self._settings = settings
        self._clock = clock
        self._loaded: dict[str, _Loaded] = {}
        self._lock = threading.Lock()
        self._loaders: dict[str, Callable[[str], Voice]] = {"piper": self._load_piper}

    def register_runtime(self, runtime: str, loader: Loader) -> None:
        """Teach the registry to load catalog entries whose `runtime` is `runtime`."""
        self._loaders[runtime] = loader

    def ids(self) -> list[str]:
        """Voice ids this registry can load."""
        return [e.id for e in self._store.catalog if e.task == "tts" and e.runtime in self._loaders]

    def get(self, voice_id: str) -> Voice:
        """The voice, loading it if needed (a `ModelError` if unknown or missing)."""
        with self._lock:
            loaded = self._loaded.get(voice_id)
            if loaded is None:
                loaded = _Loaded(self._load(voice_id), self._clock())
                self._loaded[voice_id] = loaded
            loaded.last_used = self._clock()
            return loaded.voice

    def loaded(self) -> list[str]:
        with self._lock:
            return sorted(self._loaded)

    def unload_idle(self) -> list[str]:
        """Unload voices unused for `idle_unload_s`; returns the ids unloaded."""
        limit = self._settings.idle_unload_s
        if limit <= 0:
            return []
        now = self._clock()
        with self._lock:
            idle = [k for k, v in self._loaded.items() if now - v.last_used >= limit]
            for voice_id in idle:
                self._loaded.pop(voice_id).voice.close()
                log.info("voice %s unloaded after %.0f s idle", voice_id, limit)
        return idle

    def close(self) -> None:
        with self._lock:
            for item in self._loaded.values():
                item.voice.close()
            self._loaded.clear()

    def _load(self, voice_id: str) -> Voice:
        entry = self._store.catalog.get(base_voice(voice_id))
        if entry.task != "tts":
            raise ModelError(f"{voice_id!r} is a {entry.task} model, not a voice")
        loader = self._loaders.get(entry.runtime)
        if loader is None:
            # Heavy runtimes (Kokoro) are loaded by `edge-agent serve` only, never on the device.
            raise ModelError(f"voice {voice_id!r} needs the {entry.runtime!r} runtime, which runs on a "
                             "synthesis server, not here: start `edge-agent serve` and use "
                             "`say --remote tcp://HOST:PORT` or offload.servers (docs/offload.md)")
        started = self._clock()
        voice = loader(voice_id)
        log.info("voice %s loaded in %.2f s", voice_id, self._clock() - started)
        return voice

    def _load_piper(self, voice_id: str) -> Voice:
        files = self._store.require(voice_id)
        model = files.entry.files[0]
        prepared = None
        if self._settings.stream_vocoder:  # the split is keyed by the verified source's hash
            prepared = self._store.cache_dir / PREPARED_SUBDIR / f"{voice_id}-{model.sha256[:16]}"
        return PiperVoice.load(
            voice_id, files.path(model.name), files.path(f"{model.name}.json"),
            threads=self._settings.threads, length_scale=self._settings.length_scale,
            noise_scale=self._settings.noise_scale, noise_w=self._settings.noise_w,
            prepared_dir=prepared, accel=self.accel,
        )
