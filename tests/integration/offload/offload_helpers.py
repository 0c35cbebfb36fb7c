"""Helpers for the offload integration tests: real servers on loopback."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict

from benchmarks.serveproc import ServeProcess
from edge_agent.config import OffloadSettings
from edge_agent.offload.client.router import SynthRouter
from edge_agent.offload.client.servers import ListedOrder as InOrder
from edge_agent.offload.client.servers import ServerPool
from edge_agent.offload.server.synth_server import ServerThread

PSK = b"integration-test-key-0123456789"
PIPER = "en_US-joe-medium"

__all__ = [
    "PIPER",
    "PSK",
    "InOrder",
    "ScriptedServer",
    "ServeProcess",
    "ServerThread",
    "free_port",
    "make_router",
    "only_client",
    "spoken",
]


class ScriptedServer:
    """A misbehaving server that speaks the real protocol: handshake, then a script per request.

    Scripts: `partial` (sentence 0 whole, half of sentence 1, then the socket closes),
    `stall` (sentence 0 whole, then silence on an open connection), `silent` (no audio at all),
    `busy` (every request refused with BUSY), `goaway` (GOAWAY right after the handshake, then
    nothing: the connection stays open), `deaf` (sentence 0 whole, then nothing at all, not even
    a PONG: a dead link that closes nothing).
    """

    def __init__(self, script: str, psk: bytes = PSK, voice: str = "kokoro-82m", rate: int = 22050) -> None:
        import numpy as np

        from edge_agent.offload.wire import auth
        from edge_agent.offload.wire import messages as m
        from edge_agent.offload.wire.framing import FrameDecoder

        self.script = script
        self.requests: list[m.Synth] = []
        self.cancels: list[int] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        tone = (0.2 * np.sin(np.arange(rate) * 2 * np.pi * 220 / rate)).astype(np.float32)
        pcm = (tone * 32767).astype("<i2").tobytes()

        async def handle(reader, writer):
            decoder = FrameDecoder()

            async def read():
                while True:
                    data = await reader.read(65536)
                    if not data:
                        raise ConnectionError("closed")
                    frames = decoder.feed(data)
                    if frames:
                        return [m.decode(f) for f in frames]

            def send(msg):
                writer.write(m.encode(msg))

            try:
                (hello,) = await read()
                challenge = m.Challenge(auth.new_nonce(), 1, 65536, "scripted")
                send(challenge)
                (proof,) = await read()
                transcript = (hello.payload(), challenge.payload())
                assert auth.verify(auth.client_proof(psk, *transcript), proof.mac)
                send(m.Welcome(auth.server_proof(psk, *transcript), 1, (m.VoiceInfo(voice, rate),)))
                if self.script == "goaway":
                    send(m.GoAway(105, "draining"))
                while True:
                    for msg in await read():
                        if isinstance(msg, m.Ping):
                            if not (self.script == "deaf" and self.requests):
                                send(m.Pong(msg.nonce))
                        elif isinstance(msg, m.Cancel):
                            self.cancels.append(msg.stream)
                        elif isinstance(msg, m.Synth):
                            self.requests.append(msg)
                            sid = msg.stream
                            if self.script == "busy":
                                send(m.Error(sid, 103, "server queue is full"))
                                continue
                            if self.script in ("silent", "goaway"):
                                continue
                            send(m.Format(sid, rate, m.Codec.PCM16, 0, 0, len(msg.sentences)))
                            send(m.Audio(sid, 0, rate // 2, pcm[: rate], last=False))
                            send(m.Audio(sid, 0, rate // 2, pcm[rate:], last=True))
                            await writer.drain()
                            if self.script == "partial":
                                send(m.Audio(sid, 1, rate // 2, pcm[: rate], last=False))
                                await writer.drain()
                                await asyncio.sleep(0.05)
                                writer.close()
                                return
            except (ConnectionError, ValueError):
                writer.close()

        async def start():
            return await asyncio.start_server(handle, "127.0.0.1", 0)

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]
        self.uri = f"tcp://127.0.0.1:{self.port}"

    def stop(self) -> None:
        async def stop():
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_router(local_synth, uri, psk=PSK, rng=None, **overrides):
    """A router over a pool of `uri` (one URI, or a list of them)."""
    uris = [uri] if isinstance(uri, str) else list(uri)
    values = {"server": uris[0], "servers": tuple(uris[1:]), "policy": "auto", "voice": "kokoro-82m",
              "codec": "pcm16", "connect_timeout_s": 2.0, "first_audio_deadline_s": 5.0,
              "sentence_timeout_s": 5.0, "reconnect_min_s": 0.05, "reconnect_max_s": 0.2} | overrides
    settings = OffloadSettings(**values)
    pool = ServerPool(settings, psk, rng=rng)
    pool.start()
    return SynthRouter(local_synth, settings, pool)


def only_client(router):
    """The client of a one-server router."""
    (client,) = router.pool.clients
    return client


def spoken(chunks, count):
    """Check each sentence 0..count-1 appears once, whole, from one engine; return engines in order."""
    per = defaultdict(list)
    order = []
    for chunk in chunks:
        if chunk.sentence not in per:
            order.append(chunk.sentence)
        per[chunk.sentence].append(chunk)
    assert order == list(range(count)), f"sentences out of order or missing: {order}"
    engines = []
    for index in range(count):
        parts = per[index]
        assert [c.last for c in parts] == [False] * (len(parts) - 1) + [True], f"sentence {index} repeated"
        assert len({c.engine for c in parts}) == 1
        assert sum(len(c.samples) for c in parts) > 0.2 * parts[0].sample_rate
        engines.append(parts[0].engine)
    return engines
