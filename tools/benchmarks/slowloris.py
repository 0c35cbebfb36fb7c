"""Honest requests to `edge-agent serve` while a slowloris holds hundreds of half-open connections.

The attack is raw sockets on one thread: `count` connections, half of them silent
(connect, then nothing) and half dribbling (a HELLO header one byte at a time,
never finished), each opened again `reopen_s` after the server closes it, so the
attack keeps its count up as a real one does. Its connections come from
`sources` loopback addresses (127.0.0.x), so one machine models many hosts; the
honest device is 127.0.0.1 (an attacker may share it: `--sources 127.0.0.1`).

Interleaved with it, the real offload client makes `requests` honest requests one
after another (connect, key exchange, one sentence, END), each counted served if
its END came within `within_s` of starting to connect; a failure is reported with
its reason. Run as `python -m benchmarks.slowloris` against a `serve` it
starts (Piper voice, default settings plus `--set`), or one already running (`--uri`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import heapq
import json
import os
import selectors
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from edge_agent.config import Endpoint, parse_uri
from edge_agent.errors import TIMEOUTS
from edge_agent.offload.client.connection import ClientConnection
from edge_agent.offload.wire import messages as m

PIPER = "en_US-joe-medium"
SENTENCE = ("The front door is open.",)
_HELLO = m.encode(m.Hello(b"n" * 16, 1, 65536, "slowloris"))


class Slowloris:
    """Half-open connections to `port` on loopback, kept at `count` by a thread until `stop`."""

    def __init__(self, port: int, count: int, sources: list[str], *, dribble_s: float = 0.5,
                 reopen_s: float = 0.05, host: str = "127.0.0.1") -> None:
        self.address = (host, port)
        self.count = count
        self.sources = sources
        self.dribble_s = dribble_s
        self.reopen_s = reopen_s
        self.opened = 0
        self.closed_by_server = 0
        self._sel = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, int]] = []
        """(when, slot, generation): a dribble byte or a reopen due."""
        self._socks: dict[int, socket.socket] = {}
        self._sent: dict[int, int] = {}
        self._generation = [0] * count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowloris", daemon=True)

    def start(self) -> None:
        for slot in range(self.count):
            self._open(slot)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
        self._sel.close()

    def held(self) -> int:
        return len(self._socks)

    def _open(self, slot: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.bind((self.sources[slot % len(self.sources)], 0))
            sock.connect_ex(self.address)
        except OSError:
            sock.close()
            self._later(self.reopen_s, slot)
            return
        self._generation[slot] += 1
        self._socks[slot] = sock
        self._sent[slot] = 0
        self._sel.register(sock, selectors.EVENT_READ, slot)
        self.opened += 1
        if slot % 2:  # the dribbling half
            self._later(self.dribble_s, slot)

    def _later(self, delay: float, slot: int) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, slot, self._generation[slot]))

    def _closed(self, slot: int) -> None:
        sock = self._socks.pop(slot)
        self._sel.unregister(sock)
        sock.close()
        self.closed_by_server += 1
        self._generation[slot] += 1
        self._later(self.reopen_s, slot)

    def _run(self) -> None:
        while not self._stop.is_set():
            timeout = 0.1
            if self._timers:
                timeout = min(timeout, max(0.0, self._timers[0][0] - time.monotonic()))
            for key, _ in self._sel.select(timeout):
                slot = int(key.data)
                try:
                    data = self._socks[slot].recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:  # closed by the server (an ERROR frame first is read and ignored)
                    self._closed(slot)
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, slot, generation = heapq.heappop(self._timers)
                if slot not in self._socks:
                    self._open(slot)
                elif generation == self._generation[slot]:
                    self._dribble(slot)

    def _dribble(self, slot: int) -> None:
        sent = self._sent[slot]
        if sent >= len(_HELLO) - 1:
            return  # the last byte never comes
        try:
            self._socks[slot].send(_HELLO[sent:sent + 1])
        except OSError:
            self._closed(slot)
            return
        self._sent[slot] = sent + 1
        self._later(self.dribble_s, slot)


@dataclass
class Outcome:
    served: int = 0
    failed: collections.Counter[str] = field(default_factory=collections.Counter)
    seconds: list[float] = field(default_factory=list)


async def honest_request(endpoint: Endpoint, psk: bytes | None, voice: str, within_s: float) -> str:
    """One request as a device makes it; '' when served within `within_s`, else why not."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        conn = await ClientConnection.open(endpoint, psk, timeout=within_s)
    except Exception as exc:
        return f"connect: {type(exc).__name__}: {exc}"
    try:
        answers: asyncio.Queue[Any] = asyncio.Queue()
        await conn.request(answers.put_nowait, SENTENCE, voice, m.Codec.PCM16)
        while True:
            left = started + within_s - loop.time()
            answer = await asyncio.wait_for(answers.get(), max(left, 0.001))
            if isinstance(answer, m.End):
                return ""
            if isinstance(answer, m.Error | Exception):
                return f"request: {answer}"
    except TIMEOUTS:
        return f"request: no END within {within_s:g} s"
    finally:
        await conn.close()


async def honest_requests(endpoint: Endpoint, psk: bytes | None, requests: int, *, voice: str = PIPER,
                          within_s: float = 5.0, gap_s: float = 0.2) -> Outcome:
    outcome = Outcome()
    loop = asyncio.get_running_loop()
    for _ in range(requests):
        started = loop.time()
        why = await honest_request(endpoint, psk, voice, within_s)
        outcome.seconds.append(loop.time() - started)
        if why:
            outcome.failed[why[:120]] += 1
        else:
            outcome.served += 1
        await asyncio.sleep(gap_s)  # pacing between requests, not synchronisation
    return outcome


def measure(port: int, psk: bytes | None, *, count: int, sources: list[str], requests: int,
            within_s: float = 5.0, voice: str = PIPER, settle_s: float = 2.0) -> dict[str, Any]:
    """Hold `count` half-open connections, then make `requests` honest ones; the attack stops after."""
    attack = Slowloris(port, count, sources)
    attack.start()
    try:
        time.sleep(settle_s)  # the attack alone first (measurement design, not a wait for an event)
        held = attack.held()
        outcome = asyncio.run(honest_requests(Endpoint("tcp", "127.0.0.1", port), psk, requests,
                                              voice=voice, within_s=within_s))
    finally:
        attack.stop()
    return {"half_open": count, "sources": len(sources), "held_at_start": held,
            "attack_connections": attack.opened, "closed_by_server": attack.closed_by_server,
            "honest": requests, "served_within_s": within_s, "served": outcome.served,
            "failed": dict(outcome.failed),
            "honest_median_s": round(statistics.median(outcome.seconds), 3),
            "honest_max_s": round(max(outcome.seconds), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.slowloris", description=__doc__)
    parser.add_argument("--uri", help="a running server (tcp://127.0.0.1:PORT); default: start one")
    parser.add_argument("--half-open", type=int, default=300)
    parser.add_argument("--sources", default="127.0.0.10-29",
                        help="attacker addresses: A.B.C.X-Y, or a comma list (default 127.0.0.10-29)")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--within", type=float, default=5.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="server setting for the server started here")
    args = parser.parse_args()
    psk_text = os.environ.get("EDGE_OFFLOAD_PSK") or "slowloris-bench-key-0123456789"
    sources = _addresses(args.sources)
    server = None
    if args.uri:
        port = parse_uri(args.uri, ("tcp",)).port
    else:
        from benchmarks.serveproc import ServeProcess

        extra = [x for kv in args.set for x in ("--set", kv)]
        server = ServeProcess(["--set", f"server.voices=[{PIPER}]", *extra], {"EDGE_OFFLOAD_PSK": psk_text})
        port = server.port
    try:
        report = measure(port, psk_text.encode(), count=args.half_open, sources=sources,
                         requests=args.requests, within_s=args.within)
    finally:
        if server is not None:
            server.close()
    print(json.dumps(report))
    return 0


def _addresses(spec: str) -> list[str]:
    if "-" in spec and "," not in spec:
        base, last = spec.rsplit("-", 1)
        prefix, first = base.rsplit(".", 1)
        return [f"{prefix}.{n}" for n in range(int(first), int(last) + 1)]
    return [s.strip() for s in spec.split(",") if s.strip()]


if __name__ == "__main__":
    raise SystemExit(main())
