"""The Sendspin player: Music Assistant connects, streams timestamped audio, and it plays in sync.

Server-initiated, as Music Assistant expects: the player listens for the server's WebSocket
(`sendspin.port`, path `sendspin.path`) and advertises `_sendspin._tcp.local.` with the path
in its TXT record. `aiosendspin`'s client does the protocol (handshake, clock sync against
the server, stream and command messages); this module does the rest: decode each chunk onto
the stream's timeline (`timeline`), play it out against the clock (`playout`), apply volume,
mute, ducking and pause, and keep the device's shared volume and mute in step.

What a server sends is bounded here: a format that cannot be decoded is refused (one log line,
`unsupported format` in the status, its chunks dropped), chunks beyond `max_buffer_s` or
`max_ahead_s` are dropped and counted, a stream that stalls closes the output, and a flood of
volume commands changes the music at once but the shared volume at most every `SAVE_EVERY_S`.
Nothing here touches the announcement path: it only reads the device's controls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edge_agent.atomic import atomic_write
from edge_agent.mdns import Advertisement, label
from edge_agent.sendspin.playout import Playout, SinkFactory, Stream
from edge_agent.sendspin.settings import SendspinSettings
from edge_agent.sendspin.timeline import StreamFormat, Timeline, UnsupportedFormat

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

SERVICE_TYPE = "_sendspin._tcp.local."
IDENTITY_FILE = "sendspin-identity.key"
PAIRING_FILE = "sendspin-pairing.json"
OFFERED_RATES = (48000, 44100)
"""PCM rates offered to the server, preferred first; each in 16 and 24 bits, stereo and mono."""
SAVE_EVERY_S = 0.5
"""The shared volume and mute follow the server's commands at most this often (the last wins)."""
BUFFER_CAPACITY_BYTES = 1_048_576
"""What the hello tells the server we buffer (it sends no further ahead than fits)."""


class MusicControls(Protocol):
    """The device's shared volume and mute (`controls.Controls`; `controls.ControlState` on disk)."""

    def volume(self) -> float: ...

    def set_volume(self, volume: float) -> None: ...

    def media_muted(self) -> bool: ...

    def set_media_muted(self, muted: bool) -> None: ...


class LocalControls:
    """Volume and mute held here alone (a player without a daemon: tests, the benchmark)."""

    def __init__(self, volume: float = 1.0, muted: bool = False) -> None:
        self._volume, self._muted = volume, muted

    def volume(self) -> float:
        return self._volume

    def set_volume(self, volume: float) -> None:
        self._volume = volume

    def media_muted(self) -> bool:
        return self._muted

    def set_media_muted(self, muted: bool) -> None:
        self._muted = muted


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
        self.controls: MusicControls = controls or LocalControls()
        self.on_status = on_status or (lambda: None)
        self._volume = _percent(self.controls.volume())
        self._muted = self.controls.media_muted()
        self._ducks: set[str] = set()
        self._pauses: set[str] = set()
        self._flags = threading.Lock()
        self.state = "idle"
        """idle (no server), connected, playing, stalled, unsupported format, output failed."""
        self.error: str | None = None
        self.server: str | None = None
        self.streams = 0
        self.commands = 0
        self.playout = Playout(open_sink, now_us, self.gain, block_ms=settings.block_ms,
                               stall_s=settings.stall_s, on_state=self._output_state)
        self._client: Any = None
        self._runner: web.AppRunner | None = None
        self._advert: Advertisement | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._save_handle: asyncio.TimerHandle | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._refused: StreamFormat | None = None
        """The format of the stream refused last: its chunks are dropped without a word."""
        self._state_pending = False
        self.port = settings.port

    @property
    def client_id(self) -> str | None:
        """The player's Sendspin id (its public key), once started."""
        return None if self._client is None else str(self._client.identity.peer_id)

    @property
    def connected(self) -> bool:
        """A server holds the player."""
        return self._client is not None and bool(self._client.connected)

    # -- what the daemon calls -------------------------------------------------------------------

    def duck(self, reason: str = "speech") -> None:
        """Lower the music to `duck_level` until `restore(reason)` (several reasons nest)."""
        self._cue(self._ducks, reason, add=True, what="ducked")

    def restore(self, reason: str = "speech") -> None:
        self._cue(self._ducks, reason, add=False, what="ducked")

    def pause(self, reason: str = "turn") -> None:
        """Silence the music here until `resume(reason)`; the group's timeline runs on, so it comes
        back in sync."""
        self._cue(self._pauses, reason, add=True, what="paused")

    def resume(self, reason: str = "turn") -> None:
        self._cue(self._pauses, reason, add=False, what="paused")

    def _cue(self, held: set[str], reason: str, *, add: bool, what: str) -> None:
        with self._flags:
            before = bool(held)
            if add:
                held.add(reason)
            else:
                held.discard(reason)
            after = bool(held)
        if before != after:
            log.info("sendspin: music %s (%s)", what if after else f"no longer {what}", reason)

    def gain(self) -> float:
        """The music's gain now: volume (Sendspin's perceived curve), mute, pause, ducking."""
        with self._flags:
            if self._muted or self._pauses:
                return 0.0
            level = float((self._volume / 100.0) ** 1.5)
            return level * self.settings.duck_level if self._ducks else level

    def controls_changed(self) -> None:
        """The shared volume or mute changed elsewhere (Home Assistant, MQTT, ESPHome; any thread):
        the music follows and the server is told."""
        volume, muted = _percent(self.controls.volume()), self.controls.media_muted()
        with self._flags:
            changed = (volume, muted) != (self._volume, self._muted)
            self._volume, self._muted = volume, muted
        if changed and self._loop is not None:
            self._loop.call_soon_threadsafe(self._send_state)

    def status(self) -> dict[str, Any]:
        """For the device's status topic."""
        state = "connected" if self.state == "idle" and self.connected else self.state
        with self._flags:
            doc: dict[str, Any] = {"state": state, "volume": self._volume, "muted": self._muted,
                                   "ducked": bool(self._ducks), "paused": bool(self._pauses)}
        if self.server is not None:
            doc["server"] = self.server
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
        from aiohttp import web
        from aiosendspin.client import SendspinClient
        from aiosendspin.models.core import DeviceInfo
        from aiosendspin.models.types import PlayerCommand, Roles
        from aiosendspin.noise.trust_store import FileClientPairingStore

        self._loop = asyncio.get_running_loop()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        identity = await asyncio.to_thread(load_identity, self.state_dir / IDENTITY_FILE)
        store = await FileClientPairingStore.open(self.state_dir / PAIRING_FILE)
        from edge_agent import __version__

        self._client = SendspinClient(
            identity, self.name, [Roles.PLAYER], pairing_store=store,
            device_info=DeviceInfo(product_name="edge-speech", manufacturer="edge-speech",
                                   software_version=__version__),
            player_support=_player_support(), output_delay_ms=self.settings.output_delay_ms,
            initial_volume=self._volume, initial_muted=self._muted,
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
        app = web.Application()
        app.router.add_get(self.settings.path, self._serve)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.settings.host, self.settings.port)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            raise
        if self._runner.addresses:
            self.port = int(self._runner.addresses[0][1])
        self.playout.start()
        log.info("sendspin: player %r listening on %s:%d%s", self.name, self.settings.host, self.port,
                 self.settings.path)
        if self.settings.zeroconf:
            advert = Advertisement(SERVICE_TYPE, self.name, self.settings.host, self.port,
                                   {"path": self.settings.path, "name": self.name},
                                   hostname=f"{label(self.name)}.local.")
            try:
                await advert.start()
                self._advert = advert
            except Exception as exc:  # Music Assistant can still add it by address
                log.warning("sendspin: zeroconf advertisement failed (%s); add ws://<address>:%d%s "
                            "in Music Assistant", exc, self.port, self.settings.path)

    async def stop(self) -> None:
        advert, self._advert = self._advert, None
        if advert is not None:
            await advert.stop()
        if self._client is not None:
            try:
                await asyncio.wait_for(self._client.disconnect(), 5.0)
            except Exception as exc:  # a server that is gone cannot be told goodbye
                log.debug("sendspin: goodbye failed: %s", exc)
        for task in list(self._connections):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._save_handle is not None:
            self._save_handle.cancel()
        await asyncio.to_thread(self.playout.stop)

    async def _serve(self, request: web.Request) -> web.WebSocketResponse:
        from aiohttp import web

        ws = web.WebSocketResponse(heartbeat=30, max_msg_size=BUFFER_CAPACITY_BYTES)
        await ws.prepare(request)
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        log.info("sendspin: server connecting from %s", request.remote)
        try:
            await self._client.attach_websocket(ws)
        except Exception as exc:  # a broken peer must not take the listener down
            log.warning("sendspin: connection from %s failed: %s", request.remote, exc)
        finally:
            if task is not None:
                self._connections.discard(task)
            if not ws.closed:
                await ws.close()
        return ws

    # -- protocol events (on the loop) ------------------------------------------------------------

    def _on_stream_start(self, message: Any) -> None:
        player = message.payload.player
        if player is None:
            return
        info = self._client.server_info
        self.server = getattr(info, "name", None) or getattr(info, "server_id", None)
        self._begin(StreamFormat(str(player.codec.value), player.sample_rate, player.channels,
                                 player.bit_depth))

    def _begin(self, fmt: StreamFormat) -> Stream | None:
        """A new stream in `fmt` (or the same stream in a new format): its own timeline."""
        self.streams += 1
        stream_id = str(self.streams)
        try:
            fmt.check()
        except UnsupportedFormat as exc:
            self._refused = fmt
            self._set_state("unsupported format", f"stream {stream_id}: {exc}")
            log.error("sendspin: the server sent a stream we cannot play: %s; it is ignored until "
                      "the next stream", exc, extra={"stream": stream_id})
            self.playout.set_stream(None)
            return None
        self._refused = None
        max_samples = round(self.settings.max_buffer_s * fmt.rate)
        stream = Stream(stream_id, fmt, Timeline(fmt.rate, max_samples),
                        to_server=self._client.compute_server_time,
                        to_local=self._client.compute_play_time)
        log.info("sendspin: stream %s from %s: %s %d Hz, %d ch, %d bit", stream_id, self.server,
                 fmt.codec, fmt.rate, fmt.channels, fmt.bit_depth, extra={"stream": stream_id})
        self.playout.set_stream(stream)
        self._set_state("connected", None)
        return stream

    def _on_chunk(self, server_us: int, payload: bytes, fmt: Any, _send_ahead: int) -> None:
        pcm = fmt.pcm_format
        arrived = StreamFormat(str(fmt.codec.value), pcm.sample_rate, pcm.channels, pcm.bit_depth)
        stream = self.playout.stream
        if arrived == self._refused:
            return  # a stream we cannot play: dropped, said once
        if stream is None or arrived != stream.format:  # a format change mid-stream starts afresh
            stream = self._begin(arrived)
            if stream is None:
                return
        samples = stream.format.decode(payload)
        max_ahead = round(self.settings.max_ahead_s * stream.format.rate)
        with self.playout.lock:
            if self.playout.stream is not stream:
                return
            outcome = stream.timeline.push(server_us, samples, stream.cursor, max_ahead)
            stream.last_chunk_us = now_us()
            self.playout.wake()
        if outcome == "ahead" and stream.timeline.stats.ahead in (1, 100, 10000):
            log.warning("sendspin: chunk %.1f s ahead of the output refused (%d so far): the server's "
                        "clock jumped?", (stream.timeline.index(server_us) - (stream.cursor or 0))
                        / stream.format.rate, stream.timeline.stats.ahead, extra={"stream": stream.id})
        elif outcome == "overflow" and stream.timeline.stats.overflow in (1, 100, 10000):
            log.warning("sendspin: buffer full (%.1f s); chunk dropped (%d so far)",
                        self.settings.max_buffer_s, stream.timeline.stats.overflow,
                        extra={"stream": stream.id})

    def _on_stream_end(self, roles: list[str] | None) -> None:
        if roles is not None and "player" not in roles:
            return
        stream = self.playout.stream
        if stream is not None:
            log.info("sendspin: stream %s ended (%d chunks, %d late, %d refused, %d dropped)", stream.id,
                     stream.timeline.stats.chunks, stream.timeline.stats.late, stream.timeline.stats.ahead,
                     stream.timeline.stats.overflow, extra={"stream": stream.id})
        self._refused = None
        self.playout.set_stream(None)
        self._set_state("connected", None)

    def _on_stream_clear(self, roles: list[str] | None) -> None:
        if roles is not None and "player" not in roles:
            return
        stream = self.playout.stream
        if stream is not None:
            with self.playout.lock:
                stream.timeline.clear()

    def _on_disconnect(self) -> None:
        if self.playout.stream is not None:
            log.warning("sendspin: the server disconnected during a stream; the music stops, the device "
                        "carries on", extra={"stream": self.playout.stream.id})
        self._refused = None
        self.playout.set_stream(None)
        self._set_state("idle", None)

    def _on_command(self, payload: Any) -> None:
        command = payload.player
        if command is None:
            return
        self.commands += 1
        name = str(command.command.value)
        with self._flags:
            if name == "volume" and command.volume is not None:
                self._volume = max(0, min(100, int(command.volume)))
            elif name == "mute" and command.mute is not None:
                self._muted = bool(command.mute)
            else:
                return
        self._send_state()
        if self._save_handle is None and self._loop is not None:  # a flood is one save, the last word
            self._save_handle = self._loop.call_later(SAVE_EVERY_S, self._save_controls)

    def _save_controls(self) -> None:
        self._save_handle = None
        with self._flags:
            volume, muted = self._volume, self._muted
        loop = self._loop
        if loop is None:
            return

        def save() -> None:
            if _percent(self.controls.volume()) != volume:
                self.controls.set_volume(volume / 100.0)
            if self.controls.media_muted() != muted:
                self.controls.set_media_muted(muted)

        loop.run_in_executor(None, save)

    def _send_state(self) -> None:
        """Tell the server the volume and mute; a flood of changes is one message with the last."""
        client = self._client
        if client is None or not client.connected or self._state_pending or self._loop is None:
            return
        self._state_pending = True

        async def send() -> None:
            self._state_pending = False  # a change from here on sends again
            with self._flags:
                volume, muted = self._volume, self._muted
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


def _percent(volume: float) -> int:
    return max(0, min(100, round(volume * 100)))


def now_us() -> int:
    """The clock aiosendspin's client syncs against by default (CLOCK_MONOTONIC_RAW on Linux)."""
    return time.clock_gettime_ns(_CLOCK) // 1000


_CLOCK = getattr(time, "CLOCK_MONOTONIC_RAW", time.CLOCK_MONOTONIC)
