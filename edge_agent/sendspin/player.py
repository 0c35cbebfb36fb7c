"""The Sendspin player: Music Assistant connects, streams timestamped audio, and it plays in sync.

Server-initiated, as Music Assistant expects: the player listens for the server's WebSocket
and advertises itself (`endpoint`). `aiosendspin`'s client does the protocol (handshake, clock
sync against the server, stream and command messages); this module does the rest: decode each
chunk onto the stream's timeline (`timeline`), play it out against the clock (`playout`), apply
volume, mute, ducking and pause and keep the device's shared volume and mute in step (`level`).

What a server sends is bounded: a format that cannot be decoded is refused and chunks beyond
`max_buffer_s` or `max_ahead_s` are dropped and counted (`intake`), a stream that stalls closes the
output, and a flood of volume commands changes the music at once but the shared volume at most
every `SAVE_EVERY_S`.
Nothing here touches the announcement path: it only reads the device's controls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.atomic import atomic_write
from edge_agent.sendspin.endpoint import BUFFER_CAPACITY_BYTES, Endpoint
from edge_agent.sendspin.intake import Clock, Intake
from edge_agent.sendspin.level import LocalControls, MusicControls, MusicLevel
from edge_agent.sendspin.playout import Playout, SinkFactory
from edge_agent.sendspin.settings import SendspinSettings
from edge_agent.sendspin.timeline import StreamFormat

log = logging.getLogger(__name__)

IDENTITY_FILE = "sendspin-identity.key"
PAIRING_FILE = "sendspin-pairing.json"
OFFERED_RATES = (48000, 44100)
"""PCM rates offered to the server, preferred first; each in 16 and 24 bits, stereo and mono."""
SAVE_EVERY_S = 0.5
"""The shared volume and mute follow the server's commands at most this often (the last wins)."""


def sendspin_missing() -> str | None:
    """Why the player cannot run on this Python (None: it can)."""
    import sys

    if sys.version_info < (3, 12):
        return (f"Sendspin needs Python 3.12 or later (this is {sys.version_info.major}."
                f"{sys.version_info.minor}); the music player is off")
    try:
        import aiosendspin  # noqa: F401
    except ImportError:
        return "aiosendspin is not installed (pip install '.[sendspin]'); the music player is off"
    return None


class SendspinPlayer:
    """Started and stopped with the daemon on its loop; `duck`/`pause` from any thread."""

    def __init__(self, settings: SendspinSettings, device_id: str, open_sink: SinkFactory,
                 state_dir: Path, *, controls: MusicControls | None = None,
                 on_status: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self.name = settings.name or device_id
        self.state_dir = state_dir
        self.level = MusicLevel(controls or LocalControls(), settings.duck_level)
        self.on_status = on_status or (lambda: None)
        self.state = "idle"
        """idle (no server), connected, playing, stalled, unsupported format, output failed."""
        self.error: str | None = None
        self.commands = 0
        self.playout = Playout(open_sink, now_us, self.gain, block_ms=settings.block_ms,
                               stall_s=settings.stall_s, on_state=self._output_state)
        self.intake = Intake(settings, self.playout, self._set_state)
        self.endpoint = Endpoint(settings, self.name)
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._save_handle: asyncio.TimerHandle | None = None
        self._state_pending = False

    @property
    def controls(self) -> MusicControls:
        """The device's shared volume and mute, which the music follows and keeps in step."""
        return self.level.controls

    @controls.setter
    def controls(self, controls: MusicControls) -> None:
        self.level.controls = controls

    @property
    def port(self) -> int:
        """The port the player listens on (the one chosen, once started on port 0)."""
        return self.endpoint.port

    @property
    def client_id(self) -> str | None:
        """The player's Sendspin id (its public key), once started."""
        return None if self._client is None else str(self._client.identity.peer_id)

    @property
    def connected(self) -> bool:
        """A server holds the player."""
        return self._client is not None and bool(self._client.connected)

    # -- what the daemon calls (`sendspin.cues.Music`) -------------------------------------------

    def duck(self, reason: str = "speech") -> None:
        """Lower the music to `duck_level` until `restore(reason)` (several reasons nest)."""
        self.level.cue("ducked", reason, on=True)

    def restore(self, reason: str = "speech") -> None:
        self.level.cue("ducked", reason, on=False)

    def pause(self, reason: str = "turn") -> None:
        """Silence the music here until `resume(reason)`; the group's timeline runs on, so it comes
        back in sync."""
        self.level.cue("paused", reason, on=True)

    def resume(self, reason: str = "turn") -> None:
        self.level.cue("paused", reason, on=False)

    def gain(self) -> float:
        """The music's gain now: volume (Sendspin's perceived curve), mute, pause, ducking."""
        return self.level.gain()

    def controls_changed(self) -> None:
        """The shared volume or mute changed elsewhere (Home Assistant, MQTT, ESPHome; any thread):
        the music follows and the server is told."""
        if self.level.follow_controls() and self._loop is not None:
            self._loop.call_soon_threadsafe(self._send_state)

    def status(self) -> dict[str, Any]:
        """For the device's status topic."""
        state = "connected" if self.state == "idle" and self.connected else self.state
        doc: dict[str, Any] = {"state": state, **self.level.status()}
        if self.intake.server is not None:
            doc["server"] = self.intake.server
        if self.error is not None:
            doc["error"] = self.error
        stream = self.playout.stream
        if stream is not None:
            t = stream.timeline.stats
            doc["stream"] = {"id": stream.id, "rate": stream.format.rate, "late": t.late,
                             "ahead": t.ahead, "overflow": t.overflow}
        return doc

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen for the server, advertise, start the playout; `OSError` if the port is taken."""
        from aiosendspin.client import SendspinClient
        from aiosendspin.models.core import DeviceInfo
        from aiosendspin.models.types import PlayerCommand, Roles
        from aiosendspin.noise.trust_store import FileClientPairingStore

        self._loop = asyncio.get_running_loop()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        identity = await asyncio.to_thread(load_identity, self.state_dir / IDENTITY_FILE)
        store = await FileClientPairingStore.open(self.state_dir / PAIRING_FILE)
        from edge_agent import __version__

        volume, muted = self.level.state()
        self._client = SendspinClient(
            identity, self.name, [Roles.PLAYER], pairing_store=store,
            device_info=DeviceInfo(product_name="edge-speech", manufacturer="edge-speech",
                                   software_version=__version__),
            player_support=_player_support(), output_delay_ms=self.settings.output_delay_ms,
            initial_volume=volume, initial_muted=muted,
            state_supported_commands=[PlayerCommand.VOLUME, PlayerCommand.MUTE],
        )
        # A speaker on the home network plays for the home's server, as Home Assistant's Voice
        # PE does; pairing codes need a display or a spoken code flow this device does not offer.
        await self._client.set_unpaired_access(enabled=True)
        self._client.add_stream_start_listener(self._on_stream_start)
        self._client.add_audio_chunk_listener(self._on_chunk)
        self._client.add_stream_end_listener(self._on_stream_end)
        self._client.add_stream_clear_listener(self._on_stream_clear)
        self._client.add_server_command_listener(self._on_command)
        self._client.add_disconnect_listener(self._on_disconnect)
        await self.endpoint.listen(self._client.attach_websocket)
        self.playout.start()
        log.info("sendspin: player %r listening on %s:%d%s", self.name, self.settings.host, self.port,
                 self.settings.path)
        if self.settings.zeroconf:
            await self.endpoint.advertise()

    async def stop(self) -> None:
        await self.endpoint.withdraw()
        if self._client is not None:
            try:
                await asyncio.wait_for(self._client.disconnect(), 5.0)
            except Exception as exc:  # a server that is gone cannot be told goodbye
                log.debug("sendspin: goodbye failed: %s", exc)
        await self.endpoint.close()
        if self._save_handle is not None:
            self._save_handle.cancel()
        await asyncio.to_thread(self.playout.stop)

    # -- protocol events (on the loop) ------------------------------------------------------------

    def _on_stream_start(self, message: Any) -> None:
        player = message.payload.player
        if player is None:
            return
        info = self._client.server_info
        self.intake.server = getattr(info, "name", None) or getattr(info, "server_id", None)
        self.intake.begin(StreamFormat(str(player.codec.value), player.sample_rate, player.channels,
                                       player.bit_depth), *self._clocks())

    def _on_chunk(self, server_us: int, payload: bytes, fmt: Any, _send_ahead: int) -> None:
        pcm = fmt.pcm_format
        arrived = StreamFormat(str(fmt.codec.value), pcm.sample_rate, pcm.channels, pcm.bit_depth)
        self.intake.chunk(server_us, payload, arrived, *self._clocks())

    def _clocks(self) -> tuple[Clock, Clock]:
        """The client's conversions: local to server time, and server to local play time."""
        return self._client.compute_server_time, self._client.compute_play_time

    def _on_stream_end(self, roles: list[str] | None) -> None:
        if roles is None or "player" in roles:
            self.intake.end()

    def _on_stream_clear(self, roles: list[str] | None) -> None:
        if roles is None or "player" in roles:
            self.intake.clear()

    def _on_disconnect(self) -> None:
        self.intake.disconnected()

    def _on_command(self, payload: Any) -> None:
        command = payload.player
        if command is None:
            return
        self.commands += 1
        if not self.level.command(str(command.command.value), command.volume, command.mute):
            return
        self._send_state()
        if self._save_handle is None and self._loop is not None:  # a flood is one save, the last word
            self._save_handle = self._loop.call_later(SAVE_EVERY_S, self._save_controls)

    def _save_controls(self) -> None:
        self._save_handle = None
        if self._loop is not None:
            self._loop.run_in_executor(None, self.level.save, *self.level.state())

    def _send_state(self) -> None:
        """Tell the server the volume and mute; a flood of changes is one message with the last."""
        client = self._client
        if client is None or not client.connected or self._state_pending or self._loop is None:
            return
        self._state_pending = True

        async def send() -> None:
            self._state_pending = False  # a change from here on sends again
            volume, muted = self.level.state()
            try:
                await client.send_player_state(available=True, volume=volume, muted=muted)
            except Exception as exc:  # the server left meanwhile
                log.debug("sendspin: state not sent: %s", exc)

        self._loop.create_task(send())

    def _output_state(self, stream_id: str, state: str) -> None:
        """From the playout thread."""
        error = "the stream stalled" if state == "stalled" else None
        if state == "output failed":
            error = "the audio output failed"
        self._set_state(state, error)

    def _set_state(self, state: str, error: str | None) -> None:
        changed = (state, error) != (self.state, self.error)
        self.state, self.error = state, error
        if changed:
            self.on_status()


def _player_support() -> Any:
    from aiosendspin.models.player import ClientHelloPlayerSupport, SupportedAudioFormat
    from aiosendspin.models.types import AudioCodec

    formats = [SupportedAudioFormat(codec=AudioCodec.PCM, channels=channels, sample_rate=rate,
                                    bit_depth=bits)
               for rate in OFFERED_RATES for bits in (16, 24) for channels in (2, 1)]
    return ClientHelloPlayerSupport(supported_formats=formats, buffer_capacity=BUFFER_CAPACITY_BYTES)


def load_identity(path: Path) -> Any:
    """The player's long-term key (its Sendspin client id is the public half), made once."""
    from aiosendspin.noise.keys import Identity

    try:
        raw = path.read_bytes()
        if len(raw) == 32:
            return Identity.from_private_bytes(raw)
        log.warning("sendspin: %s is not a 32-byte key; making a new identity (Music Assistant will "
                    "see a new player)", path)
    except FileNotFoundError:
        pass
    identity = Identity.generate()
    atomic_write(path, identity.private_bytes, step="sendspin-identity")
    os.chmod(path, 0o600)  # a private key: the owner's alone, whatever the umask
    return identity


def now_us() -> int:
    """The clock aiosendspin's client syncs against by default (CLOCK_MONOTONIC_RAW on Linux)."""
    return time.clock_gettime_ns(_CLOCK) // 1000


_CLOCK = getattr(time, "CLOCK_MONOTONIC_RAW", time.CLOCK_MONOTONIC)
