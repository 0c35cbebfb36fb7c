"""Which voice the daemon speaks with and where its sound goes: announcements, chimes, music.

The sink factories the daemon is built with (`Daemon(opener_factory=...)`; tests and benchmarks
hand it others): the sound card (telling the echo canceller's reference what it plays) or WAV
files under `daemon.out_dir`; and the voice's life in the daemon (warm-up, idle unloading,
closing). The voices themselves are loaded by `parts.py`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import replace

from edge_agent.announce.pipeline import Announcer
from edge_agent.announce.playout import DeviceOpener, DirOpener, SinkOpener, play_chime
from edge_agent.audio.reference import PlaybackReference, ReferenceSink
from edge_agent.audio.sinks import AudioOutput, Sink, WavSink
from edge_agent.config import Settings
from edge_agent.models import load_catalog
from edge_agent.tts.voice import Synthesizer

log = logging.getLogger(__name__)

HEALTH_TEXT = "Ready."
"""Spoken (into no sink) to load a voice and to check a reloaded one."""


def chime(opener: SinkOpener, name: str) -> None:
    """Play the chime `name`; a failure is logged (a turn goes on without its chime)."""
    try:
        play_chime(opener, name)
    except Exception as exc:
        log.warning("chime not played: %s", exc)


def tts_voices(settings: Settings) -> frozenset[str]:
    """The catalog's voices (`Speaking.voices`: what an announcement may ask for)."""
    return frozenset(load_catalog(settings.models.catalog).ids(task="tts"))


def warm_up(synth: Synthesizer) -> None:
    """Load the voice now rather than on the first announcement."""
    try:
        for _ in synth.stream(HEALTH_TEXT):
            pass
    except Exception as exc:
        log.error("voice not usable: %s; announcements will fail until it is", exc)


async def unload_idle_voices(announcements: Announcer, idle_unload_s: float) -> None:
    """Give memory back when no announcement has needed a voice for `idle_unload_s` (runs until
    cancelled; the synthesizer is the announcer's current one)."""
    period = max(1.0, idle_unload_s / 4)
    while True:
        await asyncio.sleep(period)
        if not announcements.busy.is_set():
            await asyncio.to_thread(announcements.speaking.synth.unload_idle)


def close_synth(synth: Synthesizer) -> None:
    """Close `synth`; a failure is logged, never raised into a reload or shutdown."""
    try:
        synth.close()
    except Exception:
        log.exception("closing a synthesizer failed")


def music_sink(settings: Settings, rate: int, name: str) -> Sink:
    """Where the music plays: `<out_dir>/<name>.wav`, else the announcements' output at full scale
    (the player applies the volume itself)."""
    if settings.daemon.out_dir is not None:
        settings.daemon.out_dir.mkdir(parents=True, exist_ok=True)
        return WavSink(settings.daemon.out_dir / f"{name}.wav", rate)
    return AudioOutput(replace(settings.audio, volume=1.0)).open(rate, name)


def default_opener(settings: Settings, reference: PlaybackReference | None = None) -> SinkOpener:
    """`daemon.out_dir` when set, else the configured audio output (telling `reference` what the
    loudspeaker plays)."""
    if settings.daemon.out_dir is not None:
        return DirOpener(settings.daemon.out_dir, settings.audio.volume)
    heard = None if reference is None else functools.partial(ReferenceSink, reference=reference)
    return DeviceOpener(AudioOutput(settings.audio, heard))

