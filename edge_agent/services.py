"""The servers beside MQTT, each started on the daemon's loop from the parts it is handed: the
Wyoming endpoints (and satellite), the ESPHome native API and the Sendspin player.

Each returns its running service, or None when it could not start (said once in the log): the
daemon runs on without it. Streamed turns, transcripts and the user's controls reach them
through `Parts`; the music they play is ducked and paused by `Parts.music`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent.announce.pipeline import Announcer
from edge_agent.asr.transcriber import Transcriber
from edge_agent.config import Settings
from edge_agent.controls import Controls
from edge_agent.errors import EdgeError
from edge_agent.listen.turn import Conversation
from edge_agent.outputs import music_sink
from edge_agent.parts import load_transcriber, load_wake_models, wyoming_service
from edge_agent.sendspin.cues import MusicCues
from edge_agent.tts.voice import Synthesizer
from edge_agent.wyoming.satellite import SatelliteService
from edge_agent.wyoming.service import WyomingService

if TYPE_CHECKING:
    from edge_agent.esphome.service import EsphomeService
    from edge_agent.sendspin.player import SendspinPlayer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Parts:
    """What every server is handed."""

    settings: Settings
    device: str
    announcements: Announcer
    turns: Conversation
    """Told what Home Assistant heard in a streamed turn, and a run that ended without an answer."""
    controls: Controls
    music: MusicCues
    end_turn: Callable[[str], None]
    """Home Assistant has the command (or is gone): the hearing loop ends the streamed turn."""
    on_status: Callable[[], None]
    """Something on the device status changed (the satellite's peer, the music)."""


async def start_wyoming(parts: Parts, synth: Callable[[], Synthesizer],
                        transcriber: Transcriber | None) -> WyomingService | None:
    """The Wyoming endpoints, with the announcements' voice (`synth`, read per request) and the
    listener's Whisper (`transcriber`; loaded here when the device does not listen)."""
    settings = parts.settings
    if transcriber is None:
        try:
            transcriber = await asyncio.to_thread(load_transcriber, settings)
        except EdgeError as exc:
            log.warning("wyoming: no speech to text: %s", exc)
    wake = await asyncio.to_thread(load_wake_models, settings)
    satellite = None
    if settings.wyoming.satellite:
        waking = settings.listen.mode == "wake" and settings.daemon.listen
        satellite = SatelliteService(settings.wyoming, parts.device, parts.announcements, parts.end_turn,
                                     list(settings.wake.models) if waking else [],
                                     max_audio_s=settings.announcements.max_audio_s,
                                     on_transcript=parts.turns.remote_heard, no_answer=parts.turns.unanswered,
                                     on_change=parts.on_status)
    service = wyoming_service(settings, synth, transcriber, wake, satellite)
    try:
        await service.start()
    except OSError as exc:
        log.error("wyoming server not started: %s", exc)
        if satellite is not None:
            satellite.close()
        return None
    return service


async def start_esphome(parts: Parts, wake_offered: list[str],
                        open_turn: Callable[[str], bool]) -> EsphomeService | None:
    """The ESPHome native API (Home Assistant's voice assistant and media player); `open_turn`
    starts a turn without a wake word when Home Assistant continues a conversation."""
    settings = parts.settings.esphome
    try:
        from edge_agent.esphome.assistant import Assistant, MediaLimits
        from edge_agent.esphome.entities import Entities
        from edge_agent.esphome.player import TrackPlayer
        from edge_agent.esphome.service import EsphomeService
    except ImportError as exc:  # aioesphomeapi needs Python 3.11
        log.error("esphome: the ESPHome API is not available here (%s); it needs Python 3.11 or "
                  "later with aioesphomeapi installed", exc)
        return None
    controls = parts.controls
    entities = Entities(settings.name or parts.device, controls, wake_words=parts.settings.wake.models,
                        available_wake_words=wake_offered, set_wake_words=controls.set_wake_words)
    # Media plays on its own output, ducked and paused with the Sendspin music (`music`).
    player = TrackPlayer(functools.partial(music_sink, parts.settings), volume=controls.volume,
                         muted=controls.media_muted, duck_level=parts.settings.sendspin.duck_level)
    assistant = Assistant(parts.announcements, entities,
                          MediaLimits(settings.media_max_bytes, settings.media_timeout_s),
                          end_turn=parts.end_turn, open_turn=open_turn,
                          on_transcript=parts.turns.remote_heard, no_answer=parts.turns.unanswered,
                          player=player)
    service = EsphomeService(settings, parts.device, assistant, entities)
    try:
        await service.start()
    except OSError as exc:
        log.error("esphome: API not started: %s", exc)
        assistant.close()
        return None
    parts.music.players.append(player)
    return service


async def start_sendspin(parts: Parts, state_dir: Path) -> SendspinPlayer | None:
    """The Sendspin player (Music Assistant's multiroom music); the caller has checked that
    Sendspin runs here (`sendspin_missing`)."""
    from edge_agent.sendspin.player import SendspinPlayer

    sink = functools.partial(music_sink, parts.settings)
    player = SendspinPlayer(parts.settings.sendspin, parts.device, sink, state_dir, controls=parts.controls,
                            on_status=parts.on_status)
    try:
        await player.start()
    except OSError as exc:
        log.error("sendspin: player not started: %s", exc)
        return None
    parts.music.players.append(player)
    return player
