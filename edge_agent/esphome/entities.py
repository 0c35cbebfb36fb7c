"""The entities the device shows Home Assistant over the ESPHome API.

- a media player (`media_player.<name>`): announcements through the announcement
  queue, media (`play_media`) through its own track player (`player`) with pause,
  resume, stop and mute; the volume; idle/playing/paused and muted reported as the
  ESPHome firmware does. It asks Home Assistant's ffmpeg proxy for FLAC for media and
  WAV for announcements (`descriptions`); a URL that bypasses the proxy may be WAV, FLAC or
  MP3 (see `media`);
- a switch `mute` (the microphone; the same switch as MQTT discovery's mic mute);
- the wake words: not an entity of ours but the voice assistant's configuration
  (`VoiceAssistantConfigurationResponse`), from which Home Assistant makes its own
  wake word select; a choice made there comes back as `VoiceAssistantSetConfiguration`.

The values live in the daemon's `controls.Controls`, which keeps them across a restart;
this module only maps them to messages. Keys are fixed per object id, so Home
Assistant's entity registry finds the same entities after a restart.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

from aioesphomeapi import api_pb2 as pb
from aioesphomeapi.model import MediaPlayerCommand, MediaPlayerEntityFeature, MediaPlayerFormatPurpose
from aioesphomeapi.model import MediaPlayerState as State
from google.protobuf.message import Message

from edge_agent.esphome.media import compressed_playable
from edge_agent.esphome.player import HOME_ASSISTANT, TrackPlayer

PLAYBACK_RATE = 22050
"""The rate the media player asks for (the local voice's): fewer resampling steps on the way."""
VOLUME_STEP = 0.1


class Controls(Protocol):
    """What Home Assistant may change on the device (the daemon)."""

    def volume(self) -> float: ...
    def set_volume(self, volume: float) -> None: ...
    def mic_muted(self) -> bool: ...
    def set_mic_muted(self, muted: bool) -> None: ...
    def media_muted(self) -> bool: ...
    def set_media_muted(self, muted: bool) -> None: ...


def key(object_id: str) -> int:
    """A stable 32-bit key for an entity (ESPHome's keys are any unique uint32)."""
    return zlib.crc32(object_id.encode()) or 1


MEDIA_PLAYER, MUTE = key("media_player"), key("mute")


class Entities:
    """The entity list and states; commands applied to `controls`, changes told to `publish`."""

    def __init__(self, name: str, controls: Controls, *, wake_words: Sequence[str],
                 available_wake_words: Sequence[str],
                 set_wake_words: Callable[[list[str]], None] | None = None) -> None:
        self.name = name
        self.controls = controls
        self._wake_words = list(wake_words)
        self._available = list(available_wake_words)
        self._set_wake_words = set_wake_words
        self._playing = False
        """An announcement is being spoken."""
        self.player: TrackPlayer | None = None
        """Plays `play_media`'s tracks (set by the assistant)."""
        self.publish: Callable[[Message], None] = lambda message: None
        """Sends a state to every subscribed connection (set by the server)."""

    def descriptions(self) -> list[Message]:
        # Home Assistant's proxy converts media to the first DEFAULT format and announcements to the
        # ANNOUNCEMENT one: FLAC (lossless, about half of WAV's bytes, so a track twice as long fits
        # `media_max_bytes`) where libsndfile reads it, and WAV (decoded here alone) for what is said.
        media = "flac" if compressed_playable() else "wav"
        formats = [pb.MediaPlayerSupportedFormat(format=kind, sample_rate=PLAYBACK_RATE, num_channels=1,
                                                 purpose=purpose, sample_bytes=2)
                   for kind, purpose in ((media, MediaPlayerFormatPurpose.DEFAULT),
                                         ("wav", MediaPlayerFormatPurpose.ANNOUNCEMENT))]
        F = MediaPlayerEntityFeature  # noqa: N806
        features = (F.PLAY_MEDIA | F.VOLUME_SET | F.VOLUME_STEP | F.VOLUME_MUTE | F.MEDIA_ANNOUNCE | F.PAUSE
                    | F.PLAY | F.STOP)
        return [
            pb.ListEntitiesMediaPlayerResponse(object_id="media_player", key=MEDIA_PLAYER, name="Speaker",
                                               supports_pause=True, supported_formats=formats,
                                               feature_flags=int(features)),
            pb.ListEntitiesSwitchResponse(object_id="mute", key=MUTE, name="Mute", icon="mdi:microphone-off",
                                          entity_category=1),
        ]

    def states(self) -> list[Message]:
        return [self._media_state(), pb.SwitchStateResponse(key=MUTE, state=self.controls.mic_muted())]

    # -- commands (the server's loop) ----------------------------------------------------

    def switch(self, request: pb.SwitchCommandRequest) -> None:
        if request.key == MUTE:
            self.controls.set_mic_muted(request.state)
            self.publish(pb.SwitchStateResponse(key=MUTE, state=request.state))

    def media(self, request: pb.MediaPlayerCommandRequest) -> None:
        """Volume, mute and the track's pause, resume and stop; `play_media` is the assistant's (it
        fetches)."""
        if request.key != MEDIA_PLAYER:
            return
        if request.has_volume:
            self.controls.set_volume(min(1.0, max(0.0, request.volume)))
        if request.has_command:
            try:
                command = MediaPlayerCommand(request.command)
            except ValueError:  # a newer Home Assistant's command: nothing to do here
                return
            self._command(command)
        self.publish(self._media_state())

    def _command(self, command: MediaPlayerCommand) -> None:
        C, player = MediaPlayerCommand, self.player  # noqa: N806
        if command in (C.VOLUME_UP, C.VOLUME_DOWN):
            step = VOLUME_STEP if command == C.VOLUME_UP else -VOLUME_STEP
            self.controls.set_volume(min(1.0, max(0.0, self.controls.volume() + step)))
        elif command in (C.MUTE, C.UNMUTE):
            self.controls.set_media_muted(command == C.MUTE)
        elif player is None:
            return
        elif command == C.PAUSE or (command == C.TOGGLE and player.state == "playing"):
            player.pause(HOME_ASSISTANT)
        elif command in (C.PLAY, C.TOGGLE):
            player.resume(HOME_ASSISTANT)
        elif command == C.STOP:
            player.stop()

    # -- wake words ---------------------------------------------------------------------------

    def available_wake_words(self) -> list[str]:
        return list(self._available)

    def wake_words(self) -> list[str]:
        return list(self._wake_words)

    def set_wake_words(self, names: list[str]) -> None:
        chosen = [n for n in names if n in self._available]
        if not chosen or chosen == self._wake_words:
            return
        self._wake_words = chosen
        if self._set_wake_words is not None:
            self._set_wake_words(chosen)

    # -- states (any thread) ---------------------------------------------------------------

    def refresh(self) -> None:
        """The device changed a value itself (MQTT, a restart): tell Home Assistant."""
        for state in self.states():
            self.publish(state)

    def playing(self, playing: bool) -> None:
        if playing != self._playing:
            self._playing = playing
            self.publish(self._media_state())

    def _media_state(self) -> pb.MediaPlayerStateResponse:
        track = "idle" if self.player is None else self.player.state
        if self._playing or track == "playing":
            state = State.PLAYING
        else:
            state = State.PAUSED if track == "paused" else State.IDLE
        return pb.MediaPlayerStateResponse(key=MEDIA_PLAYER, state=state, volume=self.controls.volume(),
                                           muted=self.controls.media_muted())

    def media_changed(self) -> None:
        """The track player's state changed (any thread)."""
        self.publish(self._media_state())
