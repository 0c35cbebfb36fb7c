"""`edge-agent run` (a subprocess, the real voice) against audio URLs that abuse it, through the
ESPHome API with Home Assistant's own client library (aioesphomeapi).

- Six connections announcing 16 MiB 8-bit WAVs at once: the daemon's peak resident memory
  (`VmHWM`) stays within 300 MB.
- Twelve announcements of a stalling URL from one connection, then Home Assistant's mute
  switch: the microphone (`audio.input_command`, a recorder that notes when it is stopped)
  closes at once, Wyoming TTS answers as usual, and SIGTERM stops the daemon promptly.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aioesphomeapi import APIClient
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from edge_agent.esphome.entities import MUTE
from edge_agent.mqtt.localbroker import free_port
from tests.media_servers import AbusiveMedia, abusive_media
from tests.mqtt_support import DaemonProcess, Watcher, wait_until

pytestmark = pytest.mark.slow

MAX_PEAK_MB = 300.0
MUTE_BOUND_S = 1.0
"""Generous for a test on a shared machine; the figure is printed (the goal is 0.2 s)."""
STOP_BOUND_S = 10.0
TTS_BOUND_S = 15.0

RECORDER = '''
import os, signal, sys, time
opened, closed = sys.argv[1], sys.argv[2]

def bye(*_):
    with open(closed, "w") as fh:
        fh.write(repr(time.monotonic()))
    os._exit(0)

signal.signal(signal.SIGTERM, bye)
signal.signal(signal.SIGINT, bye)
with open(opened, "w") as fh:
    fh.write(str(os.getpid()))
block = bytes(3200)  # 0.1 s of 16 kHz S16_LE silence, written at the wall clock's pace
start, n = time.monotonic(), 0
while True:
    try:
        os.write(1, block)
    except OSError:
        bye()
    n += 1
    time.sleep(max(0.0, start + n * 0.1 - time.monotonic()))
'''


@pytest.fixture
def abusive() -> Iterator[AbusiveMedia]:
    yield from abusive_media()


def start_daemon(tmp_path: Path, broker: Any, **sections: dict[str, Any]) -> tuple[DaemonProcess, int]:
    port = free_port()
    doc: dict[str, Any] = {
        "esphome": {"enabled": True, "host": "127.0.0.1", "port": port, "zeroconf": False,
                    "media_timeout_s": 20.0},
        "audio": {"output": "null"},
        "listen": {"mode": "off"},
    }
    for name, values in sections.items():
        doc.setdefault(name, {}).update(values)
    config = tmp_path / "device.yaml"
    config.write_text(yaml.safe_dump(doc))
    daemon = DaemonProcess(tmp_path / "d", broker.url, config=config)
    daemon.start().wait_running()
    return daemon, port


def vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def _noop(*_: Any) -> None:
    return None


async def client_for(port: int) -> APIClient:
    client = APIClient("127.0.0.1", port, password=None, client_info="Home Assistant test")
    await asyncio.wait_for(client.connect(login=True), 10)
    return client


def test_six_concurrent_16_mib_wavs_keep_the_daemon_within_300_mb(
        tmp_path: Path, broker: Any, abusive: AbusiveMedia) -> None:
    daemon, port = start_daemon(tmp_path, broker)
    try:
        assert daemon.proc is not None
        pid = daemon.proc.pid
        before_mb = vm_kib(pid, "VmRSS") / 1024

        async def abuse(path: str) -> list[bool]:
            clients = [await client_for(port) for _ in range(6)]
            # One of them runs the voice assistant, as Home Assistant does: it has the place kept
            # for it, so two fetches run at once.
            clients[0].subscribe_voice_assistant(handle_start=_noop, handle_stop=_noop, handle_audio=_noop)
            await clients[0].device_info()
            try:
                url = abusive.url(path)
                done = await asyncio.gather(*(
                    c.send_voice_assistant_announcement_await_response(url, 60) for c in clients))
                return [d.success for d in done]
            finally:
                for c in clients:
                    await c.disconnect()

        # 8 kHz: 2,097 s of audio (longer than announcements.max_audio_s); 48 kHz: 16 M samples,
        # four times what 16 MiB of 16-bit audio holds. Neither may be decoded.
        results = [asyncio.run(abuse(path)) for path in ("big8-8000", "big8-48000", "big8-8000")]
        refused_mb = vm_kib(pid, "VmHWM") / 1024
        # 16-bit at 48 kHz: 174 s, within the limits: what the places and the budget admit is
        # decoded, queued and played; the rest is refused with its reason.
        logged = len(daemon.log_text())
        played = asyncio.run(abuse("big16-48000"))
        peak_mb = vm_kib(pid, "VmHWM") / 1024
        print(f"\ndaemon RSS before {before_mb:.0f} MB; peak during six concurrent 16 MiB 8-bit WAVs x3 "
              f"{refused_mb:.0f} MB, then six 16 MiB 16-bit WAVs ({sum(played)} played) {peak_mb:.0f} MB")
        assert all(not ok for round_ in results for ok in round_), results
        log = daemon.log_text()
        refused = [line for line in log[logged:].splitlines()
                   if "big16-48000" in line or "already fetching" in line]
        assert sum(played) + len(refused) == 6, (played, refused)  # each refusal says why
        assert peak_mb <= MAX_PEAK_MB, f"peak {peak_mb:.0f} MB"
        assert "already fetching 2 media URLs" in log and "one of them kept for Home Assistant" in log
        assert "2097.1 s long" in log
    finally:
        daemon.close()


def test_a_mute_closes_the_microphone_at_once_while_a_connection_floods_stalling_urls(
        tmp_path: Path, broker: Any, abusive: AbusiveMedia, whisper_dir: Path) -> None:
    opened, closed = tmp_path / "mic.opened", tmp_path / "mic.closed"
    recorder = tmp_path / "recorder.py"
    recorder.write_text(RECORDER)
    tts_port = free_port()
    daemon, port = start_daemon(
        tmp_path, broker, listen={"mode": "wake"}, asr={"model": str(whisper_dir)},
        audio={"input_command": f"{sys.executable} {recorder} {opened} {closed}"},
        wyoming={"enabled": True, "satellite": False, "zeroconf": False, "uri": f"tcp://127.0.0.1:{tts_port}"})
    watcher = Watcher(broker.url)
    try:
        watcher.wait("edge/dev1/status",
                     lambda d: d["state"] == "online" and d["listen"]["state"] == "listening", timeout=120)
        wait_until(opened.exists, what="the recorder to start")

        async def first_audio() -> float:
            start = time.monotonic()
            async with AsyncTcpClient("127.0.0.1", tts_port) as tts:
                await tts.write_event(Synthesize(text="The kettle is on.").event())
                while (event := await asyncio.wait_for(tts.read_event(), 30)) is not None:
                    if AudioChunk.is_type(event.type):
                        return time.monotonic() - start
            raise AssertionError("no audio from Wyoming TTS")

        async def flood_then_mute() -> tuple[float, float]:
            client = await client_for(port)
            url = abusive.url("stall")
            announce = client.send_voice_assistant_announcement_await_response
            announces = [asyncio.create_task(announce(url, 60)) for _ in range(12)]
            try:
                await asyncio.to_thread(wait_until, lambda: abusive.served >= 1, 10, "a stalled fetch")
                pressed = time.monotonic()
                client.switch_command(MUTE, True)
                shut = asyncio.to_thread(wait_until, closed.exists, 60, "the microphone to close")
                tts_s, _ = await asyncio.gather(first_audio(), shut)
                return float(closed.read_text()) - pressed, tts_s
            finally:
                for task in announces:
                    task.cancel()
                with contextlib.suppress(Exception):
                    await client.disconnect()

        mute_s, tts_s = asyncio.run(flood_then_mute())
        assert daemon.proc is not None
        start = time.monotonic()
        code = daemon.terminate(timeout=120)  # while the fetch still stalls (media_timeout_s is 20 s)
        stop_s = time.monotonic() - start
        print(f"\nmute -> microphone closed {mute_s:.3f} s; Wyoming TTS first audio {tts_s:.2f} s; "
              f"SIGTERM -> exit {stop_s:.2f} s (exit code {code}); fetches served {abusive.served}")
        assert mute_s <= MUTE_BOUND_S, f"the microphone closed {mute_s:.2f} s after the mute"
        assert tts_s <= TTS_BOUND_S, f"Wyoming TTS's first audio came after {tts_s:.1f} s"
        assert code == 0 and stop_s <= STOP_BOUND_S, f"SIGTERM took {stop_s:.1f} s"
        assert abusive.served == 1 and daemon.log_text().count("(one at a time)") == 11
    finally:
        watcher.close()
        daemon.close()


def test_sigterm_stops_the_daemon_promptly_while_a_connection_floods_stalling_urls(
        tmp_path: Path, broker: Any, abusive: AbusiveMedia) -> None:
    daemon, port = start_daemon(tmp_path, broker)
    try:
        async def flood() -> None:
            client = await client_for(port)
            announce = client.send_voice_assistant_announcement_await_response
            announces = [asyncio.create_task(announce(abusive.url("stall"), 60)) for _ in range(12)]
            await asyncio.to_thread(wait_until, lambda: abusive.served >= 1, 10, "a stalled fetch")
            for task in announces:
                task.cancel()
            await asyncio.gather(*announces, return_exceptions=True)
            await client.device_info()  # a round trip: every announcement has been handled
            # Left connected and quiet: the daemon closes it as it stops.

        asyncio.run(flood())
        start = time.monotonic()
        code = daemon.terminate(timeout=120)  # while the fetch stalls (media_timeout_s is 20 s)
        stop_s = time.monotonic() - start
        print(f"\nSIGTERM -> exit {stop_s:.2f} s (exit code {code}) with stalled fetches; "
              f"fetches served {abusive.served}")
        assert code == 0 and stop_s <= STOP_BOUND_S, f"SIGTERM took {stop_s:.1f} s"
    finally:
        daemon.close()
