"""The loaded parts the adapters are handed, made from settings in one place.

The adapters (Wyoming, ESPHome, Hermes, MQTT discovery) and the hearing loop take their own
settings section and the parts they serve: the voice, Whisper, the checked wake models. They load
nothing themselves; the daemon and the commands load each part once, here, and hand it to every
adapter that needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from edge_agent.asr.manifest import EXPORT_HINT
from edge_agent.asr.transcriber import Transcriber
from edge_agent.asr.whisper import WhisperOnnx, resolve_export_dir
from edge_agent.audio.reference import PlaybackReference
from edge_agent.audio.sources import AudioSource
from edge_agent.config import Settings
from edge_agent.errors import EdgeError, UsageError
from edge_agent.listen.endofturn import load_end_of_turn
from edge_agent.listen.hearing import WakeFilter
from edge_agent.listen.loop import HearingLoop, HearingModels, hearing_loop
from edge_agent.listen.microphone import open_microphone
from edge_agent.models.catalog import load_catalog
from edge_agent.models.store import ModelStore
from edge_agent.runtime.providers import for_use
from edge_agent.tts.local import LocalSynthesizer
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.voice import Synthesizer
from edge_agent.vad import make_segmenter
from edge_agent.wake.engine import WakeEngine
from edge_agent.wake.models import WakeModelSpec, check_all

if TYPE_CHECKING:
    from edge_agent.wyoming.satellite import SatelliteService
    from edge_agent.wyoming.service import WyomingService

log = logging.getLogger(__name__)


def model_store(settings: Settings) -> ModelStore:
    """The model cache and catalog `models.*` name."""
    return ModelStore(settings.models.cache_dir, load_catalog(settings.models.catalog))


def local_synthesizer(settings: Settings) -> LocalSynthesizer:
    """The on-device voice (the offload router implements the same protocol)."""
    accel = for_use(settings.runtime, "tts", settings.models.cache_dir)
    return LocalSynthesizer(VoiceRegistry(model_store(settings), settings.tts, accel=accel), settings.tts)


def routed_synthesizer(settings: Settings) -> Synthesizer:
    """The offload router: the server's voice when `offload` says so and it is healthy, the local
    voice otherwise (sentence by sentence, each spoken once)."""
    # The offload client (asyncio streams, TLS, the protocol) only for a verb that may speak
    # remotely: `listen` and `transcribe` take this module too and never pay for it.
    from edge_agent.offload.client import make_synthesizer

    return make_synthesizer(settings.offload, local_synthesizer(settings))


def asr_present(settings: Settings) -> bool:
    """Whether an exported Whisper is where `asr.*` points."""
    return (resolve_export_dir(settings.asr, settings.models) / "manifest.json").is_file()


def load_transcriber(settings: Settings) -> Transcriber | None:
    """Whisper as configured, or None (said once in the log) when no export is present."""
    if not asr_present(settings):
        log.warning("no speech to text: no ASR export in %s; %s",
                    resolve_export_dir(settings.asr, settings.models), EXPORT_HINT)
        return None
    return whisper(settings)


def whisper(settings: Settings) -> Transcriber:
    """Whisper as configured (`asr.*`), on the providers `runtime.asr` gives it; a missing or broken
    export is a `ModelError`."""
    model = WhisperOnnx.from_settings(settings.asr, settings.models,
                                      for_use(settings.runtime, "asr", settings.models.cache_dir))
    return Transcriber(model, settings.asr)


def load_wake_models(settings: Settings) -> list[WakeModelSpec] | None:
    """The wake models of `wake.models`, each checked once, or None (said once in the log) when one
    is unusable."""
    try:
        return check_all(settings.wake)
    except EdgeError as exc:
        log.warning("wyoming: no wake word detection: %s", exc)
        return None


def wyoming_service(settings: Settings, synth: Callable[[], Synthesizer], transcriber: Transcriber | None,
                    wake: list[WakeModelSpec] | None,
                    satellite: SatelliteService | None = None) -> WyomingService:
    """The Wyoming endpoints, handed the voice (read at each request: a reload replaces it), Whisper
    and the checked wake models."""
    from edge_agent.wyoming.service import WyomingService
    from edge_agent.wyoming.tts import TtsService
    from edge_agent.wyoming.wake import WakeService

    wyoming = settings.wyoming
    tts = TtsService(synth, wyoming, settings.tts.voice, settings.offload.voice)
    wake_service = WakeService(wake, wyoming, settings.wake.refractory_s) if wake is not None else None
    return WyomingService(wyoming, settings.device.resolved_id, tts, transcriber=transcriber,
                          wake=wake_service, satellite=satellite)


def load_hearing(settings: Settings, store: ModelStore) -> HearingModels:
    """The hearing loop's models as configured: the wake models (mode `wake`), then the VAD, Whisper
    and the end-of-turn model, so a bad wake model or a missing export fails first."""
    waking = settings.listen.mode == "wake"
    wake = WakeEngine.load(settings.wake) if waking else None
    segmenter = make_segmenter(settings.vad, store)
    transcriber = whisper(settings)
    end_of_turn = load_end_of_turn(settings.listen, store) if waking else None
    return HearingModels(segmenter, transcriber, wake, end_of_turn)


def build_hearing(settings: Settings, store: ModelStore, source: AudioSource | None = None,
                  accept_wake: WakeFilter | None = None, reference: PlaybackReference | None = None, *,
                  front_end: bool = True) -> HearingLoop:
    """The hearing loop as configured (`listen.mode` wake or always) over `source` (default: the
    configured input), behind the microphone front end (`audio.*`; none with `front_end` False;
    with `reference`, what the device plays, echo cancellation and the own-voice guard).

    Models load first, then the input opens: a bad wake model or a missing export fails before
    the microphone is opened.
    """
    mode = settings.listen.mode
    if mode == "off":
        raise UsageError("listen.mode is off: nothing listens")
    models = load_hearing(settings, store)
    microphone = open_microphone(settings.audio, source=source, reference=reference,
                                 wake=settings.wake if models.wake is not None else None,
                                 accept_wake=accept_wake, front_end=front_end)
    return hearing_loop(mode, settings.listen, models, microphone)
