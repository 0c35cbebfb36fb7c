"""The ESPHome API's latencies and memory: `edge-agent run` driven by aioesphomeapi, as Home Assistant does.

The device runs in a child process (`edge-agent run`), its microphone a FIFO this bench
feeds in real time (silence, and our own voice saying "Okay Nabu, turn on the kitchen
lights." when a turn is wanted), its speaker an output command that stamps the time of
the first byte of each announcement. The client is aioesphomeapi's `APIClient`:

- wake -> request and wake -> first audio chunk: from the time the device logs the wake
  word (its hearing loop has the detection) to the client's `handle_start` and first
  `handle_audio` (the same machine's clock);
- announce -> first sound: from the client sending `VoiceAssistantAnnounceRequest` (a short
  WAV served on loopback) to the first byte reaching the output command;
- RSS: the device's resident memory once it has heard one wake word and command itself (no
  controller connected yet) and gone idle, and the same for the device with the ESPHome API off
  and the Wyoming satellite on: both listening with the same models (`--whisper` export).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

from benchmarks.loopback import FifoMicrophone, FileServer, stop_process
from benchmarks.report import emit, machine, median, percentile
from edge_agent.commands.context import Context
from edge_agent.errors import UsageError

COMMAND = "Okay Nabu, turn on the kitchen lights."
RATE = 22050
BLOCK_S = 0.02
READY_S = 180.0
STAMP = ("import sys, time\n"
         "first = sys.stdin.buffer.read(1)\n"
         "open(sys.argv[1], 'a').write(f'{time.time()}\\n')\n"
         "while sys.stdin.buffer.read(65536): pass\n")
"""The output command: the time its first byte arrived, then it reads the rest away."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--whisper", type=Path, required=True, help="a Whisper export (asr.model)")
    parser.add_argument("--turns", type=int, default=5, help="wake words to stream (default 5)")
    parser.add_argument("--announcements", type=int, default=10, help="announcements (default 10)")


def run(ctx: Context, args: argparse.Namespace) -> int:
    if args.turns < 1 or args.announcements < 1:
        raise UsageError("--turns and --announcements must be at least 1")
    if not (args.whisper / "manifest.json").is_file():
        raise UsageError(f"--whisper {args.whisper}: not a Whisper export (no manifest.json)")
    with tempfile.TemporaryDirectory(prefix="edge-bench-esphome-") as tmp:
        work = Path(tmp)
        clip = _say(work / "command.wav", COMMAND)
        notice = work / "media" / "notice.wav"
        _say(notice, "Dinner is ready.")
        result = asyncio.run(_esphome(work, args, clip, notice))
        result["rss_mb_wyoming_satellite"] = _rss_of(work, args, {"wyoming": {
            "enabled": True, "uri": "tcp://127.0.0.1:0", "services_uri": "tcp://127.0.0.1:0",
            "zeroconf": False}}, clip)
    result["machine"] = machine()
    result["load"] = os.getloadavg()
    lines = [
        f"ESPHome API, {args.turns} turns and {args.announcements} announcements (load "
        f"{result['load'][0]:.1f}):",
        f"  wake -> VoiceAssistantRequest at the client: p50 {result['wake_to_request_ms_p50']:.1f} ms",
        f"  wake -> first audio chunk at the client:     p50 {result['wake_to_audio_ms_p50']:.1f} ms, "
        f"p95 {result['wake_to_audio_ms_p95']:.1f} ms",
        f"  announce -> first sound:                     p50 {result['announce_to_sound_ms_p50']:.1f} ms, "
        f"p95 {result['announce_to_sound_ms_p95']:.1f} ms",
        f"  RSS listening: ESPHome API {result['rss_mb_esphome']:.0f} MB, Wyoming satellite "
        f"{result['rss_mb_wyoming_satellite']:.0f} MB",
    ]
    emit(result, lines, args.json)
    return 0


class _Device:
    def __init__(self, work: Path, name: str, whisper: Path, extra: dict[str, Any]) -> None:
        self.dir = work / name
        self.dir.mkdir(parents=True)
        self.fifo = self.dir / "mic.pcm"
        os.mkfifo(self.fifo, 0o600)
        self.stamps = self.dir / "stamps"
        config = {
            "device": {"id": "bench"}, "mqtt": {"broker": "mqtt://127.0.0.1:9"},
            "daemon": {"state_dir": str(self.dir / "daemon")},
            "announcements": {"state_dir": str(self.dir / "announcements")},
            "audio": {"input_pipe": str(self.fifo), "input_rate": RATE, "echo_cancel": False,
                      "output_command": f"{sys.executable} -c \"{STAMP}\" {self.stamps}"},
            "asr": {"model": str(whisper)}, "wake": {"chime": False},
            # No answer is held for after a turn: this measures the API's paths, not that wait.
            "listen": {"mode": "wake", "answer_wait_s": 0},
            **extra,
        }
        (self.dir / "config.yaml").write_text(json.dumps(config))
        self.log = self.dir / "device.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edge_agent", "run", "--config", str(self.dir / "config.yaml")],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
            env=dict(os.environ, XDG_STATE_HOME=str(self.dir / "state")))
        self.mic = FifoMicrophone(self.fifo, RATE, BLOCK_S)
        self.mic.start()

    def logged(self, pattern: str, after: int = 0, timeout: float = READY_S) -> tuple[re.Match[str], float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise UsageError(f"the device exited: {self.log.read_text()[-500:]}")
            for line in self.log.read_text(errors="replace").splitlines()[after:]:
                found = re.search(pattern, line)
                if found:
                    with contextlib.suppress(ValueError, KeyError):
                        return found, float(json.loads(line)["ts"])
            time.sleep(0.05)
        raise UsageError(f"the device did not log /{pattern}/ within {timeout:g} s")

    def lines(self) -> int:
        return len(self.log.read_text(errors="replace").splitlines())

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

    def idle_rss_mb(self, clip: bytes) -> float:
        """Say one wake word and command (heard here: no controller), wait until the device has
        used no CPU for half a second (its turn is transcribed), and read its RSS."""
        mark = self.lines()
        self.mic.say(clip)
        self.logged(r"wake word", mark, 30)
        deadline, last = time.monotonic() + 60, self._cpu()
        while time.monotonic() < deadline:
            time.sleep(0.5)  # a sampling period of the CPU counter, not a synchronisation
            now = self._cpu()
            if now - last < 5:  # clock ticks: under 0.05 s of CPU in 0.5 s, the feeding itself
                return self.rss_mb()
            last = now
        raise UsageError("the device did not go idle within 60 s of the command")

    def _cpu(self) -> int:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    def stop(self) -> None:
        self.mic.stop()
        stop_process(self.proc)


async def _esphome(work: Path, args: argparse.Namespace, clip: bytes, notice: Path) -> dict[str, Any]:
    from aioesphomeapi.client import APIClient

    device = _Device(work, "esphome", args.whisper, {"esphome": {
        "enabled": True, "host": "127.0.0.1", "port": 0, "zeroconf": False}})
    files = FileServer(notice.parent)
    try:
        found, _ = await asyncio.to_thread(device.logged, r"esphome: API on \S+ port (\d+)")
        await asyncio.to_thread(device.logged, r'"listening"')
        rss = await asyncio.to_thread(device.idle_rss_mb, clip)
        client = APIClient("127.0.0.1", int(found.group(1)), password=None, client_info="edge-speech bench")
        await asyncio.wait_for(client.connect(login=True), 30)
        to_sound = await _announcements(client, device, files.url(notice.name), args.announcements)
        to_request, to_audio = await _turns(client, device, args.turns, clip)
        await client.disconnect()
    finally:
        files.close()
        device.stop()
    return {"wake_to_request_ms": to_request, "wake_to_audio_ms": to_audio, "announce_to_sound_ms": to_sound,
            "wake_to_request_ms_p50": median(to_request), "wake_to_audio_ms_p50": median(to_audio),
            "wake_to_audio_ms_p95": percentile(to_audio, 95), "announce_to_sound_ms_p50": median(to_sound),
            "announce_to_sound_ms_p95": percentile(to_sound, 95), "rss_mb_esphome": rss}


async def _turns(client: Any, device: _Device, turns: int, clip: bytes) -> tuple[list[float], list[float]]:
    from aioesphomeapi import VoiceAssistantEventType

    loop = asyncio.get_running_loop()
    events: dict[str, asyncio.Future[float]] = {}

    async def handle_start(conversation_id: str, flags: int, settings: Any, phrase: str | None) -> int:
        events.setdefault("start", loop.create_future()).set_result(time.time())
        return 0

    async def handle_stop(abort: bool) -> None:
        return None

    async def handle_audio(data: bytes, data2: bytes | None = None) -> None:
        first = events.setdefault("audio", loop.create_future())
        if not first.done():
            first.set_result(time.time())

    client.subscribe_voice_assistant(handle_start=handle_start, handle_stop=handle_stop,
                                     handle_audio=handle_audio)
    await client.device_info()  # the subscription has been handled
    to_request: list[float] = []
    to_audio: list[float] = []
    for _ in range(turns):
        events.clear()
        events["start"], events["audio"] = loop.create_future(), loop.create_future()
        mark = device.lines()
        device.mic.say(clip)
        _, woke_at = await asyncio.to_thread(device.logged, r"wake word", mark, 30)
        started = await asyncio.wait_for(events["start"], 30)
        audio = await asyncio.wait_for(events["audio"], 30)
        to_request.append((started - woke_at) * 1000)
        to_audio.append((audio - woke_at) * 1000)
        # Home Assistant's VAD ends the turn (the device would at listen.command_timeout_s).
        client.send_voice_assistant_event(VoiceAssistantEventType.VOICE_ASSISTANT_STT_VAD_END, {})
        client.send_voice_assistant_event(VoiceAssistantEventType.VOICE_ASSISTANT_RUN_END, {})
        await client.device_info()  # a round trip: both handled before the next wake word
    return to_request, to_audio


async def _announcements(client: Any, device: _Device, url: str, count: int) -> list[float]:
    latencies = []
    for n in range(count):
        sent = time.time()
        finished = await client.send_voice_assistant_announcement_await_response(url, 60, "Dinner")
        if not finished.success:
            raise UsageError("an announcement did not play (see the device log)")
        stamps = device.stamps.read_text().split() if device.stamps.exists() else []
        if len(stamps) < n + 1:
            raise UsageError("the output command stamped no first byte")
        latencies.append((float(stamps[-1]) - sent) * 1000)
    return latencies


def _rss_of(work: Path, args: argparse.Namespace, extra: dict[str, Any], clip: bytes) -> float:
    device = _Device(work, "wyoming", args.whisper, extra)
    try:
        device.logged(r'"listening"')
        return device.idle_rss_mb(clip)
    finally:
        device.stop()


def _say(path: Path, text: str) -> bytes:
    """`text` in our voice, noise off (the same samples every run), as raw PCM at `RATE`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "edge_agent", "say", text, "--local", "--out", str(path),
                    "--set", "tts.noise_scale=0", "--set", "tts.noise_w=0"], check=True,
                   capture_output=True, timeout=120)
    with wave.open(str(path), "rb") as w:
        if w.getframerate() != RATE:
            raise UsageError(f"the voice speaks at {w.getframerate()} Hz, not {RATE}")
        return bytes(int(0.3 * RATE) * 2) + w.readframes(w.getnframes())
