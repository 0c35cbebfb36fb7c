"""What a Sendspin server streams, taken onto the playout within bounds.

Each stream (and each change of format within one) gets a timeline of its own. A format that
cannot be decoded is refused: one log line, `unsupported format` in the status, and its chunks
dropped without a word until the next stream. A chunk further ahead of the output than
`sendspin.max_ahead_s`, or beyond `sendspin.max_buffer_s` of buffer, is dropped and counted (the
log says so at the 1st, 100th and 10,000th).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from edge_agent.sendspin.playout import Playout, Stream
from edge_agent.sendspin.settings import SendspinSettings
from edge_agent.sendspin.timeline import StreamFormat, Timeline, UnsupportedFormat

# A child of the player's logger, whose part this was: its level and filters cover this too.
log = logging.getLogger("edge_agent.sendspin.player.intake")

Clock = Callable[[int], int]
"""One of the protocol client's clock conversions (µs to µs)."""
StateChange = Callable[[str, str | None], None]
"""Told the player's new state and error."""


class Intake:
    """The streams of the server that holds the player; called on the player's loop."""

    def __init__(self, settings: SendspinSettings, playout: Playout, set_state: StateChange) -> None:
        self.settings = settings
        self.playout = playout
        self.set_state = set_state
        self.streams = 0
        """Streams begun (each change of format counts as one): the next one's id."""
        self.server: str | None = None
        """The name of the server that streams (for the logs and the status)."""
        self._refused: StreamFormat | None = None
        """The format of the stream refused last: its chunks are dropped without a word."""

    def begin(self, fmt: StreamFormat, to_server: Clock, to_local: Clock) -> Stream | None:
        """A new stream in `fmt` (or the same stream in a new format): its own timeline; None when
        `fmt` is refused."""
        self.streams += 1
        stream_id = str(self.streams)
        try:
            fmt.check()
        except UnsupportedFormat as exc:
            self._refused = fmt
            self.set_state("unsupported format", f"stream {stream_id}: {exc}")
            log.error("sendspin: the server sent a stream we cannot play: %s; it is ignored until "
                      "the next stream", exc, extra={"stream": stream_id})
            self.playout.set_stream(None)
            return None
        self._refused = None
        max_samples = round(self.settings.max_buffer_s * fmt.rate)
        stream = Stream(stream_id, fmt, Timeline(fmt.rate, max_samples), to_server=to_server,
                        to_local=to_local)
        log.info("sendspin: stream %s from %s: %s %d Hz, %d ch, %d bit", stream_id, self.server,
                 fmt.codec, fmt.rate, fmt.channels, fmt.bit_depth, extra={"stream": stream_id})
        self.playout.set_stream(stream)
        self.set_state("connected", None)
        return stream

    def chunk(self, server_us: int, payload: bytes, arrived: StreamFormat, to_server: Clock,
              to_local: Clock) -> None:
        """A chunk in format `arrived` that plays at `server_us` (the server's clock)."""
        stream = self.playout.stream
        if arrived == self._refused:
            return  # a stream we cannot play: dropped, said once
        if stream is None or arrived != stream.format:  # a format change mid-stream starts afresh
            stream = self.begin(arrived, to_server, to_local)
            if stream is None:
                return
        samples = stream.format.decode(payload)
        max_ahead = round(self.settings.max_ahead_s * stream.format.rate)
        with self.playout.lock:
            if self.playout.stream is not stream:
                return
            outcome = stream.timeline.push(server_us, samples, stream.cursor, max_ahead)
            stream.last_chunk_us = self.playout.clock_us()
            self.playout.wake()
        stats = stream.timeline.stats
        if outcome == "ahead" and stats.ahead in (1, 100, 10000):
            log.warning("sendspin: chunk %.1f s ahead of the output refused (%d so far): the server's "
                        "clock jumped?", (stream.timeline.index(server_us) - (stream.cursor or 0))
                        / stream.format.rate, stats.ahead, extra={"stream": stream.id})
        elif outcome == "overflow" and stats.overflow in (1, 100, 10000):
            log.warning("sendspin: buffer full (%.1f s); chunk dropped (%d so far)",
                        self.settings.max_buffer_s, stats.overflow, extra={"stream": stream.id})

    def end(self) -> None:
        """The server ended the stream: the output closes, the server still holds the player."""
        stream = self.playout.stream
        if stream is not None:
            stats = stream.timeline.stats
            log.info("sendspin: stream %s ended (%d chunks, %d late, %d refused, %d dropped)", stream.id,
                     stats.chunks, stats.late, stats.ahead, stats.overflow, extra={"stream": stream.id})
        self._refused = None
        self.playout.set_stream(None)
        self.set_state("connected", None)

    def clear(self) -> None:
        """The server cleared the stream's buffer (a seek, a skip): what is queued is dropped."""
        stream = self.playout.stream
        if stream is not None:
            with self.playout.lock:
                stream.timeline.clear()

    def disconnected(self) -> None:
        """The server went away: the music stops, the device carries on."""
        if self.playout.stream is not None:
            log.warning("sendspin: the server disconnected during a stream; the music stops, the device "
                        "carries on", extra={"stream": self.playout.stream.id})
        self._refused = None
        self.playout.set_stream(None)
        self.set_state("idle", None)
