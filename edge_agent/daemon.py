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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent import __version__, outputs
from edge_agent.announce.journal import Journal
from edge_agent.announce.pipeline import Announcer, Speaking
from edge_agent.announce.playout import SinkOpener, remove_partials
from edge_agent.atomic import AppendFile
from edge_agent.audio.command import stop_all as stop_commands
from edge_agent.audio.reference import PlaybackReference
from edge_agent.audio.sources import release_pipes
from edge_agent.config import WAKE_BUILTIN, Settings
from edge_agent.controls import ControlChange, Controls
from edge_agent.errors import EdgeError
from edge_agent.fleet.manager import FleetManager
from edge_agent.hermes.adapter import HermesAdapter
from edge_agent.homeassistant.adapter import HomeAssistantAdapter
from edge_agent.homeassistant.discovery import HaTopics
from edge_agent.listen.loop import HearingLoop
from edge_agent.listen.remote import RemoteRouter, RemoteTurns
from edge_agent.listen.turn import Conversation, HearObserver
from edge_agent.listener import HearingFactory, Listener, hearing_loop
from edge_agent.metrics import Metrics
from edge_agent.models import load_catalog
from edge_agent.mqtt.bridge import Bridge
from edge_agent.mqtt.dispatch import Dispatcher
from edge_agent.mqtt.hearing import HearPublisher
from edge_agent.mqtt.outbox import Message
from edge_agent.mqtt.topics import Topics
from edge_agent.parts import routed_synthesizer
from edge_agent.reload import (
    FleetWorker,
    Reloader,
    SettingsSource,
    with_choices,
    with_volume,
    with_wake_words,
)
from edge_agent.sendspin.cues import MusicCues
from edge_agent.services import Parts, start_esphome, start_sendspin, start_wyoming
from edge_agent.status import DeviceStatus
from edge_agent.threads import in_own_thread
from edge_agent.tts.voice import Synthesizer
from edge_agent.wyoming.satellite import SatelliteService
from edge_agent.wyoming.service import WyomingService

if TYPE_CHECKING:
    from edge_agent.esphome.service import EsphomeService
    from edge_agent.sendspin.player import SendspinPlayer

__all__ = ["Daemon", "SettingsSource"]
"""`SettingsSource` (`reload`) is taken from here too: what `edge-agent run` hands the daemon."""

log = logging.getLogger(__name__)

SynthesizerFactory = Callable[[Settings], Synthesizer]


class Daemon:
    """The running agent."""

    controls: Controls
    topics: Topics
    fleet: FleetManager
    reload: Reloader
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
        self._make_opener = opener_factory or functools.partial(outputs.default_opener,
                                                                reference=self.reference)
        self._stop_event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.bridge: Bridge | None = None
        self.wyoming: WyomingService | None = None
        self.esphome: EsphomeService | None = None
        self.status = DeviceStatus(self._publish, lambda: self.topics, self.metrics,
                                   config_version=lambda: self.fleet.active.version)
        self.mic = Listener(listener_factory or functools.partial(hearing_loop, reference=self.reference),
                              lambda: self.settings, self._mic_muted, self.status.online)
        """The hearing loop: started, muted, restarted, and its state on the status."""
        self.status.parts.update(
            listen=lambda: self.mic.state,
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
        self.fleet_worker = FleetWorker(self.fleet)
        active = self.fleet.recover()
        try:
            self.settings = source.build(active.layer)
        except EdgeError as exc:
            log.error("fleet config version %d no longer loads (%s); running with the local config",
                      active.version, exc)
        self._load_controls()  # before anything listens: a muted microphone stays closed
        self.topics = Topics(self.settings.mqtt.prefix, self.device, self.settings.device.group)
        speaking = Speaking(self.settings.announcements, self._make_synth(self.settings),
                            self._make_opener(self.settings), outputs.tts_voices(self.settings))
        journal = Journal(self.settings.announcements.state_dir, self.settings.announcements,
                          on_error=self.status.journal_error, open_file=journal_file)
        self.announcements = Announcer(speaking, journal, metrics=self.metrics)
        self.status.announcements = self.announcements
        self.announcements.observe(self.status.announce_status)
        self.reload = Reloader(source, self.announcements, self.controls, current=lambda: self.settings,
                               applied=self._reloaded, make_synth=self._make_synth,
                               make_opener=self._make_opener)
        self._make_adapters()
        self.remote = RemoteRouter(self._takers, self.mic.end_turn)
        """Hands a streamed turn to the ESPHome API or the Wyoming satellite."""
        observers: list[HearObserver] = [HearPublisher(self._publish, lambda: self.topics)]
        if self.hermes is not None:
            observers.append(self.hermes)
        observers += [self.remote, *self._music_cues()]
        self.turns = Conversation(self.announcements, lambda: self.settings, self.metrics, observers,
                                  chime=lambda name: outputs.chime(self.announcements.speaking.opener, name),
                                  open_turn=functools.partial(self.mic.open_turn, stream=False))
        """The conversation turn around the hearing loop: its events go here."""
        self.mic.turns, self.mic.streaming = self.turns, self.remote.streaming
        self.announcements.observe(self.turns.on_announce_status)

    def _mic_muted(self) -> bool:
        return self.controls.mic_muted()  # loaded after the fleet's settings: read at each use

    @property
    def listener(self) -> HearingLoop | None:
        """The hearing loop while the device listens."""
        return self.mic.loop

    @property
    def synth(self) -> Synthesizer:
        """The voice announcements are spoken with now."""
        return self.announcements.speaking.synth

    # -- run -----------------------------------------------------------------------------

    async def run(self) -> int:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
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
        await asyncio.to_thread(outputs.warm_up, self.synth)
        self.announcements.start()
        self.mic.start()
        await self._start_services()
        self.status.online()
        tasks = [asyncio.create_task(self.status.heartbeat(lambda: self.settings.mqtt.heartbeat_s),
                                     name="heartbeat"),
                 asyncio.create_task(self.fleet_worker.run(), name="fleet")]
        if self.settings.daemon.metrics_s > 0:
            metrics_s = lambda: self.settings.daemon.metrics_s  # noqa: E731 (read at each turn: a reload changes it)
            tasks.append(asyncio.create_task(self.status.metrics_every(metrics_s), name="metrics"))
        if self.settings.tts.idle_unload_s > 0:
            unload = outputs.unload_idle_voices(self.announcements, self.settings.tts.idle_unload_s)
            tasks.append(asyncio.create_task(unload, name="unload-idle"))
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
        await in_own_thread(self._shutdown)  # the loop's pool may still be busy with slow work
        log.info("stopped")
        return 0

    def stop(self) -> None:
        """Ask the daemon to stop (any thread, or a signal handler)."""
        if self._loop is not None and self._stop_event is not None:
            self._loop.call_soon_threadsafe(self._stop_event.set)

    def _shutdown(self) -> None:
        self.turns.close()
        self.mic.stop()
        release_pipes()  # the FIFO a mute left open for its writer
        self.announcements.stop()
        stop_commands()  # no player or recorder, each in its own session, outlives the agent
        outputs.close_synth(self.synth)
        if self.bridge is not None:
            self.bridge.stop([self.status.message("offline")])

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
        self.dispatch = Dispatcher(lambda: self.topics, self.announcements, config=self.fleet_worker.received,
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
                                 close_mic=self.mic.close)
        # Who holds the daemon reads and switches them on it too (the ESPHome and Home Assistant tests).
        self.volume, self.mic_muted = self.controls.volume, self.controls.mic_muted
        self.media_muted, self.set_mic_muted = self.controls.media_muted, self.controls.set_mic_muted
        self.settings = with_choices(self.settings, self.controls)
        self.mic.muted_before_start()

    def _control_changed(self, what: ControlChange) -> None:
        """The user changed a control (any thread; `Controls` has saved it): the device follows."""
        if what == "wake":  # chosen in the ESPHome API: the hearing loop restarts with them
            self.settings = with_wake_words(self.settings, self.controls.wake_words() or ())
            if self._loop is not None and not self.controls.mic_muted():
                asyncio.run_coroutine_threadsafe(self.mic.restart(), self._loop)
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
            asyncio.run_coroutine_threadsafe(self.mic.apply_mute(), self._loop)

    # -- servers beside MQTT (`services.py`) ---------------------------------------------

    async def _start_services(self) -> None:
        """The Wyoming endpoints, the ESPHome API and the Sendspin player, as configured."""
        parts = Parts(self.settings, self.device, self.announcements, self.turns, self.controls, self.music,
                      end_turn=self.mic.end_turn, on_status=self.status.online)
        if self.settings.wyoming.enabled:
            transcriber = self.listener.transcriber if self.listener is not None else None
            self.wyoming = await start_wyoming(parts, lambda: self.synth, transcriber)
        if self.settings.esphome.enabled:
            self.esphome = await start_esphome(
                parts, self.wake_offered(),
                # Home Assistant continues or starts a conversation: a turn without a wake word,
                # streamed to it while it runs the voice assistant.
                lambda conversation_id: self.mic.open_turn(conversation_id, stream=True))
        if self.settings.sendspin.enabled:
            from edge_agent.sendspin.player import sendspin_missing

            missing = sendspin_missing()
            if missing is not None:
                log.error("sendspin: %s", missing)
            else:
                self.sendspin = await start_sendspin(parts, self.base.daemon.state_dir)

    @property
    def satellite(self) -> SatelliteService | None:
        return self.wyoming.satellite if self.wyoming is not None else None

    def _music_cues(self) -> list[HearObserver]:
        """`music`, which ducks or pauses the music (Sendspin's, the ESPHome media player's) for what
        the device says and hears: told the announcements' statuses, and the turns through the list
        returned."""
        self.music = MusicCues(pause_on_wake=self.settings.sendspin.pause_on_wake)
        if not (self.settings.sendspin.enabled or self.settings.esphome.enabled):
            return []
        self.announcements.observe(self.music.on_announce_status)
        return [self.music]

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
