"""HTTP servers on loopback that serve audio URLs badly: they dribble, stall and lie.

Each path picks a behaviour; every connection is counted while it is open, so a test
sees when the device has let go of one. The servers are real sockets; the bytes are
written by hand so that a header can lie and a body can crawl.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

WAV_HEADER = 44
CHUNK = 65536


def wav_header(data_bytes: int, rate: int, width: int, channels: int = 1) -> bytes:
    """A canonical 44-byte PCM WAV header for `data_bytes` of samples."""
    block = channels * width
    return (b"RIFF" + struct.pack("<I", min(36 + data_bytes, 0xFFFFFFFF)) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * block, block, width * 8)
            + b"data" + struct.pack("<I", data_bytes))


class AbusiveMedia:
    """http://127.0.0.1:PORT/<behaviour>...; behaviours:

    - `dribble`: a WAV's headers at once, then its body a byte every `drip_s`;
    - `slow-headers`: the status line, then the headers a byte every `drip_s`;
    - `stall`: reads the request and sends nothing;
    - `big8-<rate>`, `big16-<rate>`: a 16 MiB 8-bit or 16-bit mono WAV of silence at `rate` Hz, as
      fast as it is read;
    - `lie-long`: says Content-Length 1 GiB, sends a short WAV and then nothing;
    - `lie-short`: says Content-Length 1000, sends 16 MiB;
    - `endless`: a WAV with no Content-Length whose body never ends.
    """

    def __init__(self, drip_s: float = 0.5) -> None:
        self.drip_s = drip_s
        self.open = 0
        """Connections open now."""
        self.served = 0
        """Connections accepted so far."""
        self.streamed = 0
        """Body bytes the streaming behaviours (`big8-*`, `lie-short`, `endless`) got sent."""
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._held: list[socket.socket] = []
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, name="abusive-media", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            held = list(self._held)
        for conn in held:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.open += 1
                self.served += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                request = b""
                conn.settimeout(10)
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        return
                    request += data
                path = request.split(b" ", 2)[1].decode().lstrip("/")
                self._answer(conn, path)
        except OSError:
            pass  # the device cut the connection: what these tests want
        finally:
            with self._lock:
                self.open -= 1

    def _answer(self, conn: socket.socket, path: str) -> None:
        conn.settimeout(None)
        body = wav_header(16000 * 2, 16000, 2) + bytes(16000 * 2)
        if path == "stall":
            self._until_hung_up(conn)
            return
        if path == "slow-headers":
            conn.sendall(b"HTTP/1.0 200 OK\r\n")
            self._drip(conn, b"Content-Type: audio/wav\r\n" * 1000)
            return
        if path == "dribble":
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: audio/wav\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body))
            self._drip(conn, body)
            return
        if path.startswith(("big8-", "big16-")):
            width = 1 if path.startswith("big8-") else 2
            size = 16 * 1024 * 1024 - WAV_HEADER
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: audio/wav\r\nContent-Length: %d\r\n\r\n"
                         % (size + WAV_HEADER))
            conn.sendall(wav_header(size, int(path.split("-")[1]), width))
            self._stream(conn, size, b"\x80" if width == 1 else b"\x00")
            return
        if path == "lie-long":
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 30) + body)
            self._until_hung_up(conn)
            return
        if path == "lie-short":
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 1000\r\n\r\n" + wav_header(1 << 24, 16000, 1))
            self._stream(conn, 1 << 24)
            return
        if path == "streamed":  # as Home Assistant's ffmpeg proxy: the header alone, its size unknown
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: audio/x-wav\r\n\r\n"
                         + wav_header(0xFFFFFFFF, 16000, 2))
            if self._closing.wait(0.3):  # the header arrives (and is judged) before any sample
                return
            conn.sendall(bytes(16000 * 2))
            return
        if path == "endless":
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: audio/wav\r\n\r\n" + wav_header(0, 16000, 2))
            self._stream(conn, 1 << 40)
            return
        conn.sendall(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    def _until_hung_up(self, conn: socket.socket) -> None:
        """Send nothing until the device closes the connection (or this server closes)."""
        with self._lock:
            self._held.append(conn)
        while conn.recv(4096):
            pass

    def _drip(self, conn: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if self._closing.wait(self.drip_s):
                return
            conn.sendall(data[i:i + 1])

    def _stream(self, conn: socket.socket, size: int, zero: bytes = b"\x80") -> None:
        silence = zero * CHUNK
        while size > 0 and not self._closing.is_set():
            n = min(size, CHUNK)
            conn.sendall(silence[:n])
            size -= n
            with self._lock:
                self.streamed += n


def abusive_media() -> Iterator[AbusiveMedia]:
    """For a fixture: an `AbusiveMedia` closed after the test."""
    server = AbusiveMedia()
    yield server
    server.close()
