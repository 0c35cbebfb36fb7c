"""Reading Wyoming events with limits and deadlines; writing them with the library.

A Wyoming event is a JSON header line, then `data_length` bytes of JSON, then
`payload_length` bytes of payload. The `wyoming` library's reader trusts both
lengths and has no deadline, and answers a malformed header with None, which a
caller cannot tell from a disconnect. `EventReader` checks every length against
`Limits` before reading what it announces, gives a silent peer `idle_timeout_s`
to start an event and a started one `event_timeout_s` to finish it, and raises a
`FramingError` saying what was wrong. Writing is the library's own code, bounded
by a deadline so a peer that stops reading cannot hold a connection forever.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from wyoming.event import Event, async_write_event

from edge_agent.errors import TIMEOUTS, EdgeError
from edge_agent.wyoming.settings import WyomingSettings


class FramingError(EdgeError):
    """A peer broke the framing (too large, malformed, too slow); the connection is closed."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code
        """Short machine-readable reason, sent as the `error` event's code."""


@dataclass(frozen=True)
class Limits:
    """What one event may cost the server."""

    header_bytes: int = WyomingSettings.max_header_bytes
    data_bytes: int = WyomingSettings.max_data_bytes
    payload_bytes: int = WyomingSettings.max_payload_bytes
    idle_timeout_s: float = WyomingSettings.idle_timeout_s
    """Longest wait for the first byte of the next event."""
    event_timeout_s: float = WyomingSettings.event_timeout_s
    """Longest time from an event's first byte to its last (and for one write)."""

    @staticmethod
    def from_settings(s: WyomingSettings) -> Limits:
        return Limits(s.max_header_bytes, s.max_data_bytes, s.max_payload_bytes, s.idle_timeout_s,
                      s.event_timeout_s)


class EventReader:
    """Whole events from a stream, or a `FramingError`; None at a clean end of stream."""

    def __init__(self, reader: asyncio.StreamReader, limits: Limits) -> None:
        self._reader = reader
        self.limits = limits

    async def read(self) -> Event | None:
        """The next event; None when the peer closed between events."""
        limits = self.limits
        try:
            first = await asyncio.wait_for(self._reader.read(1), limits.idle_timeout_s)
        except TIMEOUTS:
            raise FramingError(f"no event for {limits.idle_timeout_s:g} s", "idle-timeout") from None
        if not first:
            return None
        try:
            return await asyncio.wait_for(self._rest(first), limits.event_timeout_s)
        except TIMEOUTS:
            raise FramingError(f"event not complete within {limits.event_timeout_s:g} s",
                               "event-timeout") from None

    async def _rest(self, first: bytes) -> Event:
        limits = self.limits
        line = first
        if first != b"\n":
            line += await self._header_line()
        header = _json_object(line, "header")
        event_type = header.get("type")
        if not isinstance(event_type, str) or not event_type:
            raise FramingError("header has no 'type' (a non-empty string)", "bad-header")
        data = header.get("data") or {}
        if not isinstance(data, dict):
            raise FramingError("header 'data' must be an object", "bad-header")
        data_length = _length(header, "data_length", limits.data_bytes)
        payload_length = _length(header, "payload_length", limits.payload_bytes)
        if data_length:
            data = {**data, **_json_object(await self._exactly(data_length), "data")}
        payload = await self._exactly(payload_length) if payload_length else None
        return Event(type=event_type, data=data, payload=payload)

    async def _header_line(self) -> bytes:
        # The stream's own limit (`limit=` of `asyncio.start_server`) caps the line.
        try:
            return await self._reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise FramingError(f"header line longer than {self.limits.header_bytes} bytes",
                               "header-too-large") from None
        except asyncio.IncompleteReadError:
            raise FramingError("connection closed inside an event header", "truncated") from None

    async def _exactly(self, n: int) -> bytes:
        try:
            return await self._reader.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise FramingError(f"connection closed after {len(exc.partial)} of {n} announced bytes",
                               "truncated") from None


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise FramingError(f"event {what} is not JSON ({type(exc).__name__})", "bad-json") from None
    except ValueError:
        # Valid JSON Python will not read: an integer of more than sys.get_int_max_str_digits()
        # (4300) digits, which a header line of a few kilobytes can hold.
        raise FramingError(f"event {what} has a number too long to read", "bad-json") from None
    if not isinstance(doc, dict):
        raise FramingError(f"event {what} must be a JSON object", "bad-json")
    return doc


def _length(header: dict[str, Any], key: str, limit: int) -> int:
    value = header.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FramingError(f"'{key}' must be a non-negative integer", "bad-header")
    if value > limit:
        raise FramingError(f"'{key}' {value} is over the limit of {limit} bytes", "too-large")
    return value


async def write_event(writer: asyncio.StreamWriter, event: Event, timeout: float) -> None:
    """Send one event; a peer that does not take it within `timeout` gets a `FramingError`."""
    try:
        await asyncio.wait_for(async_write_event(event, writer), timeout)
    except TIMEOUTS:
        raise FramingError(f"peer took no data for {timeout:g} s", "write-timeout") from None
