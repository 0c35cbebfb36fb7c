"""`edge-agent run`: the device daemon, wiring MQTT, announcements, fleet config, listener and metrics.

The daemon builds the parts and connects them: the MQTT bridge and its dispatcher
(`mqtt/dispatch.py`) with the adapters riding on it, the announcer, the device's
status and metrics (`status.py`), the user's controls (`controls.py`), the fleet
manager and the hot reload it drives (`reload.py`), the hearing loop and the
conversation turn around it (`listen.turn.Conversation`, which tells its
`HearObserver`s: the MQTT publisher, Hermes, the remote turn takers), the Wyoming,
ESPHome and Sendspin services. Which thread or loop owns what, and how a reload swaps
what announcements are spoken with, is stated once, in docs/architecture.md
("Threads and loops").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent import __version__
from edge_agent.announce.journal import Journal
from edge_agent.announce.pipeline import Announcer, Speaking
from edge_agent.announce.playout import DeviceOpener, DirOpener, SinkOpener, play_chime, remove_partials
from edge_agent.asr.manifest import EXPORT_HINT
from edge_agent.asr.whisper import resolve_export_dir
from edge_agent.atomic import AppendFile
from edge_agent.audio.beamform import Beamformer
from edge_agent.audio.command import stop_all as stop_commands
from edge_agent.audio.frontend import FrontEndSource
from edge_agent.audio.reference import PlaybackReference, ReferenceSink
from edge_agent.audio.sinks import AudioOutput, Sink, WavSink
from edge_agent.audio.sources import CommandSource, PipeSource, release_pipes
from edge_agent.config import WAKE_BUILTIN, Settings
from edge_agent.controls import ControlChange, Controls
from edge_agent.errors import EdgeError
from edge_agent.fleet.manager import FleetManager
from edge_agent.hermes.adapter import HermesAdapter
from edge_agent.homeassistant.adapter import HomeAssistantAdapter
from edge_agent.homeassistant.discovery import HaTopics
from edge_agent.listen.hearing import HearingLoop, WakeFilter, build_hearing
from edge_agent.listen.remote import RemoteRouter, RemoteTurns
from edge_agent.listen.turn import Conversation, HearObserver
from edge_agent.metrics import Metrics
from edge_agent.models import ModelStore, load_catalog
from edge_agent.mqtt.bridge import Bridge
from edge_agent.mqtt.dispatch import Dispatcher
from edge_agent.mqtt.hearing import HearPublisher
from edge_agent.mqtt.outbox import Message
from edge_agent.mqtt.topics import Topics
from edge_agent.offload.client import make_synthesizer
from edge_agent.providers import for_use
from edge_agent.reload import (
    HEALTH_TEXT,
    Reloader,
    SettingsSource,
    close_synth,
    tts_voices,
    with_choices,
    with_volume,
    with_wake_words,
)
from edge_agent.sendspin.cues import MusicCues
from edge_agent.status import DeviceStatus
from edge_agent.tts.local import LocalSynthesizer
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.tts.voice import Synthesizer
from edge_agent.wyoming.satellite import SatelliteService
from edge_agent.wyoming.service import WyomingService, load_transcriber, load_wake

if TYPE_CHECKING:
    from edge_agent.esphome.service import EsphomeService
    from edge_agent.sendspin.player import SendspinPlayer

__all__ = ["Daemon", "SettingsSource", "default_opener", "hearing_loop", "local_synthesizer", "music_sink",
           "routed_synthesizer"]
"""`SettingsSource` lives in `reload`; the commands and tests take it from here, with the daemon."""

log = logging.getLogger(__name__)

SynthesizerFactory = Callable[[Settings], Synthesizer]
HearingFactory = Callable[[Settings, WakeFilter], HearingLoop | None]


def local_synthesizer(settings: Settings) -> Synthesizer:
    """The on-device voice (the offload router implements the same protocol)."""
    store = ModelStore(settings.models.cache_dir, load_catalog(settings.models.catalog))
    return LocalSynthesizer(VoiceRegistry(store, settings.tts, accel=for_use(settings, "tts")), settings.tts)


def routed_synthesizer(settings: Settings) -> Synthesizer:
    """The offload router: the server's voice when `offload` says so and it is healthy, the local
    voice otherwise (sentence by sentence, each spoken once)."""
    store = ModelStore(settings.models.cache_dir, load_catalog(settings.models.catalog))
    return make_synthesizer(settings, store)


def hearing_loop(settings: Settings, accept_wake: WakeFilter,
                 reference: PlaybackReference | None = None) -> HearingLoop | None:
    """Microphone -> wake word -> VAD -> Whisper, when an exported ASR model is present (None otherwise).

    A missing microphone is an `AudioError`, a broken export or wake model a `ModelError`:
    both leave the daemon announcing without listening, with the reason logged once and on
    its status (a wake-mode device never falls back to transcribing everything). The microphone
    hears through the front end, `reference` (what the loudspeaker plays) cancelled; a file shares
    no clock with the loudspeaker and is heard without it.
    """
    if not (resolve_export_dir(settings.asr, settings.models) / "manifest.json").is_file():
        return None
    store = ModelStore(settings.models.cache_dir, load_catalog(settings.models.catalog))
    # The configured input, opened once the models load; the front end hears only a live one.
    return build_hearing(settings, store, None, accept_wake, reference)


class Daemon:
    """The running agent."""

    music: MusicCues
    sendspin: SendspinPlayer | None = None
    """The Sendspin player once it runs (`sendspin.enabled`)."""

    def __init__(self, source: SettingsSource, *,
                 synthesizer_factory: SynthesizerFactory = routed_synthesizer,
                 listener_factory: HearingFactory | None = None,
                 opener_factory: Callable[[Settings], SinkOpener] | None = None,
                 journal_file: Callable[[Path], AppendFile] = AppendFile) -> None:
        # `journal_file` opens the announcement journal's file (a bench simulates slow storage).
        self.source = source
        self.base = source.build()
        self.settings = self.base
        self.device = self.base.device.resolved_id
        self.metrics = Metrics()
        self._make_synth = synthesizer_factory
        self.reference = PlaybackReference()
        """What the loudspeaker played: the echo canceller's reference and the own-voice guard's."""
        self._make_listener = listener_factory or functools.partial(hearing_loop, reference=self.reference)
        self._make_opener = opener_factory or functools.partial(default_opener, reference=self.reference)
        self._stop_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fleet_wake: asyncio.Event | None = None
        self.bridge: Bridge | None = None
        self.wyoming: WyomingService | None = None
        self.esphome: EsphomeService | None = None
        self.listener: HearingLoop | None = None
        self.listening: dict[str, Any] = {"mode": "off", "state": "off"}
        """What the microphone does, on the status topic: mode, state (listening, unavailable, off)."""
        self.status = DeviceStatus(self._publish, lambda: self.topics, self.metrics,
                                   config_version=lambda: self.fleet.active.version)
        self.status.parts.update(
            listen=lambda: self.listening,
            satellite=lambda: self.satellite.status() if self.satellite is not None else None,
            music=lambda: self.sendspin.status() if self.sendspin is not None else None)
        self.fleet = FleetManager(
            self.base.fleet, device=self.device, group=lambda: self.settings.device.group,
            cache_dir=self.base.models.cache_dir, validate=source.validate,
            # `reload` is built below, with the announcer; the fleet activates nothing before `run`.
            activate=lambda active: self.reload.activate(active),  # noqa: PLW0108
            base_catalog=load_catalog(self.base.models.catalog), user_catalog=self.base.models.catalog,
            report=self.status.config_status,
        )
        active = self.fleet.recover()
        try:
            self.settings = source.build(active.layer)
        except EdgeError as exc:
            log.error("fleet config version %d no longer loads (%s); running with the local config",
                      active.version, exc)
        self._load_controls()  # before anything listens: a muted microphone stays closed
        self.topics = Topics(self.settings.mqtt.prefix, self.device, self.settings.device.group)
        speaking = Speaking(self.settings.announcements, self._make_synth(self.settings),
                            self._make_opener(self.settings), tts_voices(self.settings))
        journal = Journal(self.settings.announcements.state_dir, self.settings.announcements,
                          on_error=self.status.journal_error, open_file=journal_file)
        self.announcements = Announcer(speaking, journal, metrics=self.metrics)
        self.status.announcements = self.announcements
        self.announcements.observe(self.status.announce_status)
        self.reload = Reloader(source, self.announcements, self.controls, current=lambda: self.settings,
                               applied=self._reloaded, make_synth=self._make_synth,
                               make_opener=self._make_opener)
        self._mute_lock = asyncio.Lock()
        self._make_adapters()
        self.remote = RemoteRouter(self._takers, self._end_streamed_turn)
        """Hands a streamed turn to the ESPHome API or the Wyoming satellite."""
        observers: list[HearObserver] = [HearPublisher(self._publish, lambda: self.topics)]
        if self.hermes is not None:
            observers.append(self.hermes)
        observers += [self.remote, *self._music_cues()]
        self.turns = Conversation(self.announcements, lambda: self.settings, self.metrics, observers,
                                  chime=lambda name: _chime(self.announcements.speaking.opener, name),
                                  open_turn=self._open_turn)
        """The conversation turn around the hearing loop: its events go here."""
        self.announcements.observe(self.turns.on_announce_status)

    @property
    def synth(self) -> Synthesizer:
        """The voice announcements are spoken with now."""
        return self.announcements.speaking.synth

    # -- run -----------------------------------------------------------------------------

    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._fleet_wake = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
                self._loop.add_signal_handler(sig, self.stop)
        log.info("edge-agent %s starting as device %s (group %s, config version %d)", __version__,
                 self.device, self.settings.device.group, self.fleet.active.version)
        self._make_bridge()  # before recovering: statuses it reports (failed) wait in the outbox
        if self.settings.daemon.out_dir is not None:
            remove_partials(self.settings.daemon.out_dir)  # no announcement is being written yet
        self.announcements.recover()
        if self.bridge is not None:
            self.bridge.start()
        await asyncio.to_thread(self._warm_up)
        self.announcements.start()
        self._start_listener()
        await self._start_wyoming()
        await self._start_esphome()
        await self._start_sendspin()
        self.status.online()
        tasks = [asyncio.create_task(self.status.heartbeat(lambda: self.settings.mqtt.heartbeat_s),
                                     name="heartbeat"),
                 asyncio.create_task(self._fleet_worker(), name="fleet")]
        if self.settings.daemon.metrics_s > 0:
            metrics_s = lambda: self.settings.daemon.metrics_s  # noqa: E731 (read at each turn: a reload changes it)
            tasks.append(asyncio.create_task(self.status.metrics_every(metrics_s), name="metrics"))
        if self.settings.tts.idle_unload_s > 0:
            tasks.append(asyncio.create_task(self._unload_idle_voices(), name="unload-idle"))
        log.info("running")
        await self._stop_event.wait()
        log.info("stopping")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.wyoming is not None:
            await self.wyoming.stop()
        if self.esphome is not None:
            await self.esphome.stop()
        if self.sendspin is not None:
            await self.sendspin.stop()
        await _in_own_thread(self._shutdown)  # the loop's pool may still be busy with slow work
        log.info("stopped")
        return 0

    def stop(self) -> None:
        """Ask the daemon to stop (any thread, or a signal handler)."""
        if self._loop is not None and self._stop_event is not None:
            self._loop.call_soon_threadsafe(self._stop_event.set)

    def _shutdown(self) -> None:
        self.turns.close()
        if self.listener is not None:
            self.listener.stop()
        release_pipes()  # the FIFO a mute left open for its writer
        self.announcements.stop()
        stop_commands()  # no player or recorder, each in its own session, outlives the agent
        close_synth(self.synth)
        if self.bridge is not None:
            self.bridge.stop([self.status.message("offline")])

    def _warm_up(self) -> None:
        """Load the voice now rather than on the first announcement."""
        try:
            for _ in self.synth.stream(HEALTH_TEXT):
                pass
        except Exception as exc:
            log.error("voice not usable: %s; announcements will fail until it is", exc)

    async def _unload_idle_voices(self) -> None:
        """Give memory back when no announcement has needed a voice for `tts.idle_unload_s`."""
        period = max(1.0, self.settings.tts.idle_unload_s / 4)
        while True:
            await asyncio.sleep(period)
            if not self.announcements.busy.is_set():
                await asyncio.to_thread(self.synth.unload_idle)

    # -- MQTT ----------------------------------------------------------------------------

    def _make_adapters(self) -> None:
        """Home Assistant and Hermes on the bridge, and the dispatcher that routes every topic."""
        self.homeassistant: HomeAssistantAdapter | None = None
        if self.settings.mqtt.ha_discovery:
            ha_topics = HaTopics(self.settings.mqtt.ha_prefix, self.settings.mqtt.prefix, self.device)
            self.homeassistant = HomeAssistantAdapter(ha_topics, self.announcements, self.controls,
                                                      self._publish)
        self.hermes: HermesAdapter | None = None
        if self.settings.hermes.enabled:
            self.hermes = HermesAdapter(self.settings.hermes.site_id or self.device, self.announcements,
                                        self._publish)
            self.announcements.observe(self.hermes.on_status)
        connected = [self.status.online]
        if self.homeassistant is not None:
            connected.append(self.homeassistant.announce)
        connected.append(self._startup_report)
        self.dispatch = Dispatcher(lambda: self.topics, self.announcements, config=self._config_received,
                                   adapters=[a for a in (self.homeassistant, self.hermes) if a is not None],
                                   connected=connected)

    def _make_bridge(self) -> None:
        mqtt = self.settings.mqtt
        if not mqtt.broker:
            log.warning("MQTT disabled (mqtt.broker is empty): no announcements or fleet config")
            return
        client_id = mqtt.client_id or f"edge-agent-{self.device}"
        self.bridge = Bridge(mqtt, client_id, will=self.status.message("offline"),
                             on_message=self.dispatch.on_message, on_messages=self.dispatch.on_messages,
                             on_connect=self.dispatch.on_connect, metrics=self.metrics,
                             subscriptions_file=self.base.fleet.state_dir / "subscriptions.json")
        self.bridge.set_subscriptions(self.dispatch.subscriptions())
        self.status.bridge = self.bridge

    def _publish(self, message: Message) -> None:
        if self.bridge is not None:
            self.bridge.publish(message)

    # -- fleet config --------------------------------------------------------------------

    def _config_received(self, payload: bytes) -> bool:
        """A fleet config came (the MQTT thread): into the inbox, then the fleet worker wakes."""
        ok = self.fleet.enqueue(payload)
        if ok and self._loop is not None and self._fleet_wake is not None:
            self._loop.call_soon_threadsafe(self._fleet_wake.set)
        return ok

    async def _fleet_worker(self) -> None:
        assert self._fleet_wake is not None
        while True:
            await asyncio.to_thread(self.fleet.process_inbox)
            await self._fleet_wake.wait()
            self._fleet_wake.clear()

    def _startup_report(self) -> None:
        report = self.fleet.take_startup_report()
        if report is not None:
            self.status.config_status(report)

    def _reloaded(self, new: Settings, changed: set[str], volume_reset: bool) -> None:
        """A fleet config is active (`Reloader.activate`): the daemon's settings and topics follow."""
        self.settings = new
        if volume_reset and self.homeassistant is not None:
            self.homeassistant.publish_states()  # its slider shows the config's volume now
        if "device" in changed:
            self.topics = Topics(new.mqtt.prefix, self.device, new.device.group)
            if self.bridge is not None:
                self.bridge.set_subscriptions(self.dispatch.subscriptions())

    # -- controls (`controls.Controls`: Home Assistant, ESPHome and Sendspin change them) -------

    def _load_controls(self) -> None:
        self.controls = Controls(self.base.daemon.state_dir, config_volume=self.settings.audio.volume,
                                 wake_offered=self.wake_offered(), on_change=self._control_changed,
                                 close_mic=self._close_mic)
        self.settings = with_choices(self.settings, self.controls)
        mode = self.settings.listen.mode if self.settings.daemon.listen else "off"
        if self.controls.mic_muted() and mode != "off":  # the status on connecting, before listening
            self.listening = {"mode": mode, "state": "muted"}

    def volume(self) -> float:
        """The output volume (`Controls.volume`)."""
        return self.controls.volume()

    def set_mic_muted(self, muted: bool) -> None:
        """Mute or unmute the microphone (`Controls.set_mic_muted`), as Home Assistant does."""
        self.controls.set_mic_muted(muted)

    def _control_changed(self, what: ControlChange) -> None:
        """The user changed a control (any thread; `Controls` has saved it): the device follows."""
        if what == "wake":  # chosen in the ESPHome API: the hearing loop restarts with them
            self.settings = with_wake_words(self.settings, self.controls.wake_words() or ())
            if self._loop is not None and not self.controls.mic_muted():
                asyncio.run_coroutine_threadsafe(self._restart_listener(), self._loop)
            return
        if what == "volume":
            new = with_volume(self.settings, self.controls.volume())
            self.announcements.swap(replace(self.announcements.speaking, opener=self._make_opener(new)))
            self.settings = new
        # Volume or mute changed (from any side): the ESPHome API's entities and the music say so.
        if self.esphome is not None:
            self.esphome.server.entities.refresh()
        if self.sendspin is not None:
            self.sendspin.controls_changed()
        if what == "mic" and self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._apply_mute(), self._loop)

    def _close_mic(self) -> None:
        listener = self.listener
        if listener is not None:
            listener.halt()  # the microphone closes now, whatever else the daemon is waiting for

    async def _apply_mute(self) -> None:
        async with self._mute_lock:  # one switch at a time; the last request wins
            if self.controls.mic_muted() and self.listener is not None:
                listener, self.listener = self.listener, None
                await _in_own_thread(listener.stop)  # closed by `set_mic_muted`: this waits for its thread
                self.listening = {"mode": self.listening.get("mode", "off"), "state": "muted"}
                self.status.online()
            elif not self.controls.mic_muted() and self.listener is None:
                await _in_own_thread(self._start_listener)
                self.status.online()

    async def _restart_listener(self) -> None:
        async with self._mute_lock:
            listener, self.listener = self.listener, None
            if listener is not None:
                await _in_own_thread(listener.stop)
            if not self.controls.mic_muted():
                await _in_own_thread(self._start_listener)

    # -- listener ------------------------------------------------------------------------

    def _start_listener(self) -> None:
        settings = self.settings
        mode = settings.listen.mode if settings.daemon.listen else "off"
        if mode == "off":
            log.info("not listening: listen.mode is off")
            return
        if self.controls.mic_muted():
            log.info("not listening: the microphone is muted")
            self.listening = {"mode": mode, "state": "muted"}
            return
        try:
            self.listener = self._make_listener(settings, self.turns.accept_wake)
        except EdgeError as exc:
            log.error("not listening: %s", exc)
            self.listening = {"mode": mode, "state": "unavailable", "error": str(exc)}
            return
        if self.listener is None:
            # A device set to listen that cannot is a fault to fix, not a mode: say how.
            log.warning("not listening: no ASR model present; %s", EXPORT_HINT)
            self.listening = {"mode": mode, "state": "unavailable",
                              "error": f"no ASR model present; {EXPORT_HINT}"}
            return

        def on_error(exc: BaseException) -> None:
            log.error("listener stopped: %s", exc)
            self.listening = {"mode": mode, "state": "unavailable", "error": str(exc)}
            self.status.online()

        self.listening = {"mode": mode, "state": "listening"}
        if mode == "wake":
            self.listening["wake_words"] = list(settings.wake.models)
        if isinstance(self.listener, HearingLoop):
            self.listener.hearing.stream_turns = self.remote.streaming
        source = getattr(self.listener, "source", None)
        if isinstance(source, FrontEndSource):
            source = source.source  # the microphone the front end hears
        if isinstance(source, (CommandSource, PipeSource)):
            listener = self.listener
            source.on_trouble = lambda problem: self._input_trouble(listener, problem)
        if self.controls.mic_muted():  # muted while the listener was being built: its source closes unheard
            self.listener.halt()
            self.listener = None
            self.listening = {"mode": mode, "state": "muted"}
            return
        mixer = getattr(source, "mixer", None)
        if isinstance(mixer, Beamformer):
            hearing = self.listener
            mixer.on_problem = lambda problem: self._input_channels(hearing, problem)
            if mixer.problem:
                self.listening["channels"] = mixer.problem
        self.listener.start(self.turns.on_event, on_error=on_error,
                            on_end=lambda: log.info("listener ended (its source closed)"))
        log.info("listening", extra={"mode": mode})

    def _input_trouble(self, listener: HearingLoop, problem: str | None) -> None:
        """`audio.input_command` exited (and is being started again), `audio.input_pipe` hears garbage,
        or either hears again: on the status."""
        if self.listener is not listener:
            return  # muted or stopped since
        state = {k: v for k, v in self.listening.items() if k != "error"}
        state.update({"state": "unavailable", "error": problem} if problem else {"state": "listening"})
        self.listening = state
        self.status.online()

    def _input_channels(self, listener: HearingLoop, problem: str | None) -> None:
        """The beamformer fell back to one channel (a dead one, a count the geometry lacks), or
        hears them all again: `channels` on the status; the device still listens."""
        if self.listener is not listener:
            return
        state = {k: v for k, v in self.listening.items() if k != "channels"}
        if problem:
            state["channels"] = problem
        self.listening = state
        self.status.online()

    # -- Wyoming -------------------------------------------------------------------------

    async def _start_wyoming(self) -> None:
        """The Wyoming endpoints on this loop, with the announcements' voice and the listener's Whisper."""
        if not self.settings.wyoming.enabled:
            return
        transcriber = self.listener.transcriber if self.listener is not None else None
        if transcriber is None:
            try:
                transcriber = await asyncio.to_thread(load_transcriber, self.settings)
            except EdgeError as exc:
                log.warning("wyoming: no speech to text: %s", exc)
        wake = await asyncio.to_thread(load_wake, self.settings)
        satellite = None
        if self.settings.wyoming.satellite:
            waking = self.settings.listen.mode == "wake" and self.settings.daemon.listen
            satellite = SatelliteService(self.settings, self.announcements, self._end_streamed_turn,
                                         list(self.settings.wake.models) if waking else [],
                                         on_transcript=self.turns.remote_heard,
                                         no_answer=self.turns.unanswered,
                                         on_change=self.status.online)
        service = WyomingService(self.settings, lambda: self.synth, transcriber, wake, satellite)
        try:
            await service.start()
        except OSError as exc:
            log.error("wyoming server not started: %s", exc)
            if satellite is not None:
                satellite.close()
            return
        self.wyoming = service

    @property
    def satellite(self) -> SatelliteService | None:
        return self.wyoming.satellite if self.wyoming is not None else None

    async def _start_esphome(self) -> None:
        """The ESPHome native API on this loop (Home Assistant's voice assistant)."""
        settings = self.settings.esphome
        if not settings.enabled:
            return
        try:
            from edge_agent.esphome.assistant import Assistant, MediaLimits
            from edge_agent.esphome.entities import Entities
            from edge_agent.esphome.player import TrackPlayer
            from edge_agent.esphome.service import EsphomeService
        except ImportError as exc:  # aioesphomeapi needs Python 3.11
            log.error("esphome: the ESPHome API is not available here (%s); it needs Python 3.11 or "
                      "later with aioesphomeapi installed", exc)
            return
        controls = self.controls
        entities = Entities(settings.name or self.device, controls, wake_words=self.settings.wake.models,
                            available_wake_words=self.wake_offered(), set_wake_words=controls.set_wake_words)
        # Media plays on its own output, ducked and paused with the Sendspin music (`music`).
        player = TrackPlayer(functools.partial(music_sink, self.settings), volume=controls.volume,
                             muted=controls.media_muted, duck_level=self.settings.sendspin.duck_level)
        assistant = Assistant(self.announcements, entities,
                              MediaLimits(settings.media_max_bytes, settings.media_timeout_s),
                              end_turn=self._end_streamed_turn, open_turn=self._continue_conversation,
                              on_transcript=self.turns.remote_heard, no_answer=self.turns.unanswered,
                              player=player)
        service = EsphomeService(settings, self.device, assistant, entities)
        try:
            await service.start()
        except OSError as exc:
            log.error("esphome: API not started: %s", exc)
            assistant.close()
            return
        self.esphome = service
        self.music.players.append(player)

    def _music_cues(self) -> list[HearObserver]:
        """`music`, which ducks or pauses the music (Sendspin's, the ESPHome media player's) for what
        the device says and hears: told the announcements' statuses, and the turns through the list
        returned."""
        self.music = MusicCues(pause_on_wake=self.settings.sendspin.pause_on_wake)
        if not (self.settings.sendspin.enabled or self.settings.esphome.enabled):
            return []
        self.announcements.observe(self.music.on_announce_status)
        return [self.music]

    async def _start_sendspin(self) -> None:
        """The Sendspin player on this loop (Music Assistant's multiroom music)."""
        settings = self.settings.sendspin
        if not settings.enabled:
            return
        from edge_agent.sendspin.player import SendspinPlayer, sendspin_missing

        missing = sendspin_missing()
        if missing is not None:
            log.error("sendspin: %s", missing)
            return
        player = SendspinPlayer(settings, self.device, functools.partial(music_sink, self.settings),
                                self.base.daemon.state_dir, controls=self.controls,
                                on_status=self.status.online)
        try:
            await player.start()
        except OSError as exc:
            log.error("sendspin: player not started: %s", exc)
            return
        self.sendspin = player
        self.music.players.append(player)

    def wake_offered(self) -> list[str]:
        """The wake models Home Assistant may choose from: the configured ones, then the built-in."""
        configured = list(self.base.wake.models)
        return [*configured, *(m for m in WAKE_BUILTIN if m not in configured)]

    def _takers(self) -> list[RemoteTurns]:
        """Who may take a streamed turn, in order of preference."""
        takers: list[RemoteTurns] = []
        if self.esphome is not None:
            takers.append(self.esphome.assistant)
        if self.satellite is not None:
            takers.append(self.satellite)
        return takers

    def _open_turn(self, conversation_id: str) -> bool:
        """A turn without a wake word (any thread) for an announcement that expects a reply: heard
        here. False when the microphone does not listen for wake words."""
        return self._open(conversation_id, stream=False)

    def _continue_conversation(self, conversation_id: str) -> bool:
        """Home Assistant continues or starts a conversation (any thread): a turn without a wake
        word, streamed to it while it runs the voice assistant."""
        return self._open(conversation_id, stream=True)

    def _open(self, conversation_id: str, *, stream: bool) -> bool:
        if self.listener is not None and self.listening.get("mode") == "wake":
            self.listener.hearing.open_turn(conversation_id, stream=stream)
            return True
        return False


    def _end_streamed_turn(self, conversation_id: str) -> None:
        """Home Assistant has the command (or is gone): the hearing loop ends the turn."""
        if isinstance(self.listener, HearingLoop):
            self.listener.hearing.end_turn(conversation_id)


async def _in_own_thread(work: Callable[[], object]) -> None:
    """Run `work` in a thread of its own: the loop's shared pool (`asyncio.to_thread`) may be busy
    with slow work, and the mute and the shutdown must not wait behind it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finish(exc: BaseException | None) -> None:
        if done.done():
            return
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            loop.call_soon_threadsafe(finish, exc)
        else:
            loop.call_soon_threadsafe(finish, None)

    threading.Thread(target=run, name=getattr(work, "__name__", "work"), daemon=True).start()
    await done


def _chime(opener: SinkOpener, name: str) -> None:
    try:
        play_chime(opener, name)
    except Exception as exc:
        log.warning("chime not played: %s", exc)


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

