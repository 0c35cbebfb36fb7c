"""Real servers on loopback: in-process (a thread with its own event loop) or `edge-agent serve`."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.config import ServerSettings, TtsSettings
from edge_agent.models import ModelStore, load_catalog
from edge_agent.tts.local import LocalSynthesizer
from edge_agent.tts.registry import VoiceRegistry
from tests.integration.offload.offload_helpers import PIPER, PSK, ServeProcess, ServerThread


@pytest.fixture(scope="session")
def store(shared_cache: Path) -> ModelStore:
    return ModelStore(shared_cache, load_catalog())


@pytest.fixture(scope="session")
def piper_voice(store: ModelStore):
    registry = VoiceRegistry(store, TtsSettings(threads=1))
    return registry.get(PIPER)


@pytest.fixture(scope="session")
def kokoro_store(store: ModelStore) -> ModelStore:
    """The Kokoro model and its English speakers, fetched once into the shared test cache."""
    store.fetch("kokoro-82m")
    store.fetch("kokoro-82m-voices-en")  # the default speaker, af_heart
    return store


@pytest.fixture(scope="session")
def local_synth(store: ModelStore) -> LocalSynthesizer:
    tts = TtsSettings(threads=1, sentence_silence_s=0.0)
    return LocalSynthesizer(VoiceRegistry(store, tts), tts)


@pytest.fixture
def serve(piper_voice):
    """Factory: `serve(**server_settings)` starts an in-process server with the Piper voice."""
    started: list[ServerThread] = []

    def start(voices=None, psk=PSK, tls=None, **overrides) -> ServerThread:
        values = {"host": "127.0.0.1", "port": 0, "voices": (PIPER,), "workers": 2, "threads": 1,
                  "shutdown_grace_s": 2.0, "metrics_interval_s": 0.0} | overrides
        server = ServerThread(ServerSettings(**values), voices or {PIPER: piper_voice}, psk, tls=tls)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
    # Nothing the server started may outlive it (a handler left running logged into pytest's
    # closed stream after the session).
    assert [s.left_running for s in started] == [[] for _ in started]


@pytest.fixture
def serve_process(tmp_path):
    started: list[ServeProcess] = []

    def start(*voices: str, psk: bytes | None = PSK, extra: tuple[str, ...] = ()) -> ServeProcess:
        args = ["--set", f"server.voices=[{', '.join(voices)}]", "--set", "server.shutdown_grace_s=3",
                *extra]
        env = {"EDGE_OFFLOAD_PSK": psk.decode()} if psk else {"EDGE_OFFLOAD_PSK": ""}
        proc = ServeProcess(args, env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


@pytest.fixture
def scripted():
    from tests.integration.offload.offload_helpers import ScriptedServer

    started: list[ScriptedServer] = []

    def start(script: str, **kw) -> ScriptedServer:
        server = ScriptedServer(script, **kw)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
