"""Home Assistant connecting to the ESPHome API while eight abusers hold the other connections.

The device is `edge-agent run` in a child process (ESPHome API on, listening off, WAV
files as the speaker, no reachable broker). Eight abusers connect first and keep
their count up (one closed by the device is opened again 50 ms later, as a real
attack does), in one of two states:

- `silent`: connect, then send nothing;
- `hello-ping`: connect, say `HelloRequest`, then only `PingRequest`, once a second,
  reading every answer (what an idle client costs the device);
- `flood` (not in the default run): a thread opening silent connections as fast as it
  can from `--flood-source`, holding its newest 300, so connections before Hello churn
  through their budget while Home Assistant's wait for their Hello.

Then Home Assistant's client (aioesphomeapi's `APIClient`) connects `attempts`
times, one after another, as Home Assistant does: connect and log in, subscribe to
states, ask for the device info. An attempt counts as in if the device info came
back within `within_s` of starting to connect, and kept if the connection was still
up `hold_s` later (not displaced by an abuser coming back). Run as
`python -m benchmarks.esphome_lockout [--json]`; with `--json` the last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.loopback import stop_process
from benchmarks.report import emit, machine, median

STATES = ("silent", "hello-ping")
FLOOD_HELD = 300
READY_S = 120.0
REOPEN_S = 0.05
PING_S = 1.0


def _frame(kind: int, payload: bytes = b"") -> bytes:
    """One plain-text frame (ESPHome's lengths and types fit one varint byte here)."""
    return bytes((0, len(payload), kind)) + payload


HELLO = _frame(1, b"\x0a\x05abuse")  # HelloRequest {client_info: "abuse"}
PING = _frame(7)


class Abuser:
    """One abusive connection, opened again whenever the device closes it, until `stop`."""

    def __init__(self, port: int, state: str) -> None:
        self.port = port
        self.state = state
        self.opened = 0
        self.greeted = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                self.opened += 1
                try:
                    await self._hold(reader, writer)
                finally:
                    writer.transport.abort()
            await asyncio.sleep(REOPEN_S)  # the attack's own pace, not a synchronisation

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.state == "silent":
            self.greeted.set()
            await reader.read()  # returns when the device closes the connection
            return
        writer.write(HELLO)
        got = await reader.read(256)
        if not got:
            return
        self.greeted.set()
        while True:
            writer.write(PING)
            try:
                got = await asyncio.wait_for(reader.read(4096), PING_S)
            except TimeoutError:
                continue
            if not got:
                return
            if b"\x00\x00\x08" not in got:  # not a PingResponse: a DisconnectRequest, say
                return
            await asyncio.sleep(PING_S)  # the attack's ping period


async def _attempt(port: int, within_s: float, hold_s: float) -> dict[str, Any]:
    from aioesphomeapi.client import APIClient

    client = APIClient("127.0.0.1", port, password=None, client_info="Home Assistant bench")
    started = time.perf_counter()
    result: dict[str, Any] = {"in": False, "kept": False}

    async def connect() -> None:
        await client.connect(login=True)
        client.subscribe_states(lambda state: None)
        await client.device_info()

    try:
        await asyncio.wait_for(connect(), within_s)
        result["s"] = time.perf_counter() - started
        result["in"] = True
        await asyncio.sleep(hold_s)  # the span over which the connection must survive
        await asyncio.wait_for(client.device_info(), within_s)
        result["kept"] = True
    except Exception as exc:  # a refusal, a reset, a timeout: the attempt failed, say why
        result["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.disconnect(), 5)
    return result


class Flood(threading.Thread):
    """Silent connections from `source`, opened as fast as one thread can, the newest kept open."""

    def __init__(self, port: int, source: str) -> None:
        super().__init__(daemon=True, name="flood")
        self.port = port
        self.source = source
        self.opened = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        held: collections.deque[socket.socket] = collections.deque()
        while not self.stopping.is_set():
            try:
                held.append(socket.create_connection(("127.0.0.1", self.port), timeout=2,
                                                     source_address=(self.source, 0)))
            except OSError:
                continue
            self.opened += 1
            if len(held) > FLOOD_HELD:
                held.popleft().close()
        for sock in held:
            sock.close()


async def attack(port: int, state: str, *, abusers: int, attempts: int, within_s: float,
                 hold_s: float, flood_source: str = "127.0.0.1") -> dict[str, Any]:
    """`attempts` Home Assistant connections while `abusers` in `state` hold the device."""
    crowd = [Abuser(port, state) for _ in range(abusers if state != "flood" else 0)]
    flood = Flood(port, flood_source) if state == "flood" else None
    try:
        if flood is not None:
            flood.start()
            await asyncio.sleep(1.0)  # the flood under way before Home Assistant comes
        await asyncio.wait_for(asyncio.gather(*(a.greeted.wait() for a in crowd)), 30)
        runs = [await _attempt(port, within_s, hold_s) for _ in range(attempts)]
    finally:
        for abuser in crowd:
            await abuser.stop()
        if flood is not None:
            flood.stopping.set()
            await asyncio.to_thread(flood.join, 10)
    times = [r["s"] for r in runs if r["in"]]
    errors: dict[str, int] = {}
    for r in runs:
        if "error" in r:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    return {"attempts": attempts, "in": len(times), "kept": sum(r["kept"] for r in runs),
            "connect_s_median": median(times) if times else None, "connect_s_max": max(times, default=None),
            "abuser_connections": sum(a.opened for a in crowd) + (flood.opened if flood else 0),
            "errors": errors}


class Device:
    """`edge-agent run` with the ESPHome API on, in a child process."""

    def __init__(self, work: Path, sets: list[str] | None = None) -> None:
        work.mkdir(parents=True)
        config = {
            "device": {"id": "lockout"}, "mqtt": {"broker": "mqtt://127.0.0.1:9"},
            "daemon": {"state_dir": str(work / "daemon"), "out_dir": str(work / "out")},
            "announcements": {"state_dir": str(work / "announcements")},
            "listen": {"mode": "off"},
            "esphome": {"enabled": True, "host": "127.0.0.1", "port": 0, "zeroconf": False},
        }
        (work / "config.yaml").write_text(json.dumps(config))
        self.log = work / "device.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edge_agent", "run", "--config", str(work / "config.yaml"),
             *(arg for kv in sets or () for arg in ("--set", kv))],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
            env=dict(os.environ, XDG_STATE_HOME=str(work / "state")))
        self.port = self._port()

    def _port(self) -> int:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the device exited: {self.log.read_text()[-500:]}")
            found = re.search(r"esphome: API on \S+ port (\d+)", self.log.read_text(errors="replace"))
            if found:
                return int(found.group(1))
            time.sleep(0.1)  # polling a log file: nothing to wait on
        raise RuntimeError(f"the device did not open the ESPHome API within {READY_S:g} s")

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log.read_text(errors="replace")))

    def stop(self) -> None:
        stop_process(self.proc)


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.3f} s"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.esphome_lockout", description=__doc__)
    parser.add_argument("--abusers", type=int, default=8)
    parser.add_argument("--attempts", type=int, default=20)
    parser.add_argument("--within", type=float, default=2.0, help="seconds an attempt may take (default 2)")
    parser.add_argument("--hold", type=float, default=1.0,
                        help="seconds a connection must survive (default 1)")
    parser.add_argument("--states", default=",".join(STATES),
                        help=f"comma list of {', '.join(STATES)}, flood (default: the first two)")
    parser.add_argument("--flood-source", default="127.0.0.1",
                        help="the flood's address (127.0.0.2: another host than Home Assistant's)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the device started here, e.g. esphome.max_handshakes=64")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result: dict[str, Any] = {"machine": machine(), "load": os.getloadavg()}
    lines = []
    with tempfile.TemporaryDirectory(prefix="edge-bench-lockout-") as tmp:
        for state in args.states.split(","):
            device = Device(Path(tmp) / state, args.set)
            try:
                found = asyncio.run(attack(device.port, state, abusers=args.abusers, attempts=args.attempts,
                                           within_s=args.within, hold_s=args.hold,
                                           flood_source=args.flood_source))
                found["displaced_logged"] = device.count(r"displaced")
            finally:
                device.stop()
            result[state] = found
            who = (f"a {state} from {args.flood_source}" if state == "flood"
                   else f"{args.abusers} {state} abusers")
            lines.append(f"{who}: Home Assistant in "
                         f"{found['in']}/{found['attempts']} "
                         f"within {args.within:g} s (median {_s(found['connect_s_median'])}, max "
                         f"{_s(found['connect_s_max'])}), kept {found['kept']} for {args.hold:g} s; "
                         f"errors {found['errors']}")
    emit(result, lines, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
