"""`edge-agent serve` as a real process: key checks, SIGTERM, SIGKILL mid-utterance, `say --remote`."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

from edge_agent.config import Endpoint
from edge_agent.offload.client.connection import ClientConnection
from edge_agent.offload.wire import messages as m
from edge_agent.offload.wire.framing import ErrorCode
from tests.conftest import run_cli
from tests.integration.offload.offload_helpers import PIPER, PSK, make_router, spoken
from tests.integration.offload.server.test_synth_server import collect


def test_serve_refuses_to_start_without_a_key():
    result = run_cli("serve", "--port", "0", env={"EDGE_OFFLOAD_PSK": ""}, timeout=60)
    assert result.returncode == 2
    assert "no pre-shared key" in result.stderr


def test_serve_refuses_insecure_mode_on_a_public_address():
    result = run_cli("serve", "--host", "0.0.0.0", "--port", "0", "--set", "server.insecure=true",
                     env={"EDGE_OFFLOAD_PSK": ""}, timeout=60)
    assert result.returncode == 2
    assert "only allowed on a loopback address" in result.stderr


def test_serve_refuses_a_short_key():
    result = run_cli("serve", "--port", "0", env={"EDGE_OFFLOAD_PSK": "short"}, timeout=60)
    assert result.returncode == 2
    assert "use at least 16" in result.stderr


def test_sigterm_drains_and_exits_cleanly(serve_process):
    server = serve_process(PIPER, extra=("--set", "server.metrics_port=0"))
    with urllib.request.urlopen(f"{server.http}/ready", timeout=10) as answer:  # voices loaded
        assert answer.status == 200
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=10) as answer:
        assert b"edge_serve_ready 1.0" in answer.read()
    assert server.terminate(timeout=30) == 0
    assert "shutting down" in server.proc.stderr.read()


def test_a_config_file_written_with_queue_bound_still_holds_serve_to_it(serve_process, tmp_path):
    """`server.queue_bound` is the old name of `server.max_streams`: a file that uses it still
    starts `serve`, which says what to write instead and refuses a second stream beside the one
    it allows (BUSY naming the new key), while the first is served whole."""
    config = tmp_path / "server.yaml"
    config.write_text("server:\n  queue_bound: 1\n")
    server = serve_process(PIPER, extra=("--config", str(config)))
    long_text = tuple(f"Sentence {i} keeps the only slot busy." for i in range(6))

    async def go():
        conn = await ClientConnection.open(Endpoint("tcp", "127.0.0.1", server.port), PSK, timeout=10)
        try:
            taken = asyncio.Event()
            first = asyncio.ensure_future(collect(conn, sentences=long_text, voice=PIPER, answered=taken))
            await asyncio.wait_for(taken.wait(), 30)
            _, second = await collect(conn, sentences=("Am I next?",), voice=PIPER)
            return second, (await first)[1]
        finally:
            await conn.close()

    second, first = asyncio.run(asyncio.wait_for(go(), 60))
    assert len(second) == 1 and second[0].code == ErrorCode.BUSY
    assert "(server.max_streams=1)" in second[0].message
    assert isinstance(first[-1], m.End) and not first[-1].cancelled
    assert server.terminate(timeout=30) == 0
    assert "server.queue_bound: renamed to server.max_streams" in server.proc.stderr.read()


def test_say_remote_speaks_through_the_server(serve_process, tmp_path):
    server = serve_process(PIPER)
    out = tmp_path / "remote.wav"
    result = run_cli("say", "--remote", server.uri, "--voice", PIPER, "--out", str(out),
                     "Dinner is ready. Please come to the kitchen.",
                     env={"EDGE_OFFLOAD_PSK": PSK.decode()})
    assert result.returncode == 0, result.stderr
    assert "(engine: remote)" in result.stdout
    assert out.stat().st_size > 44 + 22050  # more than half a second of 16-bit audio


def test_say_remote_without_a_server_still_speaks_locally(tmp_path):
    out = tmp_path / "fallback.wav"
    result = run_cli("say", "--remote", "tcp://127.0.0.1:9", "--out", str(out), "Hello there.",
                     env={"EDGE_OFFLOAD_PSK": PSK.decode()})
    assert result.returncode == 0, result.stderr
    assert "(engine: local)" in result.stdout
    assert "spoken locally" in result.stderr


def say_through(servers: list[str], out) -> tuple[str, str]:
    """`say` with `offload.servers` (no `offload.server`) and policy remote: (stdout, stderr)."""
    result = run_cli("say", "--set", f"offload.servers=[{', '.join(servers)}]",
                     "--set", "offload.policy=remote", "--voice", PIPER, "--out", str(out),
                     "The garage door is open.",
                     env={"EDGE_OFFLOAD_PSK": PSK.decode()})
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


def test_say_speaks_through_offload_servers_and_fails_over_when_one_dies(serve_process, tmp_path):
    first, second = serve_process(PIPER), serve_process(PIPER)
    stdout, _ = say_through([first.uri, second.uri], tmp_path / "both.wav")
    assert "(engine: remote)" in stdout
    first.kill()  # the first listed server is gone: the second takes the whole text
    stdout, stderr = say_through([first.uri, second.uri], tmp_path / "one.wav")
    assert "(engine: remote)" in stdout
    assert "spoken locally" not in stderr
    assert (tmp_path / "one.wav").stat().st_size > 44 + 22050


def test_say_rejects_local_and_remote_together():
    result = run_cli("say", "--local", "--remote", "tcp://127.0.0.1:9", "Hi.")
    assert result.returncode == 2
    assert "not allowed with argument" in result.stderr


@pytest.mark.slow
def test_server_killed_mid_utterance_the_text_finishes_locally(kokoro_store, serve_process, local_synth):
    server = serve_process("kokoro-82m")
    text = " ".join(f"Announcement sentence number {n} is being read now." for n in
                    ("one", "two", "three", "four", "five", "six"))
    router = make_router(local_synth, server.uri, voice="kokoro-82m", codec="opus",
                         first_audio_deadline_s=60, sentence_timeout_s=60)
    chunks = []
    killed_at = None
    try:
        for chunk in router.stream(text):
            chunks.append(chunk)
            if killed_at is None and chunk.engine == "remote":
                server.kill()  # SIGKILL: no GOAWAY, no END, the socket just dies
                killed_at = time.monotonic()
        finished = time.monotonic()
    finally:
        router.close()
    engines = spoken(chunks, 6)
    remote = engines.count("remote")
    assert 1 <= remote < 6
    assert engines == ["remote"] * remote + ["local"] * (6 - remote)
    assert finished - killed_at < 30  # noticed at once; the rest is local synthesis time


def test_sigterm_mid_stream_finishes_the_stream_then_exits(serve_process):
    import asyncio
    import signal

    from edge_agent.config import Endpoint
    from edge_agent.offload.client.connection import ClientConnection
    from edge_agent.offload.wire import messages as m

    server = serve_process(PIPER, extra=("--set", "server.shutdown_grace_s=120"))
    text = tuple(f"Sentence {n} of a message that is still being read." for n in range(8))

    async def go():
        conn = await ClientConnection.open(Endpoint("tcp", "127.0.0.1", server.port), PSK, timeout=10)
        try:
            q: asyncio.Queue = asyncio.Queue()
            await conn.request(q.put_nowait, text, PIPER, m.Codec.OPUS)
            msgs = [await asyncio.wait_for(q.get(), 30)]
            server.proc.send_signal(signal.SIGTERM)
            while not isinstance(msgs[-1], m.End | m.Error | Exception):
                msgs.append(await asyncio.wait_for(q.get(), 30))
            return msgs, conn.going_away
        finally:
            await conn.close()

    msgs, told = asyncio.run(go())
    assert told, "the client should have received GOAWAY"
    assert isinstance(msgs[-1], m.End) and not msgs[-1].cancelled
    assert len({x.sentence for x in msgs if isinstance(x, m.Audio)}) == len(text)
    assert server.proc.wait(30) == 0


def test_serve_says_how_to_fetch_a_missing_model(tmp_path):
    result = run_cli("serve", "--port", "0", "--set", "server.voices=[kokoro-82m]",
                     env={"EDGE_OFFLOAD_PSK": PSK.decode(), "EDGE_SPEECH_CACHE": str(tmp_path / "empty")},
                     timeout=60)
    assert result.returncode == 2
    assert "edge-agent models fetch kokoro-82m" in result.stderr


def test_serve_reports_a_port_in_use():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("serve", "--port", str(port), "--set", f"server.voices=[{PIPER}]",
                         env={"EDGE_OFFLOAD_PSK": PSK.decode()}, timeout=60)
    assert result.returncode == 2
    assert "cannot listen" in result.stderr


def test_say_remote_with_more_text_than_one_request_holds_sends_several(serve_process, tmp_path):
    """Text over what one request may carry goes as several requests, all remote (over the
    frame limit, `say --remote` used to end with a traceback, exit 1)."""
    server = serve_process(PIPER)
    out = tmp_path / "long.wav"
    text = " ".join(f"Turn left at light {i}." for i in range(8))  # about 190 characters
    result = run_cli("say", "-v", "--remote", server.uri, "--voice", PIPER, "--out", str(out), text,
                     "--set", "offload.max_request_chars=50", env={"EDGE_OFFLOAD_PSK": PSK.decode()})
    assert result.returncode == 0, result.stderr
    assert "(engine: remote)" in result.stdout and "in 8 sentences (remote)" in result.stderr
    assert out.stat().st_size > 44 + 8 * 22050  # 8 sentences of at least half a second


def test_request_end_keeps_each_request_within_the_servers_limits():
    from edge_agent.offload.client.router import request_end

    sentences = ["abc", "défg", "h" * 10, "i"]
    assert request_end(sentences, 0, max_chars=7, max_bytes=1000) == 2
    assert request_end(sentences, 0, max_chars=100, max_bytes=10) == 2  # "abc\\n" + "défg\\n" (5 bytes)
    assert request_end(sentences, 2, max_chars=5, max_bytes=5) == 3  # one sentence always goes
    assert request_end(sentences, 3, max_chars=5, max_bytes=5) == 4
