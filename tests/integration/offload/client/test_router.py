"""The router against real servers that work, die, stall or are absent: every sentence exactly once."""

from __future__ import annotations

import time

import pytest

from edge_agent.offload.client.breaker import BreakerState
from edge_agent.offload.wire.transport import OffloadError
from edge_agent.tts.voice import VoiceOffer
from tests.integration.offload.offload_helpers import PIPER, free_port, make_router, only_client, spoken
from tests.waiting import wait_until

TEXT = "The washing machine has finished. Please move the clothes to the dryer. Thank you."
LONG = " ".join(f"This is sentence number {n} of the evening announcement." for n in
                ("one", "two", "three", "four", "five", "six"))


def test_healthy_server_speaks_every_sentence_remotely(serve, local_synth):
    server = serve()
    for codec in ("pcm16", "opus"):
        router = make_router(local_synth, server.uri, voice=PIPER, codec=codec)
        try:
            chunks = list(router.stream(TEXT))
        finally:
            router.close()
        assert spoken(chunks, 3) == ["remote"] * 3
        assert {c.sample_rate for c in chunks} == {router.sample_rate()} == {22050}
    assert server.server.metrics.counters["streams_done"] == 2


def test_server_dying_mid_sentence_leaves_no_sentence_lost_or_repeated(scripted, local_synth):
    peer = scripted("partial")
    router = make_router(local_synth, peer.uri, sentence_timeout_s=30)
    started = time.monotonic()
    try:
        chunks = list(router.stream(TEXT))
    finally:
        router.close()
    # Sentence 0 arrived whole; sentence 1 only in part, so it is spoken locally, in full, once.
    assert spoken(chunks, 3) == ["remote", "local", "local"]
    # The lost connection is noticed at once, not when a timeout runs out.
    assert time.monotonic() - started < 10
    assert len(peer.requests) == 1 and len(peer.requests[0].sentences) == 3


def test_stalled_server_is_abandoned_after_the_sentence_timeout(scripted, local_synth):
    peer = scripted("stall")
    router = make_router(local_synth, peer.uri, sentence_timeout_s=0.5)
    started = time.monotonic()
    try:
        chunks = list(router.stream(TEXT))
    finally:
        router.close()
    assert spoken(chunks, 3) == ["remote", "local", "local"]
    # The 1 s remote sentence is heard while we wait, so the wait is about max(0.5, 1.0) s.
    assert time.monotonic() - started < 8
    assert peer.cancels == [peer.requests[0].stream]


def test_a_dead_link_moves_on_before_the_sentence_timeout(scripted, local_synth):
    peer = scripted("deaf")
    router = make_router(local_synth, peer.uri, sentence_timeout_s=5, stall_probe_s=0.6)
    try:
        started = time.monotonic()
        chunks = list(router.stream(TEXT))
        elapsed = time.monotonic() - started
    finally:
        router.close()
    assert spoken(chunks, 3) == ["remote", "local", "local"]
    # Sentence 0 is 1 s of tone: at 0.4 s left the server is pinged, no PONG by 0.3 s later, and the
    # rest is spoken locally; not after the 5 s sentence timeout.
    assert elapsed < 4.0


def test_server_that_never_answers_misses_the_first_audio_deadline(scripted, local_synth):
    peer = scripted("silent")
    router = make_router(local_synth, peer.uri, first_audio_deadline_s=0.6)
    first = None
    started = time.monotonic()
    try:
        chunks = []
        for chunk in router.stream(TEXT):
            first = first or time.monotonic() - started
            chunks.append(chunk)
    finally:
        router.close()
    assert spoken(chunks, 3) == ["local"] * 3
    assert 0.5 < first < 0.6 + 3.0  # the deadline, then one local sentence
    wait_until(lambda: peer.cancels, 2, "the cancel")
    assert peer.cancels == [peer.requests[0].stream]


def test_absent_server_gives_local_audio_within_the_deadline(local_synth):
    router = make_router(local_synth, f"tcp://127.0.0.1:{free_port()}", first_audio_deadline_s=1.0)
    try:
        started = time.monotonic()
        stream = router.stream(TEXT)
        first = next(stream)
        ttfa = time.monotonic() - started
        chunks = [first, *stream]
    finally:
        router.close()
    assert spoken(chunks, 3) == ["local"] * 3
    assert ttfa < 1.0 + 2.0
    assert only_client(router).breaker.last_failure.startswith("connect")


def test_open_breaker_keeps_utterances_local_without_asking_the_server(scripted, local_synth):
    peer = scripted("silent")
    router = make_router(local_synth, peer.uri, first_audio_deadline_s=0.3, breaker_failures=1,
                         breaker_open_s=60)
    try:
        spoken(list(router.stream(TEXT)), 3)
        assert only_client(router).breaker.state.value == "open"
        assert spoken(list(router.stream(TEXT)), 3) == ["local"] * 3
    finally:
        router.close()
    assert len(peer.requests) == 1


def test_remote_policy_fails_instead_of_speaking_locally(local_synth):
    router = make_router(local_synth, f"tcp://127.0.0.1:{free_port()}", policy="remote")
    try:
        with pytest.raises(OffloadError, match="remote synthesis failed at sentence 0"):
            list(router.stream(TEXT))
    finally:
        router.close()


def test_local_policy_never_contacts_the_server(scripted, local_synth):
    peer = scripted("silent")
    router = make_router(local_synth, peer.uri, policy="local")
    try:
        assert spoken(list(router.stream(TEXT)), 3) == ["local"] * 3
    finally:
        router.close()
    assert peer.requests == []


def test_voice_the_server_does_not_offer_is_spoken_locally(serve, local_synth):
    server = serve()
    router = make_router(local_synth, server.uri, voice="kokoro-82m")  # the test server has Piper only
    try:
        assert spoken(list(router.stream(TEXT)), 3) == ["local"] * 3
        assert only_client(router).breaker.state.value == "closed"
    finally:
        router.close()


def test_wrong_key_falls_back_to_local(serve, local_synth):
    server = serve()
    router = make_router(local_synth, server.uri, psk=b"not-the-server-key-at-all", voice=PIPER)
    try:
        assert spoken(list(router.stream(TEXT)), 3) == ["local"] * 3
    finally:
        router.close()
    assert server.server.metrics.counters["auth_failures"] >= 1


def test_listener_stopping_early_cancels_the_remote_stream(serve, local_synth):
    server = serve(workers=1)
    router = make_router(local_synth, server.uri, voice=PIPER)
    try:
        stream = router.stream(LONG)
        next(stream)
        stream.close()
        wait_until(lambda: server.server.metrics.counters["streams_cancelled"], 5, "the cancel")
    finally:
        router.close()
    assert server.server.metrics.counters["streams_cancelled"] == 1


def test_audio_piling_up_unread_fails_the_stream_over_to_local(serve, local_synth, monkeypatch):
    from edge_agent.offload.client.stream import RemoteStream

    monkeypatch.setattr(RemoteStream, "MAX_BUFFERED", 10_000)
    server = serve()
    router = make_router(local_synth, server.uri, voice=PIPER)
    try:
        assert spoken(list(router.stream(TEXT)), 3) == ["local"] * 3
        wait_until(lambda: server.server.metrics.counters["streams_cancelled"], 5, "the cancel")
    finally:
        router.close()
    assert server.server.metrics.counters["streams_cancelled"] == 1


def test_client_reconnects_when_the_server_comes_back(serve, local_synth):
    port = free_port()
    first = serve(port=port)
    router = make_router(local_synth, first.uri, voice=PIPER, breaker_open_s=0.3, ping_interval_s=0.2)
    try:
        assert spoken(list(router.stream(TEXT)), 3) == ["remote"] * 3
        first.stop()
        assert spoken(list(router.stream(TEXT)), 3) == ["local"] * 3
        serve(port=port)
        wait_until(lambda: only_client(router).connection, 10, "the reconnect")
        wait_until(lambda: only_client(router).breaker.state is BreakerState.CLOSED, 10,
                   "a ping to close the breaker after its cool-down")
        assert spoken(list(router.stream(TEXT)), 3) == ["remote"] * 3
        assert only_client(router).connects == 2
    finally:
        router.close()


def test_offers_say_a_server_voice_is_reachable_only_while_a_connected_server_offers_it(serve, local_synth):
    server = serve()
    router = make_router(local_synth, server.uri, voice=PIPER)
    try:
        assert router.pool.wait_ready(30)
        assert router.offers() == [VoiceOffer(PIPER, "local", True), VoiceOffer(PIPER, "remote", True)]
        server.stop()  # GOAWAY, then the connection closes: no server offers it any more
        wait_until(lambda: router.offers()[1:] == [VoiceOffer(PIPER, "remote", False)], 10,
                   "the configured voice to be offered as unreachable")
    finally:
        router.close()


def test_offers_count_an_open_breaker_as_unreachable_and_spend_no_half_open_probe(scripted, local_synth):
    peer = scripted("silent")
    router = make_router(local_synth, peer.uri, first_audio_deadline_s=0.3, breaker_failures=1,
                         breaker_open_s=60, ping_interval_s=30)
    try:
        assert router.pool.wait_ready(10)
        assert VoiceOffer("kokoro-82m", "remote", True) in router.offers()
        spoken(list(router.stream(TEXT)), 3)  # no audio by the deadline: the breaker opens
        assert router.offers()[1:] == [VoiceOffer("kokoro-82m", "remote", False)]
        breaker = only_client(router).breaker
        breaker.open_s = 0.0  # the cool-down is over: half open, one probe allowed
        assert router.offers()[1:] == [VoiceOffer("kokoro-82m", "remote", True)]
        assert breaker.state is BreakerState.HALF_OPEN
        assert breaker.allow()  # asking for offers did not take the probe
    finally:
        router.close()
    assert len(peer.requests) == 1


def test_offers_hold_only_the_local_voice_when_the_policy_is_local(local_synth):
    router = make_router(local_synth, f"tcp://127.0.0.1:{free_port()}", policy="local")
    try:
        assert router.offers() == [VoiceOffer(PIPER, "local", True)]
    finally:
        router.close()
