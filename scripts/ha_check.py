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
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import traceback
import wave
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

# The loopback microphone and file server, shared with `bench esphome` (standard library only;
# this script runs in Home Assistant's venv, where the project is not installed).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from benchmarks.loopback import FifoMicrophone, FileServer, stop_process

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
        if self.proc is not None:
            stop_process(self.proc)


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
            path = f"/api/config/config_entries/flow/{step['flow_id']}"
            status, step = await self.rest("POST", path, answers)
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

    async def entity(self, platform: str, domain: str, unique: str = "", timeout: float = 60.0) -> str:
        """The entity id of `platform`'s (the integration's) `domain` entity whose unique id contains
        `unique`, once it has a state."""
        async def find() -> str | None:
            entries = await self.ws("config/entity_registry/list")
            states = {s["entity_id"] for s in await self.states()}
            for entry in entries:
                entity_id = entry["entity_id"]
                if (entry.get("platform") == platform and entity_id.startswith(f"{domain}.")
                        and unique in (entry.get("unique_id") or "") and entity_id in states):
                    return str(entity_id)
            return None
        return str(await until(find, timeout, f"a {platform} {domain} entity ({unique or 'any'})"))

    async def call(self, domain: str, service: str, data: dict[str, Any], timeout: float = 60) -> Any:
        status, body = await self.rest("POST", f"/api/services/{domain}/{service}", data, timeout=timeout)
        if status != 200:
            raise RuntimeError(f"{domain}.{service}: HTTP {status} {body}")
        return body

    async def stop(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self.proc is not None:
            stop_process(self.proc, grace_s=60)

    async def close(self) -> None:
        await self.stop()
        if self.session is not None:
            await self.session.close()


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.lower()))


def wav_frames(path: Path) -> tuple[bytes, int]:
    with wave.open(str(path), "rb") as w:
        return w.readframes(w.getnframes()), w.getframerate()


class Check:
    """The checks, in order; each records PASS or FAIL and the run goes on."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.workdir)
        self.results: list[tuple[str, bool, float, str]] = []
        (self.work / "media").mkdir(parents=True, exist_ok=True)
        self.files = FileServer(self.work / "media")
        self.ports = {name: free_port() for name in ("satellite", "services", "esphome")}
        self.fifo = self.work / "mic.pcm"
        os.mkfifo(self.fifo, 0o600)
        host, port = args.broker.removeprefix("mqtt://").rsplit(":", 1)
        self.broker = (host, int(port))
        self.device = Device(args.edge_agent, self.work, {
            "device": {"id": "kitchen"},
            "mqtt": {"broker": args.broker, "ha_discovery": True},
            "daemon": {"out_dir": str(self.work / "out"), "state_dir": str(self.work / "daemon")},
            "announcements": {"state_dir": str(self.work / "announcements")},
            "audio": {"output": "null", "input_pipe": str(self.fifo), "input_rate": 22050},
            "asr": {"model": args.whisper},
            # The voice's noise off: every run speaks the same samples, so what Whisper hears of
            # them (the checks transcribe what the device said) is the same every run.
            "tts": {"noise_scale": 0, "noise_w": 0},
            "listen": {"mode": "wake"},
            "wyoming": {"enabled": True, "uri": f"tcp://127.0.0.1:{self.ports['satellite']}",
                        "services_uri": f"tcp://127.0.0.1:{self.ports['services']}", "zeroconf": False},
            "esphome": {"enabled": True, "host": "127.0.0.1", "port": self.ports["esphome"],
                        "zeroconf": False},
        })
        self.mic = FifoMicrophone(self.fifo, 22050)
        self.hass = Hass(args.hass, self.work)
        self.clips: dict[str, Path] = {}
        self.status: dict[str, Any] = {}

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
        said = f": {detail}" if detail else ""
        print(f"{'PASS' if ok else 'FAIL'} {name} ({took:.1f} s){said}", flush=True)

    # -- helpers ----------------------------------------------------------------------------

    def played(self, prefix: str) -> list[Path]:
        return sorted((self.work / "out").glob(f"{prefix}*.wav"))

    async def new_wav(self, prefix: str, before: int, timeout: float = 60.0) -> Path:
        async def arrived() -> Path | None:
            found = self.played(prefix)
            return found[-1] if len(found) > before else None
        return Path(await until(arrived, timeout, f"a new {prefix}*.wav from the device"))

    def edge(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run([self.args.edge_agent, *args], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, XDG_STATE_HOME=str(self.work / "cli-state")), check=False)
        if done.returncode != 0:
            raise RuntimeError(f"edge-agent {args[0]}: {done.stderr.strip()[-300:]}")
        return done.stdout

    async def heard(self, path: Path) -> str:
        out = await asyncio.to_thread(self.edge, "transcribe", str(path), "--json", "--set",
                                      f"asr.model={self.args.whisper}")
        return " ".join(json.loads(line)["text"] for line in out.splitlines() if line.strip()).strip()

    async def clip(self, text: str) -> Path:
        """`text` in the device's own voice (noise off: the same samples every run)."""
        if text not in self.clips:
            path = self.work / "media" / f"clip-{len(self.clips)}.wav"
            await asyncio.to_thread(self.edge, "say", text, "--local", "--out", str(path), "--set",
                                    "tts.noise_scale=0", "--set", "tts.noise_w=0")
            self.clips[text] = path
        return self.clips[text]

    async def say_to_device(self, text: str) -> None:
        pcm, rate = wav_frames(await self.clip(text))
        assert rate == 22050, rate
        self.mic.say(bytes(int(0.3 * rate) * 2) + pcm)

    def watch_status(self) -> None:
        import paho.mqtt.client as mqtt

        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="ha-check-watch")

        def on_message(_c: Any, _u: Any, msg: Any) -> None:
            with contextlib.suppress(ValueError):
                self.status = json.loads(msg.payload)

        client.on_message = on_message
        client.on_connect = lambda c, *_: c.subscribe("edge/kitchen/status", qos=1)
        client.connect(*self.broker)
        client.loop_start()
        self._watch = client

    async def words_of(self, path: Path, *expected: str) -> str:
        text = await self.heard(path)
        low = text.lower()
        missing = [w for w in expected if w not in low]
        if missing:
            raise AssertionError(f"heard {text!r}, missing {missing}")
        return text

    # -- Wyoming and MQTT ---------------------------------------------------------------------

    async def integrations_added(self) -> str:
        titles = []
        for name in ("satellite", "services"):
            entry = await self.hass.flow("wyoming", {"host": "127.0.0.1", "port": self.ports[name]})
            titles.append(entry["title"])
        host, port = self.broker
        await self.hass.flow("mqtt", {"broker": host, "port": port})
        entities = [await self.hass.entity(*which) for which in (
            ("wyoming", "assist_satellite"), ("wyoming", "tts"), ("wyoming", "stt"), ("wyoming", "wake_word"),
            ("mqtt", "notify"), ("mqtt", "number", "volume"), ("mqtt", "switch", "mic"))]
        return f"wyoming {titles}, mqtt; " + ", ".join(entities)

    async def pipeline(self) -> str:
        tts = await self.hass.entity("wyoming", "tts")
        stt = await self.hass.entity("wyoming", "stt")
        created = await self.hass.ws(
            "assist_pipeline/pipeline/create", conversation_engine="conversation.home_assistant",
            conversation_language="en", language="en", name="edge-speech", stt_engine=stt,
            stt_language="en", tts_engine=tts, tts_language="en_US", tts_voice=None,
            wake_word_entity=None, wake_word_id=None)
        await self.hass.ws("assist_pipeline/pipeline/set_preferred", pipeline_id=created["id"])
        return f"{stt} -> conversation -> {tts}"

    async def tts_and_stt(self) -> str:
        tts = await self.hass.entity("wyoming", "tts")
        status, got = await self.hass.rest("POST", "/api/tts_get_url", {
            "engine_id": tts, "message": "The kitchen lights are on.", "language": "en_US"})
        if status != 200:
            raise AssertionError(f"tts_get_url: HTTP {status} {got}")
        assert self.hass.session is not None
        async with self.hass.session.get(got["url"], headers=self.hass.headers) as r:
            r.raise_for_status()
            (self.work / "tts.audio").write_bytes(await r.read())
        await asyncio.to_thread(subprocess.run, ["ffmpeg", "-loglevel", "error", "-y", "-i",
                                str(self.work / "tts.audio"), str(self.work / "tts.wav")], check=True)
        spoken = await self.words_of(self.work / "tts.wav", "kitchen lights")
        clip16 = self.work / "command16.wav"
        command = await self.clip("Turn on the kitchen lights.")
        await asyncio.to_thread(subprocess.run, ["ffmpeg", "-loglevel", "error", "-y", "-i", str(command),
                                                 "-ar", "16000", "-ac", "1", str(clip16)], check=True)
        stt = await self.hass.entity("wyoming", "stt")
        status, body = await self.hass.rest(
            "POST", f"/api/stt/{stt}", data=clip16.read_bytes(), headers={
                "X-Speech-Content": "format=wav; codec=pcm; sample_rate=16000; bit_rate=16; channel=1; "
                                    "language=en"})
        if status != 200 or body.get("result") != "success" or "kitchen lights" not in body["text"].lower():
            raise AssertionError(f"stt: HTTP {status} {body}")
        return f"TTS heard as {spoken!r}; STT {body['text']!r}"

    async def unknown_voice(self) -> str:
        tts = await self.hass.entity("wyoming", "tts")
        start = time.monotonic()
        status, got = await self.hass.rest("POST", "/api/tts_get_url", {
            "engine_id": tts, "message": "Hello there.", "language": "en_US",
            "options": {"voice": "no-such-voice"}}, timeout=30)
        if status == 200:
            assert self.hass.session is not None
            async with self.hass.session.get(got["url"], headers=self.hass.headers) as r:
                status = r.status
        took = time.monotonic() - start
        if status < 400 or took >= 2.0:
            raise AssertionError(f"HTTP {status} after {took:.2f} s (want a failure in < 2 s)")
        return f"HTTP {status} in {took:.2f} s"

    async def answered(self, prefix: str) -> str:
        """Say a command after the wake word; the device must play the answer Home Assistant spoke."""
        before = len(self.played(prefix))
        runs_before = len(await self.pipeline_runs())
        await self.say_to_device("Okay Nabu, turn on the kitchen lights.")
        answer = await self.new_wav(prefix, before, 90)
        runs = await self.pipeline_runs()
        if len(runs) <= runs_before:
            raise AssertionError("Home Assistant ran no pipeline")
        heard_by_ha, said_by_ha = await self.pipeline_run(runs[-1])
        if "kitchen" not in heard_by_ha.lower():
            raise AssertionError(f"Home Assistant heard {heard_by_ha!r}")
        played = await self.heard(answer)
        said, got = words(said_by_ha), words(played)
        if not said or len(said & got) < 0.6 * len(said):
            raise AssertionError(f"Home Assistant said {said_by_ha!r}; the device played {played!r}")
        return f"HA heard {heard_by_ha!r}, said {said_by_ha!r}; the device played {played!r}"

    async def pipeline_runs(self) -> list[dict[str, Any]]:
        pipeline = await self.hass.ws("assist_pipeline/pipeline/get")
        listed = await self.hass.ws("assist_pipeline/pipeline_debug/list", pipeline_id=pipeline["id"])
        return [dict(run, pipeline_id=pipeline["id"]) for run in listed["pipeline_runs"]]

    async def pipeline_run(self, run: dict[str, Any]) -> tuple[str, str]:
        """What Home Assistant heard and said in `run` (once its intent has ended)."""
        async def ended() -> tuple[str, str] | None:
            got = await self.hass.ws("assist_pipeline/pipeline_debug/get", pipeline_id=run["pipeline_id"],
                                     pipeline_run_id=run["pipeline_run_id"])
            heard = said = None
            for event in got["events"]:
                data = event.get("data") or {}
                if event["type"] == "stt-end":
                    heard = data["stt_output"]["text"]
                elif event["type"] == "intent-end":
                    said = data["intent_output"]["response"]["speech"]["plain"]["speech"]
            return (heard, said) if heard is not None and said is not None else None
        return tuple(await until(ended, 30, "the pipeline run's intent"))  # type: ignore[return-value]

    async def wyoming_turn(self) -> str:
        return await self.answered("ha-answer-")

    async def wyoming_announce(self) -> str:
        satellite = await self.hass.entity("wyoming", "assist_satellite")
        before = len(self.played("ha-announce-"))
        await self.hass.call("assist_satellite", "announce", {
            "entity_id": satellite, "message": "Dinner is ready.", "preannounce": False})
        wav = await self.new_wav("ha-announce-", before, 30)
        return f"{satellite}: heard as {await self.words_of(wav, 'ready')!r}"

    async def notify_once(self) -> str:
        notify = await self.hass.entity("mqtt", "notify")
        before = len(list((self.work / "out").glob("*.wav")))
        await self.hass.call("notify", "send_message", {"entity_id": notify,
                                                        "message": "The laundry is done."})
        await self.device.logged(r"laundry|ha-\d", timeout=30)

        async def spoken_once() -> bool:
            return len(list((self.work / "out").glob("*.wav"))) == before + 1
        await until(spoken_once, 30, "the notify message to be spoken")
        return ""

    async def mqtt_volume_and_mute(self) -> str:
        volume = await self.hass.entity("mqtt", "number", "volume")
        mute = await self.hass.entity("mqtt", "switch", "mic")
        mark = len(self.device.log())
        await self.hass.call("number", "set_value", {"entity_id": volume, "value": 0.55})
        await self.device.logged(r"volume set to 0\.55", after=mark)
        await self.hass.call("switch", "turn_on", {"entity_id": mute})
        await self.device.logged(r"microphone muted", after=mark)
        await self.hass.call("switch", "turn_off", {"entity_id": mute})
        await self.device.logged(r"microphone unmuted", after=mark)
        return ""

    async def satellite_mute_in_step(self) -> str:
        mute = await self.hass.entity("wyoming", "switch", "mute")
        await self.hass.call("switch", "turn_on", {"entity_id": mute})
        await self.hass.call("switch", "turn_off", {"entity_id": mute})

        async def running() -> bool:
            return bool(self.status.get("satellite", {}).get("connected"))
        await until(running, 15, "the device status to say the satellite runs")
        return await self.wyoming_announce()

    async def restart(self) -> str:
        await self.hass.stop()
        await self.hass.start()
        await self.hass.login()

        async def back() -> list[str] | None:
            states = {s["entity_id"]: s["state"] for s in await self.hass.states()}
            wanted = [e for e in states if re.match(r"(assist_satellite|tts|stt|notify)\.", e)]
            ready = [e for e in wanted if states[e] != "unavailable"]
            return ready if len(ready) >= 4 and len(ready) == len(wanted) else None
        ready = await until(back, 90, "the entities to come back after Home Assistant's restart")
        return ", ".join(ready)

    # -- the ESPHome API -----------------------------------------------------------------------

    async def esphome_added(self) -> str:
        entry = await self.hass.flow("esphome", {"host": "127.0.0.1", "port": self.ports["esphome"]})
        satellite = await self.hass.entity("esphome", "assist_satellite")
        player = await self.hass.entity("esphome", "media_player")
        mute = await self.hass.entity("esphome", "switch", "mute")
        return f"entry {entry['title']!r}: {satellite}, {player}, {mute}"

    async def esphome_turn(self) -> str:
        return await self.answered("esphome-answer-")

    async def esphome_announce(self) -> str:
        satellite = await self.hass.entity("esphome", "assist_satellite")
        before = len(self.played("esphome-announce-"))
        start = time.monotonic()
        await self.hass.call("assist_satellite", "announce", {
            "entity_id": satellite, "message": "Dinner is ready."})  # with the pre-announce chime
        took = time.monotonic() - start
        wav = await self.new_wav("esphome-announce-", before, 10)
        return f"finished in {took:.2f} s, heard as {await self.words_of(wav, 'ready')!r}"

    async def esphome_volume_and_mute(self) -> str:
        player = await self.hass.entity("esphome", "media_player")
        mute = await self.hass.entity("esphome", "switch", "mute")
        mark = len(self.device.log())
        await self.hass.call("media_player", "volume_set", {"entity_id": player,
                                                           "volume_level": 0.35})
        await self.device.logged(r"volume set to 0\.35", after=mark)
        await self.hass.call("switch", "turn_on", {"entity_id": mute})
        await self.device.logged(r"microphone muted", after=mark)
        await self.hass.call("switch", "turn_off", {"entity_id": mute})
        await self.device.logged(r"microphone unmuted", after=mark)
        return ""

    async def run(self) -> int:
        try:
            self.device.start()
            self.mic.start()
            await self.device.logged(r"esphome: API on", timeout=READY_S)
            self.watch_status()
            await self.hass.start()
            await self.hass.onboard()
            await self.check("wyoming (satellite, services) and mqtt added by their config flows",
                             self.integrations_added)
            await self.check("a pipeline with the device's speech to text and text to speech", self.pipeline)
            await self.check("TTS through /api/tts_get_url and STT through /api/stt", self.tts_and_stt)
            await self.check("a TTS request for an unknown voice fails in < 2 s", self.unknown_voice)
            await self.check("wyoming satellite: a wake word to a spoken answer", self.wyoming_turn)
            await self.check("wyoming satellite: assist_satellite.announce is played", self.wyoming_announce)
            await self.check("mqtt: notify.send_message is spoken once", self.notify_once)
            await self.check("mqtt: volume and mic mute from Home Assistant reach the device",
                             self.mqtt_volume_and_mute)
            await self.check("wyoming satellite: mute and unmute within 1 s leave both sides in step",
                             self.satellite_mute_in_step)
            await self.check("esphome: added by its config flow, with its entities", self.esphome_added)
            await self.check("esphome: a wake word to a spoken answer", self.esphome_turn)
            await self.check("esphome: assist_satellite.announce is played and finished",
                             self.esphome_announce)
            await self.check("esphome: volume and mute from Home Assistant reach the device",
                             self.esphome_volume_and_mute)
            await self.check("a Home Assistant restart brings the entities back", self.restart)
        finally:
            self.mic.stop()
            await self.hass.close()
            self.device.stop()
            self.files.close()
            with contextlib.suppress(Exception):
                self._watch.loop_stop()
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
    parser.add_argument("--whisper", required=True, help="a Whisper export directory (asr.model)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    if not shutil.which(args.edge_agent) and not Path(args.edge_agent).exists():
        print(f"ha-check: {args.edge_agent}: not found", file=sys.stderr)
        return 2
    return asyncio.run(Check(args).run())


if __name__ == "__main__":
    sys.exit(main())
