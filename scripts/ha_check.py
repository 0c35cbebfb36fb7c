"""The real-Home-Assistant check: Home Assistant core drives a running `edge-agent run`.

Run by `scripts/ha-check` with Home Assistant's own Python (its venv has aiohttp); the
device runs from the project's venv (`--edge-agent`). Everything is on loopback: a
private mosquitto, the device, Home Assistant headless. Home Assistant is onboarded
over REST, the integrations are added by their config flows, and each check drives
Home Assistant's API and verifies what the device did (its log, its WAV output, its
transcription of what it played). Prints one line per check and `N passed, M failed`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import math
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

CLIENT_ID = "http://127.0.0.1/"
READY_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until(predicate: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    """The first truthy value of `predicate()`, polled; TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.2)


def tone_wav(path: Path, seconds: float = 0.6, rate: int = 22050) -> None:
    n = int(seconds * rate)
    pcm = b"".join(struct.pack("<h", int(9000 * math.sin(2 * math.pi * 440 * i / rate))) for i in range(n))
    header = (b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate,
              rate * 2, 2, 16) + b"data" + struct.pack("<I", len(pcm)))
    path.write_bytes(header + pcm)


class Files:
    """A directory served over HTTP (media Home Assistant is told to play)."""

    def __init__(self, root: Path) -> None:
        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any) -> None:
                super().__init__(*args, directory=str(root))

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Device:
    """`edge-agent run` with the given config, its log in a file."""

    def __init__(self, edge_agent: str, workdir: Path, config: dict[str, Any]) -> None:
        self.edge_agent = edge_agent
        self.workdir = workdir
        self.config_path = workdir / "device.yaml"
        self.config_path.write_text(json.dumps(config))  # JSON is YAML
        self.log_path = workdir / "device.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = dict(os.environ, XDG_STATE_HOME=str(self.workdir / "state"))
        self.proc = subprocess.Popen([self.edge_agent, "run", "--config", str(self.config_path)],
                                     stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def logged(self, pattern: str, timeout: float = 20.0, after: int = 0) -> re.Match[str]:
        async def found() -> re.Match[str] | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the device exited ({self.proc.returncode}): {self.log()[-400:]}")
            return re.search(pattern, self.log()[after:])
        return await until(found, timeout, f"the device to log /{pattern}/")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Hass:
    """Home Assistant core, headless on loopback, onboarded; REST and websocket helpers."""

    def __init__(self, hass_bin: str, workdir: Path) -> None:
        self.hass_bin = hass_bin
        self.config = workdir / "hass"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "hass.log"
        self.session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ws_id = 0

    def write_config(self) -> None:
        self.config.mkdir(parents=True, exist_ok=True)
        (self.config / "configuration.yaml").write_text(f"""
homeassistant:
  name: edge-speech check
  latitude: 0
  longitude: 0
  elevation: 0
  unit_system: metric
  time_zone: UTC
  country: US
  language: en
  currency: EUR
  internal_url: {self.url}
http:
  server_host: 127.0.0.1
  server_port: {self.port}
api:
onboarding:
websocket_api:
assist_pipeline:
conversation:
intent:
logger:
  default: warning
""")

    async def start(self) -> None:
        self.write_config()
        self.proc = subprocess.Popen([self.hass_bin, "-c", str(self.config), "--skip-pip"],
                                     stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT)
        self.session = self.session or aiohttp.ClientSession()

        async def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"Home Assistant exited ({self.proc.returncode}); see {self.log_path}")
            with contextlib.suppress(aiohttp.ClientError):
                async with self.session.get(f"{self.url}/api/onboarding") as r:  # type: ignore[union-attr]
                    return r.status == 200
            return False

        await until(ready, READY_S, "Home Assistant's HTTP API")

    async def onboard(self) -> None:
        assert self.session is not None
        async with self.session.post(f"{self.url}/api/onboarding/users", json={
                "client_id": CLIENT_ID, "name": "Check", "username": "check", "password": "check-password",
                "language": "en"}) as r:
            r.raise_for_status()
            code = (await r.json())["auth_code"]
        async with self.session.post(f"{self.url}/auth/token", data={
                "grant_type": "authorization_code", "code": code, "client_id": CLIENT_ID}) as r:
            r.raise_for_status()
            self.token = (await r.json())["access_token"]
        long_lived = await self.ws("auth/long_lived_access_token", client_name="ha-check", lifespan=1)
        self.token = long_lived

    async def login(self) -> None:
        """After a restart: the long-lived token still works; only the websocket is new."""
        self._ws = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def rest(self, method: str, path: str, body: Any = None, *, timeout: float = 60,
                   headers: dict[str, str] | None = None, data: bytes | None = None) -> tuple[int, Any]:
        assert self.session is not None
        async with self.session.request(method, f"{self.url}{path}", json=body, data=data,
                                        headers={**self.headers, **(headers or {})},
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            text = await r.read()
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text

    async def ws(self, kind: str, **fields: Any) -> Any:
        assert self.session is not None
        if self._ws is None or self._ws.closed:
            self._ws = await self.session.ws_connect(f"{self.url}/api/websocket")
            await self._ws.receive_json()
            await self._ws.send_json({"type": "auth", "access_token": self.token})
            reply = await self._ws.receive_json()
            if reply.get("type") != "auth_ok":
                raise RuntimeError(f"websocket auth: {reply}")
        self._ws_id += 1
        await self._ws.send_json({"id": self._ws_id, "type": kind, **fields})
        while True:
            reply = await asyncio.wait_for(self._ws.receive_json(), 60)
            if reply.get("id") == self._ws_id and reply.get("type") == "result":
                if not reply.get("success"):
                    raise RuntimeError(f"{kind}: {reply.get('error')}")
                return reply.get("result")

    async def flow(self, handler: str, answers: dict[str, Any]) -> dict[str, Any]:
        """A config flow from the start, answering its form with `answers`."""
        status, step = await self.rest("POST", "/api/config/config_entries/flow",
                                       {"handler": handler, "show_advanced_options": False})
        if status != 200:
            raise RuntimeError(f"{handler} flow: HTTP {status} {step}")
        while step.get("type") == "form":
            status, step = await self.rest("POST", f"/api/config/config_entries/flow/{step['flow_id']}", answers)
            if status != 200:
                raise RuntimeError(f"{handler} flow: HTTP {status} {step}")
            if step.get("errors"):
                raise RuntimeError(f"{handler} flow: {step['errors']}")
        if step.get("type") != "create_entry":
            raise RuntimeError(f"{handler} flow ended with {step.get('type')}: {step.get('reason')}")
        return step

    async def states(self) -> list[dict[str, Any]]:
        _, states = await self.rest("GET", "/api/states")
        return list(states)

    async def entity(self, pattern: str, timeout: float = 30.0) -> dict[str, Any]:
        async def find() -> dict[str, Any] | None:
            return next((s for s in await self.states() if re.fullmatch(pattern, s["entity_id"])), None)
        return dict(await until(find, timeout, f"an entity {pattern}"))

    async def call(self, domain: str, service: str, data: dict[str, Any], timeout: float = 60) -> Any:
        status, body = await self.rest("POST", f"/api/services/{domain}/{service}", data, timeout=timeout)
        if status != 200:
            raise RuntimeError(f"{domain}.{service}: HTTP {status} {body}")
        return body

    async def stop(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    async def close(self) -> None:
        await self.stop()
        if self.session is not None:
            await self.session.close()


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.workdir)
        self.results: list[tuple[str, bool, float, str]] = []
        self.files = Files(self.work / "media")
        self.esphome_port = free_port()
        self.device = Device(args.edge_agent, self.work, {
            "device": {"id": "kitchen"},
            "mqtt": {"broker": args.broker},
            "daemon": {"out_dir": str(self.work / "out")},
            "announcements": {"state_dir": str(self.work / "announcements")},
            "audio": {"output": "null"},
            "listen": {"mode": "off"},
            "esphome": {"enabled": True, "host": "127.0.0.1", "port": self.esphome_port, "zeroconf": False},
        })
        self.hass = Hass(args.hass, self.work)

    async def check(self, name: str, body: Callable[[], Awaitable[str | None]]) -> None:
        start = time.monotonic()
        try:
            detail = await body() or ""
            ok = True
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            if self.args.verbose:
                traceback.print_exc()
            ok = False
        took = time.monotonic() - start
        self.results.append((name, ok, took, detail))
        print(f"{'PASS' if ok else 'FAIL'} {name} ({took:.1f} s){': ' + detail if detail else ''}", flush=True)

    def played(self, prefix: str) -> list[Path]:
        return sorted((self.work / "out").glob(f"{prefix}*.wav"))

    # -- the checks -----------------------------------------------------------------------

    async def esphome_added(self) -> str:
        entry = await self.hass.flow("esphome", {"host": "127.0.0.1", "port": self.esphome_port})
        satellite = await self.hass.entity(r"assist_satellite\..*kitchen.*")
        await self.hass.entity(r"media_player\..*kitchen.*")
        await self.hass.entity(r"switch\..*kitchen.*mute.*")
        return f"entry {entry['title']!r}, {satellite['entity_id']} {satellite['state']}"

    async def esphome_announce(self) -> str:
        satellite = await self.hass.entity(r"assist_satellite\..*kitchen.*")
        tone_wav(self.work / "media" / "notice.wav")
        before = len(self.played("esphome-announce-"))
        start = time.monotonic()
        await self.hass.call("assist_satellite", "announce", {
            "entity_id": satellite["entity_id"], "media_id": self.files.url("notice.wav"), "preannounce": False})
        took = time.monotonic() - start
        after = self.played("esphome-announce-")
        if len(after) != before + 1:
            raise AssertionError(f"{len(after) - before} announcements written, not 1")
        return f"played and finished in {took:.2f} s"

    async def esphome_volume_and_mute(self) -> str:
        player = await self.hass.entity(r"media_player\..*kitchen.*")
        mute = await self.hass.entity(r"switch\..*kitchen.*mute.*")
        mark = len(self.device.log())
        await self.hass.call("media_player", "volume_set", {"entity_id": player["entity_id"],
                                                           "volume_level": 0.35})
        await self.device.logged(r"volume set to 0\.35", after=mark)
        await self.hass.call("switch", "turn_on", {"entity_id": mute["entity_id"]})
        await self.device.logged(r"microphone muted", after=mark)

        async def shown_on() -> bool:
            return bool((await self.hass.entity(re.escape(mute["entity_id"])))["state"] == "on")

        await until(shown_on, 10, "the mute switch to show on")
        await self.hass.call("switch", "turn_off", {"entity_id": mute["entity_id"]})
        await self.device.logged(r"microphone unmuted", after=mark)
        return ""

    async def run(self) -> int:
        (self.work / "media").mkdir(parents=True, exist_ok=True)
        try:
            self.device.start()
            await self.device.logged(r"esphome: API on", timeout=READY_S)
            await self.hass.start()
            await self.hass.onboard()
            await self.check("esphome: added by its config flow, with its entities", self.esphome_added)
            await self.check("esphome: assist_satellite.announce is played and finished", self.esphome_announce)
            await self.check("esphome: volume and mute from Home Assistant reach the device",
                             self.esphome_volume_and_mute)
        finally:
            await self.hass.close()
            self.device.stop()
            self.files.close()
        passed = sum(1 for r in self.results if r[1])
        failed = len(self.results) - passed
        if failed:
            print(f"logs: {self.hass.log_path} {self.device.log_path}", flush=True)
        print(f"{passed} passed, {failed} failed", flush=True)
        return 1 if failed or not self.results else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hass", required=True, help="Home Assistant's `hass` program (its venv)")
    parser.add_argument("--edge-agent", required=True, help="the project's `edge-agent` program")
    parser.add_argument("--broker", required=True, help="mqtt://HOST:PORT of a private mosquitto")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if not shutil.which(args.edge_agent) and not Path(args.edge_agent).exists():
        print(f"ha-check: {args.edge_agent}: not found", file=sys.stderr)
        return 2
    return asyncio.run(Check(args).run())


if __name__ == "__main__":
    sys.exit(main())
