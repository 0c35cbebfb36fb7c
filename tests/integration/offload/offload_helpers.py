"""Helpers for the offload integration tests: real servers on loopback."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time

from edge_agent.config import ServerSettings
from edge_agent.offload.server import SynthServer

PSK = b"integration-test-key-0123456789"
PIPER = "en_US-joe-medium"


class ServerThread:
    """A `SynthServer` running on its own event loop in a thread."""

    def __init__(self, settings: ServerSettings, voices, psk, tls=None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make():
            server = SynthServer(settings, voices, psk, tls=tls)
            await server.start()
            return server

        self.server = self.call(make())
        self.host, self.port = self.server.address
        self.uri = f"{'tls' if tls else 'tcp'}://127.0.0.1:{self.port}"

    def call(self, coro, timeout: float = 30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if not self.loop.is_running():
            return
        self.call(self.server.shutdown())

        async def drain():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.call(drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class ServeProcess:
    """`edge-agent serve` as a real subprocess on a free port."""

    def __init__(self, args: list[str], env: dict[str, str], timeout: float = 120) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "edge_agent", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **env})
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line or self.proc.poll() is not None:
                break
        match = re.search(r"listening on (\w+)://([\d.]+):(\d+)", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"serve did not start: {line!r} {self.proc.stderr.read()[-2000:]}")
        self.uri = f"{match[1]}://{match[2]}:{match[3]}"
        self.port = int(match[3])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 20) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        self.kill()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe:
                pipe.close()
