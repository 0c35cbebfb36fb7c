"""`edge-agent run`: the device daemon, wiring MQTT, announcements, fleet config, listener and metrics.

The daemon builds the parts and connects them: the MQTT bridge and its adapters,
the announcer, the fleet manager, the hearing loop and the conversation turn
around it (`listen.turn.Conversation`, which tells its `HearObserver`s: the MQTT
publisher, Hermes, the remote turn takers), the Wyoming and ESPHome services.
Which thread or loop owns what, and how a reload swaps what announcements are
spoken with, is stated once, in docs/architecture.md ("Threads and loops").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edge_agent import __version__
from edge_agent.announce.journal import Journal
from edge_agent.announce.pipeline import Announcer, Speaking
from edge_agent.announce.playout import DeviceOpener, DirOpener, SinkOpener, play_chime, remove_partials
from edge_agent.asr.manifest import EXPORT_HINT
from edge_agent.atomic import AppendFile
from edge_agent.audio.command import stop_all as stop_commands
from edge_agent.audio.reference import PlaybackReference, ReferenceSink
from edge_agent.audio.sinks import AudioOutput, Sink, WavSink
from edge_agent.audio.sources import CommandSource, PipeSource, release_pipes
from edge_agent.config import WAKE_BUILTIN, Settings, load_settings
from edge_agent.controls import ControlState, ControlStore
from edge_agent.errors import EdgeError
from edge_agent.fleet.manager import ActiveConfig, FleetManager, Report
from edge_agent.hermes.adapter import HermesAdapter
from edge_agent.homeassistant.adapter import HomeAssistantAdapter
from edge_agent.homeassistant.discovery import HaTopics
from edge_agent.listen.loop import HearingLoop
from edge_agent.listen.microphone import WakeFilter
from edge_agent.listen.remote import RemoteRouter, RemoteTurns
from edge_agent.listen.turn import Conversation, HearObserver
from edge_agent.metrics import Metrics
from edge_agent.models import load_catalog
from edge_agent.mqtt.bridge import Bridge
from edge_agent.mqtt.hearing import HearPublisher
from edge_agent.mqtt.outbox import KEEP, KEEP_LEAST, KEEP_MOST, Message
from edge_agent.mqtt.topics import Topics
from edge_agent.parts import (
    asr_present,
    build_hearing,
    load_transcriber,
    load_wake_models,
    model_store,
    routed_synthesizer,
    wyoming_service,
)
from edge_agent.sendspin.cues import MusicCues
from edge_agent.tts.voice import Synthesizer
from edge_agent.wyoming.satellite import SatelliteService
from edge_agent.wyoming.service import WyomingService

if TYPE_CHECKING:
    from edge_agent.esphome.service import EsphomeService
    from edge_agent.sendspin.player import SendspinPlayer

log = logging.getLogger(__name__)

HEALTH_TEXT = "Ready."
"""Spoken (into no sink) to check a reloaded voice."""


RETIRE_WAIT_S = 300.0
"""How long a replaced synthesizer waits for the announcement still using it before it is closed."""

SynthesizerFactory = Callable[[Settings], Synthesizer]
HearingFactory = Callable[[Settings, WakeFilter], HearingLoop | None]


def hearing_loop(settings: Settings, accept_wake: WakeFilter,
                 reference: PlaybackReference | None = None) -> HearingLoop | None:
    """Microphone -> wake word -> VAD -> Whisper, when an exported ASR model is present (None otherwise).

    A missing microphone is an `AudioError`, a broken export or wake model a `ModelError`:
    both leave the daemon announcing without listening, with the reason logged once and on
    its status (a wake-mode device never falls back to transcribing everything). The microphone
    hears through the front end, `reference` (what the loudspeaker plays) cancelled; a file shares
    no clock with the loudspeaker and is heard without it.
    """
    if not asr_present(settings):
        return None
    # The configured input, opened once the models load.
    return build_hearing(settings, model_store(settings), None, accept_wake, reference)


@dataclass(frozen=True)
class SettingsSource:
    """How to rebuild settings: the local file and command-line overrides, plus a fleet layer."""

    path: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def build(self, layer: dict[str, Any] | None = None) -> Settings:
        return load_settings(self.path, self.overrides, layers=[layer] if layer else [])


class Daemon:
    """The running agent."""

    # What the user changed at run time (`_load_controls`, kept in `controls`).
    _mic_muted: bool
    _media_muted: bool
    _user_volume: float | None
    _user_wake: tuple[str, ...] | None
    _config_volume: float
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
        self._started = time.monotonic()
        self.bridge: Bridge | None = None
        self.wyoming: WyomingService | None = None
        self.esphome: EsphomeService | None = None
        self.listener: HearingLoop | None = None
        self.listening: dict[str, Any] = {"mode": "off", "state": "off"}
        """What the microphone does, on the status topic: mode, state (listening, unavailable, off)."""
        self.fleet = FleetManager(
            self.base.fleet, device=self.device, group=lambda: self.settings.device.group,
            cache_dir=self.base.models.cache_dir, validate=self._validate, activate=self._activate,
            base_catalog=load_catalog(self.base.models.catalog), user_catalog=self.base.models.catalog,
            report=self._publish_config_status,
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
                            self._make_opener(self.settings), _tts_voices(self.settings))
        journal = Journal(self.settings.announcements.state_dir, self.settings.announcements,
                          on_error=self._journal_error, open_file=journal_file)
        self.announcements = Announcer(speaking, journal, metrics=self.metrics)
        self.announcements.observe(self._publish_announce_status)
        self._mute_lock = asyncio.Lock()
        self.homeassistant: HomeAssistantAdapter | None = None
        if self.settings.mqtt.ha_discovery:
            ha_topics = HaTopics(self.settings.mqtt.ha_prefix, self.settings.mqtt.prefix, self.device)
            self.homeassistant = HomeAssistantAdapter(ha_topics, self.announcements, self, self._publish)
        self.hermes: HermesAdapter | None = None
        if self.settings.hermes.enabled:
            self.hermes = HermesAdapter(self.settings.hermes.site_id or self.device, self.announcements,
                                        self._publish)
            self.announcements.observe(self.hermes.on_status)
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
        self._publish(self._status_message("online"))
        tasks = [asyncio.create_task(self._heartbeat(), name="heartbeat"),
                 asyncio.create_task(self._fleet_worker(), name="fleet")]
        if self.settings.daemon.metrics_s > 0:
            tasks.append(asyncio.create_task(self._metrics(), name="metrics"))
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
        _close(self.synth)
        if self.bridge is not None:
            self.bridge.stop([self._status_message("offline")])

    def _warm_up(self) -> None:
        """Load the voice now rather than on the first announcement."""
        try:
            for _ in self.synth.stream(HEALTH_TEXT):
                pass
        except Exception as exc:
            log.error("voice not usable: %s; announcements will fail until it is", exc)

    # -- MQTT ----------------------------------------------------------------------------

    def _make_bridge(self) -> None:
        mqtt = self.settings.mqtt
        if not mqtt.broker:
            log.warning("MQTT disabled (mqtt.broker is empty): no announcements or fleet config")
            return
        client_id = mqtt.client_id or f"edge-agent-{self.device}"
        self.bridge = Bridge(mqtt, client_id, will=self._status_message("offline"),
                             on_message=self._on_message, on_messages=self._on_messages,
                             on_connect=self._on_connect,
                             metrics=self.metrics,
                             subscriptions_file=self.base.fleet.state_dir / "subscriptions.json")
        self.bridge.set_subscriptions(self._subscriptions())

    def _subscriptions(self) -> tuple[str, ...]:
        adapters = [a for a in (self.homeassistant, self.hermes) if a is not None]
        return (*self.topics.subscriptions(), *(t for a in adapters for t in a.subscriptions()))

    def _on_connect(self, session_present: bool) -> None:
        self._publish(self._status_message("online"))
        if self.homeassistant is not None:
            self.homeassistant.announce()
        report = self.fleet.take_startup_report()
        if report is not None:
            self._publish_config_status(report)

    def _on_message(self, topic: str, payload: bytes, retained: bool) -> bool:
        kind = self.topics.kind(topic)
        if kind == "announce":
            return self.announcements.submit(payload, topic)
        if kind == "config":
            ok = self.fleet.enqueue(payload)
            if ok and self._loop is not None and self._fleet_wake is not None:
                self._loop.call_soon_threadsafe(self._fleet_wake.set)
            return ok
        for adapter in (self.homeassistant, self.hermes):
            handled = adapter.handle(topic, payload) if adapter is not None else None
            if handled is not None:
                return handled
        return True  # a topic left over from an old subscription

    def _announcement(self, topic: str, payload: bytes) -> bytes | Mapping[str, Any] | Literal[True] | None:
        """The announcement request a message carries (on the announce topics, Home Assistant's
        notify, a Hermes say for this site); True for a trigger's message already answered; None
        for any other message."""
        if self.topics.kind(topic) == "announce":
            return payload
        for adapter in (self.homeassistant, self.hermes):
            request = adapter.announcement(topic, payload) if adapter is not None else None
            if request is not None:
                return request
        return None

    def _on_messages(self, batch: Sequence[tuple[str, bytes, bool]]) -> list[bool]:
        """`_on_message` for messages read in one go, in order: each run of announcements, from
        any trigger on MQTT, is journaled with one fsync (`Announcer.submit_many`); a trigger's
        message needing no announcement (another Hermes site's say) does not break a run. Stops
        after the first refusal (the bridge acknowledges in order, up to it)."""
        results: list[bool] = []
        run: list[tuple[bytes | Mapping[str, Any], str]] = []
        run_at: list[int] = []
        """Where each of `run`'s results goes in `results`."""

        def submit_run() -> bool:
            if run:
                for at, ok in zip(run_at, self.announcements.submit_many(run), strict=True):
                    results[at] = ok
                run.clear()
                run_at.clear()
            return all(results)

        for topic, payload, retained in batch:
            request = self._announcement(topic, payload)
            if request is True:
                results.append(True)
            elif request is not None:
                run_at.append(len(results))
                results.append(True)  # until its run is submitted
                run.append((request, topic))
            else:
                if not submit_run():
                    break
                results.append(self._on_message(topic, payload, retained))
                if not results[-1]:
                    break
        else:
            submit_run()
        return results[:results.index(False) + 1] if False in results else results

    def _publish(self, message: Message) -> None:
        if self.bridge is not None:
            self.bridge.publish(message)

    def _status_message(self, state: str) -> Message:
        doc: dict[str, Any] = {"state": state, "version": __version__,
                               "config_version": self.fleet.active.version, "ts": round(time.time(), 3)}
        if state == "online":
            doc["uptime_s"] = round(time.monotonic() - self._started, 1)
            doc["queued"] = len(self.announcements.queue)
            error = self.announcements.journal.error
            if error is not None:
                doc["journal_error"] = error  # announcements wait in the broker until it clears
            doc["listen"] = self.listening
            if self.satellite is not None:
                doc["satellite"] = self.satellite.status()
            if self.sendspin is not None:
                doc["music"] = self.sendspin.status()
        return Message.json(self.topics.status, doc, qos=1, retain=True, coalesce=True)

    def _journal_error(self, error: str | None) -> None:
        """The journal stopped (or started again) being writable: say so on the device status."""
        if getattr(self, "announcements", None) is not None:
            self._publish(self._status_message("online"))

    def _publish_announce_status(self, doc: dict[str, Any]) -> None:
        # One waiting status per id (the newest). An id's first status (queued, rejected, a
        # duplicate's answer) and its final one are never pushed out by another id's: only
        # `speaking` and a resumed `queued` say nothing the producer cannot do without.
        later = doc["state"] == "speaking" or (doc["state"] == "queued" and "resume" in doc)
        ann_id = doc.get("id")
        self._publish(Message.json(self.topics.announce_status, doc, qos=1,
                                   key=ann_id if isinstance(ann_id, str) else None,
                                   rank=KEEP if later else KEEP_MOST))

    def _publish_config_status(self, report: Report) -> None:
        self._publish(Message.json(self.topics.config_status, report.to_json(), qos=1, retain=True))
        self._publish(self._status_message("online"))

    # -- periodic ------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.mqtt.heartbeat_s)
            if self.bridge is not None and self.bridge.connected:
                self._publish(self._status_message("online"))

    async def _unload_idle_voices(self) -> None:
        """Give memory back when no announcement has needed a voice for `tts.idle_unload_s`."""
        period = max(1.0, self.settings.tts.idle_unload_s / 4)
        while True:
            await asyncio.sleep(period)
            if not self.announcements.busy.is_set():
                await asyncio.to_thread(self.synth.unload_idle)

    async def _metrics(self) -> None:
        while True:
            await asyncio.sleep(self.settings.daemon.metrics_s)
            self._publish_metrics()

    def _publish_metrics(self) -> None:
        self.metrics.set("announcements_queued", len(self.announcements.queue))
        self.metrics.set("uptime_s", round(time.monotonic() - self._started, 1))
        self.metrics.set("journal_write_errors", self.announcements.journal.write_errors)
        if self.bridge is not None:
            self.metrics.set("mqtt_outbound_queued", len(self.bridge.outbox))
            self.metrics.set("mqtt_outbound_dropped", self.bridge.outbox.dropped)
            self.metrics.set("mqtt_outbound_dropped_final", self.bridge.outbox.dropped_final)
            self.metrics.set("mqtt_outbound_replaced", self.bridge.outbox.replaced)
            self.metrics.set("mqtt_outbound_expired", self.bridge.outbox.expired)
            self.metrics.set("mqtt_outbound_bytes", self.bridge.outbox.bytes)
        doc = {"ts": round(time.time(), 3), **self.metrics.snapshot()}
        self._publish(Message.json(self.topics.metrics, doc, qos=0, coalesce=True, rank=KEEP_LEAST))

    async def _fleet_worker(self) -> None:
        assert self._fleet_wake is not None
        while True:
            await asyncio.to_thread(self.fleet.process_inbox)
            await self._fleet_wake.wait()
            self._fleet_wake.clear()

    # -- fleet config --------------------------------------------------------------------

    def _validate(self, layer: dict[str, Any]) -> None:
        self.source.build(layer)

    def _activate(self, active: ActiveConfig) -> None:
        """Reload the parts a config changes and check them; raise to make the fleet roll back."""
        new = self.source.build(active.layer)
        config_volume = new.audio.volume
        if config_volume == self._config_volume:  # else the config sets a new volume: the latest word wins
            new = self._with_user_choices(new)
        old = self.settings
        changed = {f.name for f in dataclasses.fields(Settings)
                   if getattr(old, f.name) != getattr(new, f.name)}
        # Build and check the whole new bundle first; nothing below the swap can fail half-way.
        current = self.announcements.speaking
        speaking = replace(current, settings=new.announcements)
        if changed & {"audio", "daemon"}:
            speaking = replace(speaking, opener=self._make_opener(new))
        if changed & {"tts", "models", "offload"}:
            speaking = replace(speaking, synth=self._checked_synth(new), voices=_tts_voices(new))
        self.announcements.swap(speaking)
        if speaking.synth is not current.synth:
            self._retire(current.synth)
        if "logging" in changed:
            logging.getLogger().setLevel(new.logging.level.upper())
        if "mqtt" in changed:
            log.warning("changed mqtt settings take effect at the next start")
        self.settings = new
        if config_volume != self._config_volume:
            self._config_volume, self._user_volume = config_volume, None
            self._save_controls()
            if self.homeassistant is not None:
                self.homeassistant.publish_states()  # its slider shows the config's volume now
        if "device" in changed:
            self.topics = Topics(new.mqtt.prefix, self.device, new.device.group)
            if self.bridge is not None:
                self.bridge.set_subscriptions(self._subscriptions())
        log.info("config version %d active (reloaded: %s)", active.version,
                 ", ".join(sorted(changed)) or "nothing", extra={"config_version": active.version})

    def _checked_synth(self, settings: Settings) -> Synthesizer:
        """A new synthesizer that has spoken the health check; closed again if it fails it."""
        synth = self._make_synth(settings)
        try:
            samples = sum(len(chunk.samples) for chunk in synth.stream(HEALTH_TEXT))
            if samples == 0:
                raise EdgeError("the reloaded voice produced no audio")
        except BaseException:
            _close(synth)
            raise
        return synth

    def _retire(self, synth: Synthesizer) -> None:
        """Close a replaced synthesizer once the announcement that may still use it is over."""
        def wait_then_close() -> None:
            if not self.announcements.wait_idle(RETIRE_WAIT_S):
                log.warning("closing the replaced voice while an announcement still speaks (%.0f s on)",
                            RETIRE_WAIT_S)
            _close(synth)

        threading.Thread(target=wait_then_close, name="retire-synth", daemon=True).start()

    # -- listener ------------------------------------------------------------------------

    def _start_listener(self) -> None:
        settings = self.settings
        mode = settings.listen.mode if settings.daemon.listen else "off"
        if mode == "off":
            log.info("not listening: listen.mode is off")
            return
        if self._mic_muted:
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
            self._publish(self._status_message("online"))

        self.listening = {"mode": mode, "state": "listening"}
        if mode == "wake":
            self.listening["wake_words"] = list(settings.wake.models)
        self.listener.hearing.stream_turns = self.remote.streaming
        source = self.listener.microphone.input
        if isinstance(source, (CommandSource, PipeSource)):
            listener = self.listener
            source.on_trouble = lambda problem: self._input_trouble(listener, problem)
        if self._mic_muted:  # muted while the listener was being built: its source closes unheard
            self.listener.halt()
            self.listener = None
            self.listening = {"mode": mode, "state": "muted"}
            return
        mixer = self.listener.microphone.beamformer
        if mixer is not None:
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
        self._publish(self._status_message("online"))

    def _input_channels(self, listener: HearingLoop, problem: str | None) -> None:
        """The beamformer fell back to one channel (a dead one, a count the geometry lacks), or
        hears them all again: `channels` on the status; the device still listens."""
        if self.listener is not listener:
            return
        state = {k: v for k, v in self.listening.items() if k != "channels"}
        if problem:
            state["channels"] = problem
        self.listening = state
        self._publish(self._status_message("online"))

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
        wake = await asyncio.to_thread(load_wake_models, self.settings)
        satellite = None
        if self.settings.wyoming.satellite:
            waking = self.settings.listen.mode == "wake" and self.settings.daemon.listen
            wake_words = list(self.settings.wake.models) if waking else []
            satellite = SatelliteService(self.settings.wyoming, self.device, self.announcements,
                                         self._end_streamed_turn, wake_words,
                                         max_audio_s=self.settings.announcements.max_audio_s,
                                         on_transcript=self.turns.remote_heard,
                                         no_answer=self.turns.unanswered,
                                         on_change=lambda: self._publish(self._status_message("online")))
        service = wyoming_service(self.settings, lambda: self.synth, transcriber, wake, satellite)
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
        entities = Entities(settings.name or self.device, self, wake_words=list(self.settings.wake.models),
                            available_wake_words=self.wake_offered(), set_wake_words=self._set_wake_words)
        # Media plays on its own output, ducked and paused with the Sendspin music (`music`).
        player = TrackPlayer(functools.partial(music_sink, self.settings), volume=self.volume,
                             muted=self.media_muted, duck_level=self.settings.sendspin.duck_level)
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
                                self.base.daemon.state_dir, controls=self,
                                on_status=lambda: self._publish(self._status_message("online")))
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

    def _set_wake_words(self, names: list[str]) -> None:
        """Home Assistant chose other wake words: the hearing loop restarts with them."""
        self._user_wake = tuple(names)
        self._save_controls()
        self.settings = self._with_user_choices(self.settings)
        log.info("wake words set to %s", ", ".join(names))
        if self._loop is not None and not self._mic_muted:
            asyncio.run_coroutine_threadsafe(self._restart_listener(), self._loop)

    async def _restart_listener(self) -> None:
        async with self._mute_lock:
            listener, self.listener = self.listener, None
            if listener is not None:
                await _in_own_thread(listener.stop)
            if not self._mic_muted:
                await _in_own_thread(self._start_listener)

    def _end_streamed_turn(self, conversation_id: str) -> None:
        """Home Assistant has the command (or is gone): the hearing loop ends the turn."""
        if isinstance(self.listener, HearingLoop):
            self.listener.hearing.end_turn(conversation_id)

    # -- what Home Assistant may change (`homeassistant.adapter.Controls`; the MQTT thread) ---------

    def volume(self) -> float:
        return self.settings.audio.volume

    def set_volume(self, volume: float) -> None:
        """Speak later announcements at `volume`, after a restart too (until a config sets another
        `audio.volume`)."""
        self._user_volume = volume
        self._save_controls()
        new = replace(self.settings, audio=replace(self.settings.audio, volume=volume))
        self.announcements.swap(replace(self.announcements.speaking, opener=self._make_opener(new)))
        self.settings = new
        log.info("volume set to %.2f", volume)
        self._controls_changed()

    def mic_muted(self) -> bool:
        return self._mic_muted

    def media_muted(self) -> bool:
        return self._media_muted

    def set_media_muted(self, muted: bool) -> None:
        """Mute the music (announcements still speak), kept across restarts."""
        self._media_muted = muted
        self._save_controls()
        self._controls_changed()

    def set_mic_muted(self, muted: bool) -> None:
        """Close the microphone (the listener stops) or open it again, on the daemon loop; kept
        across restarts (saved before the command is acknowledged)."""
        changed = muted != self._mic_muted
        self._mic_muted = muted
        listener = self.listener
        if muted and listener is not None:
            listener.halt()  # the microphone closes now, whatever else the daemon is waiting for
        self._save_controls()  # also when unchanged: a switch rewrites a file that was unreadable
        if not changed:
            return
        log.info("microphone %s", "muted" if muted else "unmuted")
        self._controls_changed()
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._apply_mute(), self._loop)

    def _load_controls(self) -> None:
        self.controls = ControlStore(self.base.daemon.state_dir)
        self._controls_lock = threading.Lock()
        controls = self.controls.load()
        self._mic_muted = controls.mic_muted
        self._media_muted = controls.media_muted
        self._user_volume = controls.volume
        """The volume Home Assistant set, until a config changes `audio.volume`; None: the config's."""
        offered = self.wake_offered()
        chosen = [w for w in controls.wake_words or () if w in offered]
        self._user_wake = tuple(chosen) if chosen else None
        """The wake words Home Assistant chose (the ESPHome API); None: `wake.models`."""
        self._config_volume = self.settings.audio.volume
        self.settings = self._with_user_choices(self.settings)
        mode = self.settings.listen.mode if self.settings.daemon.listen else "off"
        if self._mic_muted and mode != "off":  # the status sent on connecting, before the listener starts
            self.listening = {"mode": mode, "state": "muted"}

    def _save_controls(self) -> None:
        try:
            with self._controls_lock:  # the MQTT thread and a reload: each saves the whole state
                self.controls.save(ControlState(mic_muted=self._mic_muted, volume=self._user_volume,
                                                wake_words=self._user_wake, media_muted=self._media_muted))
        except OSError as exc:
            log.error("cannot save the microphone mute and volume to %s (%s): they hold until the "
                      "daemon restarts", self.controls.path, exc.strerror or exc)

    def _with_user_choices(self, settings: Settings) -> Settings:
        """`settings` with what the user chose at run time (volume, wake words) over the config's."""
        if self._user_wake is not None:
            settings = replace(settings, wake=replace(settings.wake, models=self._user_wake))
        if self._user_volume is None:
            return settings
        return replace(settings, audio=replace(settings.audio, volume=self._user_volume))

    def _controls_changed(self) -> None:
        """Volume or mute changed (from any side): the ESPHome API's entities say so."""
        if self.esphome is not None:
            self.esphome.server.entities.refresh()
        if self.sendspin is not None:
            self.sendspin.controls_changed()

    async def _apply_mute(self) -> None:
        async with self._mute_lock:  # one switch at a time; the last request wins
            if self._mic_muted and self.listener is not None:
                listener, self.listener = self.listener, None
                await _in_own_thread(listener.stop)  # closed by `set_mic_muted`: this waits for its thread
                self.listening = {"mode": self.listening.get("mode", "off"), "state": "muted"}
                self._publish(self._status_message("online"))
            elif not self._mic_muted and self.listener is None:
                await _in_own_thread(self._start_listener)
                self._publish(self._status_message("online"))


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


def _close(synth: Synthesizer) -> None:
    """Close `synth`; a failure is logged, never raised into a reload or shutdown."""
    try:
        synth.close()
    except Exception:
        log.exception("closing a synthesizer failed")


def _tts_voices(settings: Settings) -> frozenset[str]:
    return frozenset(load_catalog(settings.models.catalog).ids(task="tts"))


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

