"""Several servers on loopback: least load first, BUSY and GOAWAY move streams, failures fail over."""

from __future__ import annotations

import time

from edge_agent.config import OffloadSettings
from edge_agent.offload.client.connection import OffloadClient
from edge_agent.offload.client.servers import ServerPool
from edge_agent.offload.wire.messages import Codec
from tests.integration.offload.offload_helpers import PIPER, PSK, InOrder, free_port, make_router, spoken
from tests.mqtt_support import wait_until

TEXT = "The washing machine has finished. Please move the clothes to the dryer. Thank you."
LONG = " ".join(f"This is sentence number {n} of the evening announcement." for n in
                ("one", "two", "three", "four", "five", "six"))


def _requests(server) -> int:
    return server.server.metrics.counters["requests"]


def _connected(router, uri: str) -> bool:
    client = router.pool.client(uri)
    return client is not None and client.connection is not None


def test_one_server_uri_is_a_one_entry_list(serve, local_synth):
    server = serve()
    router = make_router(local_synth, server.uri, voice=PIPER)
    try:
        assert spoken(list(router.stream(TEXT)), 3) == ["remote"] * 3
        assert [c.uri for c in router.pool.clients] == [server.uri]
    finally:
        router.close()


def test_new_stream_goes_to_the_least_loaded_server(serve, local_synth):
    busy, idle = serve(workers=1), serve()
    loader = OffloadClient(OffloadSettings(server=busy.uri), PSK)
    loader.start()
    router = make_router(local_synth, [busy.uri, idle.uri], voice=PIPER, rng=InOrder(), ping_interval_s=0.1)
    try:
        assert loader.wait_ready(10)
        held = loader.open_stream(LONG.split(". "), PIPER, Codec.PCM16)  # six sentences queued, unread
        pool = router.pool
        wait_until(lambda: _connected(router, busy.uri) and pool.client(busy.uri).connection.load > 0,
                   10, "the loaded server to report its load in a PONG")
        assert spoken(list(router.stream(TEXT)), 3) == ["remote"] * 3
        held.cancel()
    finally:
        router.close()
        loader.close()
    assert (_requests(busy), _requests(idle)) == (1, 1)  # the busy one only has the loader's stream


def test_busy_answer_moves_the_stream_to_the_next_server_at_once(scripted, serve, local_synth):
    refusing = scripted("busy", voice=PIPER)
    server = serve()
    router = make_router(local_synth, [refusing.uri, server.uri], voice=PIPER, rng=InOrder(),
                         breaker_failures=1)
    peers = (refusing, server)
    try:
        wait_until(lambda: all(_connected(router, p.uri) for p in peers), 10, "both connections")
        started = time.monotonic()
        chunks = list(router.stream(TEXT))
        elapsed = time.monotonic() - started
        assert spoken(chunks, 3) == ["remote"] * 3
        assert len(refusing.requests) == 1 and _requests(server) == 1
        # BUSY is a healthy server's answer: its breaker stays closed.
        assert router.pool.client(refusing.uri).breaker.state.value == "closed"
    finally:
        router.close()
    assert elapsed < 5.0  # no deadline was waited out (the deadline is 5 s)


def test_server_going_away_gets_no_new_streams(scripted, serve, local_synth):
    draining = scripted("goaway", voice=PIPER)
    server = serve()
    router = make_router(local_synth, [draining.uri, server.uri], voice=PIPER, rng=InOrder())
    try:
        wait_until(lambda: _connected(router, server.uri), 10, "the healthy server")
        wait_until(lambda: (c := router.pool.client(draining.uri)) and c.attempted, 10, "the draining server")
        assert spoken(list(router.stream(TEXT)), 3) == ["remote"] * 3
    finally:
        router.close()
    assert draining.requests == [] and _requests(server) == 1


def test_server_dying_mid_utterance_hands_the_rest_to_the_other(scripted, serve, local_synth):
    dying = scripted("partial", voice=PIPER)
    server = serve()
    router = make_router(local_synth, [dying.uri, server.uri], voice=PIPER, rng=InOrder())
    peers = (dying, server)
    try:
        wait_until(lambda: all(_connected(router, p.uri) for p in peers), 10, "both connections")
        chunks = list(router.stream(TEXT))
    finally:
        router.close()
    # Sentence 0 came whole from the dying server (its 1 s tone), sentence 1 only in part: the
    # other server speaks sentences 1 and 2, each once.
    assert spoken(chunks, 3) == ["remote"] * 3
    assert len(chunks[0].samples) == 22050
    assert len(dying.requests) == 1 and len(dying.requests[0].sentences) == 3
    assert _requests(server) == 1


def test_every_server_down_speaks_locally(local_synth):
    router = make_router(local_synth, [f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"],
                         first_audio_deadline_s=1.0)
    try:
        assert spoken(list(router.stream(TEXT)), 3) == ["local"] * 3
        assert all(c.last_error.startswith("connect") for c in router.pool.clients)
    finally:
        router.close()


def test_a_host_name_stands_for_every_address_it_resolves_to(serve):
    server = serve()
    settings = OffloadSettings(server=f"tcp://localhost:{server.port}", connect_timeout_s=2.0)
    pool = ServerPool(settings, PSK)
    pool.start()
    try:
        assert pool.wait_ready(10)
        assert f"tcp://127.0.0.1:{server.port}" in [c.uri for c in pool.clients]
        assert pool.choose(PIPER) is not None
    finally:
        pool.close()


def test_a_blackholed_server_is_left_at_the_first_audio_deadline_for_the_other(serve, local_synth):
    from benchmarks.failover import Blackhole

    stalled, server = serve(), serve()
    proxy = Blackhole(stalled.port)
    router = make_router(local_synth, [proxy.uri, server.uri], voice=PIPER, rng=InOrder(),
                         first_audio_deadline_s=2.0)
    try:
        wait_until(lambda: _connected(router, proxy.uri) and _connected(router, server.uri), 10,
                   "both connections")
        proxy.blackhole()  # connected, authenticated, then nothing gets through either way
        started = time.monotonic()
        chunks = list(router.stream(TEXT))
        elapsed = time.monotonic() - started
    finally:
        router.close()
        proxy.close()
    assert spoken(chunks, 3) == ["remote"] * 3
    assert _requests(stalled) == 0 and _requests(server) == 1  # the request never got through
    assert elapsed >= 2.0  # noticed only by the deadline: nothing closed
