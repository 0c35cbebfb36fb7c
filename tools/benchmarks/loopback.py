"""A device's microphone and Home Assistant's media server, on loopback (standard library only).

`FifoMicrophone` feeds a device's `audio.input_pipe` in real time, silence between the
clips it is asked to say, and opens the FIFO again when the device closes its end (a
muted microphone); `FileServer` serves a directory over HTTP, as Home Assistant serves
TTS and media URLs; `stop_process` ends a child (the device, a peer server) politely, then
for sure. `bench esphome`, `bench wyoming` and `scripts/ha-check` (which runs in Home
Assistant's own venv and imports this module by path) use them.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """SIGTERM, `grace_s` to exit (a daemon's shutdown), then SIGKILL; a finished one is left alone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class FifoMicrophone(threading.Thread):
    """Raw s16le mono PCM at `rate` into `fifo`, one block every `block_s` seconds."""

    def __init__(self, fifo: Path, rate: int, block_s: float = 0.02) -> None:
        super().__init__(daemon=True, name="loopback-mic")
        self.fifo = fifo
        self.rate = rate
        self.block_s = block_s
        self._said: list[bytes] = []
        self._lock = threading.Lock()
        self._stop_event = threading.Event()

    def say(self, pcm: bytes) -> None:
        with self._lock:
            self._said.append(pcm)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.is_set():
            fd = os.open(self.fifo, os.O_WRONLY)  # returns once the device has opened its end
            try:
                self._feed(fd)
            except BrokenPipeError:
                continue  # the device closed its end (muted): open it again when it listens again
            finally:
                os.close(fd)

    def _feed(self, fd: int) -> None:
        block = int(self.rate * self.block_s) * 2
        pending = b""
        next_at = time.monotonic()
        while not self._stop_event.is_set():
            if not pending:
                with self._lock:
                    pending, self._said = b"".join(self._said), []
            chunk, pending = (pending[:block], pending[block:]) if pending else (bytes(block), b"")
            os.write(fd, chunk.ljust(block, b"\0"))
            next_at += self.block_s
            self._stop_event.wait(max(0.0, next_at - time.monotonic()))


class FileServer:
    """The files under `root` on http://127.0.0.1:PORT/ until `close`."""

    def __init__(self, root: Path) -> None:
        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any) -> None:
                super().__init__(*args, directory=str(root))

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True, name="loopback-files").start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
