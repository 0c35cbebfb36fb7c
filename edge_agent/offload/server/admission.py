"""Handshake slots: who may hold an unauthenticated connection, and whom to close when they run out.

A connection that has not proved its key costs the server a socket and a task,
and an attacker can open them for free (a slowloris: connect, then send nothing
or a byte now and then). So they have a budget of their own, apart from the
authenticated connections, and a full budget closes someone. Whom decides
whether an honest device still gets in:

- **Progress first.** A handshake has two stages: *waiting* (accepted, no
  complete HELLO yet: a silent or dribbling peer, or an honest one within its
  first round trip) and *challenged* (HELLO complete, CHALLENGE sent, waiting
  for AUTH). Each stage has its own `limit`. A newcomer enters the waiting
  stage and can only push out a waiting connection, so a connection that sent
  its HELLO is never closed in favour of one that dribbles or is silent.
- **Then share.** The victim comes from the source address holding the most
  connections in that stage: a flood from a few addresses pushes out its own
  connections, not a device that has one.
- **Then age.** Within that source the oldest goes: it has had the longest to
  make progress, and an honest client needs one round trip per stage.
- **A cap per source** (`per_source`, 0 for none): a source already holding
  that many connections in a stage pushes out its own oldest, whatever the
  total. Off where many devices share one address (NAT, a proxy).

Closing is no cure by itself: an attacker opens a closed connection again at
once, so a budget below what it holds turns into a stream of accepts at its
rate. The limit should hold the attack (the server's default, 512, holds the
300 of issue 21 without closing one) and exceed what one accept burst brings
in before anyone's first bytes are read (asyncio accepts up to its backlog,
100, per wake-up). Pure bookkeeping, no I/O: the server closes the connections
it is handed back.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable
from typing import Generic, TypeVar

C = TypeVar("C", bound=Hashable)


def source_of(host: str) -> str:
    """The address a per-source count is kept for: an IPv4 address (also when IPv4-mapped), or an
    IPv6 /64 (one host usually holds a whole /64, so per-address counts would not bind it)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class _Stage(Generic[C]):
    """One stage's connections by source, each source's oldest first (dicts keep insertion order)."""

    def __init__(self) -> None:
        self.by_source: dict[str, dict[C, None]] = {}
        self.size = 0

    def add(self, conn: C, source: str) -> None:
        self.by_source.setdefault(source, {})[conn] = None
        self.size += 1

    def discard(self, conn: C, source: str) -> bool:
        held = self.by_source.get(source)
        if held is None or conn not in held:
            return False
        del held[conn]
        if not held:
            del self.by_source[source]
        self.size -= 1
        return True

    def count(self, source: str) -> int:
        return len(self.by_source.get(source, ()))

    def oldest(self, source: str) -> C:
        return next(iter(self.by_source[source]))

    def largest_source(self, extra: str) -> str:
        """The source holding the most (counting one more for `extra`, the newcomer's)."""
        return max(self.by_source, key=lambda s: len(self.by_source[s]) + (s == extra))


class HandshakeSlots(Generic[C]):
    """Connections in their handshake; `arrive` and `hello` return whom to close to make room."""

    def __init__(self, limit: int, per_source: int = 0) -> None:
        if limit < 1:
            raise ValueError(f"limit {limit} is below 1")
        self.limit = limit
        self.per_source = per_source
        self._waiting: _Stage[C] = _Stage()
        self._challenged: _Stage[C] = _Stage()
        self._where: dict[C, tuple[_Stage[C], str]] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, conn: object) -> bool:
        return conn in self._where

    @property
    def waiting(self) -> int:
        return self._waiting.size

    @property
    def challenged(self) -> int:
        return self._challenged.size

    def arrive(self, conn: C, host: str) -> list[C]:
        """A new connection from `host` enters the waiting stage."""
        return self._enter(self._waiting, conn, source_of(host))

    def hello(self, conn: C) -> list[C]:
        """`conn` sent a complete HELLO: it moves to the challenged stage (nothing if it was closed)."""
        where = self._where.get(conn)
        if where is None or where[0] is not self._waiting:
            return []
        self._waiting.discard(conn, where[1])
        del self._where[conn]
        return self._enter(self._challenged, conn, where[1])

    def leave(self, conn: C) -> None:
        """`conn` authenticated or closed."""
        where = self._where.pop(conn, None)
        if where is not None:
            where[0].discard(conn, where[1])

    def _enter(self, stage: _Stage[C], conn: C, source: str) -> list[C]:
        victims = []
        if self.per_source and stage.count(source) >= self.per_source:
            victims.append(stage.oldest(source))
        elif stage.size >= self.limit:
            victims.append(stage.oldest(stage.largest_source(source)))
        for victim in victims:
            self.leave(victim)
        stage.add(conn, source)
        self._where[conn] = (stage, source)
        return victims
