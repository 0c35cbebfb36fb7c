"""`edge-agent wyoming` as a user runs it: found by zeroconf, described, stopped by SIGTERM.

The browser is zeroconf's own, on the loopback interface (multicast works on `lo` here).
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from wyoming.client import AsyncTcpClient
from wyoming.info import Describe, Info

from edge_agent.wyoming.advertise import SERVICE_TYPE
from tests.wyoming.wyoming_support import browse


def _lines(stream: object) -> queue.Queue[str]:
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            out.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return out


async def _describe(port: int) -> Info:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Describe().event())
        event = await asyncio.wait_for(client.read_event(), 5)
        assert event is not None
        return Info.from_event(event)


def test_wyoming_verb_is_advertised_by_device_id_serves_and_stops_on_sigterm(whisper_dir: Path) -> None:
    device = f"kitchen-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "wyoming", "--uri", "tcp://127.0.0.1:0",
         "--set", f"device.id={device}", "--set", f"asr.model={whisper_dir}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        line = _lines(proc.stdout).get(timeout=60)
        assert line.startswith("wyoming server on tcp://127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        addresses, advertised = asyncio.run(browse(f"{device}.{SERVICE_TYPE}", 10))
        assert (addresses, advertised) == (["127.0.0.1"], port)
        info = asyncio.run(_describe(port))
        assert info.tts[0].voices[0].name == "en_US-joe-medium"
        assert info.asr[0].models[0].languages == ["en"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_wyoming_verb_with_a_bad_uri_says_so_and_exits_2() -> None:
    result = subprocess.run([sys.executable, "-m", "edge_agent", "wyoming", "--uri", "http://x:1"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "wyoming.uri" in result.stderr and "tcp://" in result.stderr
