"""`/metrics`, `/ready` and `/live` on a real server, scraped over HTTP and parsed by Prometheus' parser."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge_agent.offload.server.http_monitor import Monitor
from tests.integration.offload.offload_helpers import PIPER, make_router, spoken

TEXT = "The washing machine has finished. Please move the clothes to the dryer. Thank you."


@pytest.fixture
def monitored(serve):
    """A server with its monitor on the same loop; yields (server, monitor, base URL)."""
    server = serve()
    monitor = Monitor(server.server.metrics, "127.0.0.1", 0)
    host, port = server.call(monitor.start())
    yield server, monitor, f"http://{host}:{port}"
    server.call(monitor.close())


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(base: str) -> dict[str, float]:
    status, body = get(f"{base}/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_probes_say_live_always_and_ready_only_when_told(monitored):
    _server, monitor, base = monitored
    assert get(f"{base}/live") == (200, b"live\n")
    assert get(f"{base}/ready")[0] == 503
    monitor.ready = True
    assert get(f"{base}/ready") == (200, b"ready\n")
    assert scrape(base)["edge_serve_ready"] == 1.0


def test_a_served_utterance_shows_in_every_metric(monitored, local_synth):
    server, _monitor, base = monitored
    router = make_router(local_synth, server.uri, voice=PIPER)
    try:
        assert spoken(list(router.stream(TEXT)), 3) == ["remote"] * 3
    finally:
        router.close()
    m = scrape(base)
    assert m["edge_serve_requests_total"] == 1
    assert m["edge_serve_streams_total{outcome=done}"] == 1
    assert m["edge_serve_first_audio_seconds_count"] == 1
    assert 0 < m["edge_serve_first_audio_seconds_sum"] < 30
    assert m["edge_serve_sentence_seconds_count"] == 3
    assert m["edge_serve_real_time_factor_count"] == 3
    assert m["edge_serve_real_time_factor_bucket{le=+Inf}"] == 3
    assert m["edge_serve_audio_seconds_total"] > 1.0
    assert m["edge_serve_active_streams"] == 0 and m["edge_serve_queue_depth"] == 0


def test_auth_failures_and_busy_answers_are_counted(serve, local_synth):
    server = serve(workers=1, max_streams=1)
    monitor = Monitor(server.server.metrics, "127.0.0.1", 0)
    host, port = server.call(monitor.start())
    base = f"http://{host}:{port}"
    try:
        wrong = make_router(local_synth, server.uri, psk=b"not-the-server-key-at-all", voice=PIPER)
        try:
            assert spoken(list(wrong.stream(TEXT)), 3) == ["local"] * 3
        finally:
            wrong.close()
        router = make_router(local_synth, server.uri, voice=PIPER)
        try:
            router.pool.wait_ready(10)
            client = router.pool.clients[0]
            from edge_agent.offload.wire.messages import Codec

            held = client.open_stream(TEXT.split(". "), PIPER, Codec.PCM16)  # fills the queue of one
            refused = client.open_stream(["One more."], PIPER, Codec.PCM16)
            with pytest.raises(Exception, match="BUSY"):
                refused.next_sentence(10)
            held.cancel()
        finally:
            router.close()
        m = scrape(base)
        assert m["edge_serve_auth_failures_total"] >= 1
        assert m["edge_serve_busy_total"] == 1
        assert m["edge_serve_rejected_total{code=busy}"] == 1
    finally:
        server.call(monitor.close())


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /nothing HTTP/1.1\r\n\r\n", b"404"),
    (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
    (b"garbage\r\n\r\n", b"400"),
    (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", b"400"),
])
def test_bad_requests_get_a_clear_status_and_a_closed_connection(monitored, request_bytes, status):
    _server, _monitor, base = monitored
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request_bytes)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.split(b" ")[1] == status
