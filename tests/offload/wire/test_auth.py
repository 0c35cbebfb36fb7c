import logging

import pytest

from edge_agent.errors import ConfigError
from edge_agent.offload.wire import auth

KEY = b"0123456789abcdef0123456789abcdef"


def test_key_file_wins_over_the_environment(tmp_path):
    path = tmp_path / "offload.key"
    path.write_bytes(KEY + b"\n")
    path.chmod(0o600)
    assert auth.load_psk(path, {auth.PSK_ENV: "x" * 40}) == KEY


def test_environment_key_is_used_without_a_file():
    assert auth.load_psk(None, {auth.PSK_ENV: f"  {KEY.decode()}\n"}) == KEY


def test_no_key_anywhere_is_none():
    assert auth.load_psk(None, {}) is None


def test_short_key_is_refused_with_a_hint():
    with pytest.raises(ConfigError, match=r"EDGE_OFFLOAD_PSK: .* 5 bytes; use at least 16"):
        auth.load_psk(None, {auth.PSK_ENV: "short"})


def test_unreadable_key_file_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"missing\.key: cannot read"):
        auth.load_psk(tmp_path / "missing.key", {})


def test_world_readable_key_file_is_warned_about(tmp_path, caplog):
    path = tmp_path / "offload.key"
    path.write_bytes(KEY)
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        auth.load_psk(path, {})
    assert "readable by others" in caplog.text


def test_proofs_bind_direction_and_transcript():
    hello, challenge = b"hello-payload", b"challenge-payload"
    client = auth.client_proof(KEY, hello, challenge)
    assert client != auth.server_proof(KEY, hello, challenge)
    assert client != auth.client_proof(KEY, hello, challenge + b"x")
    assert auth.verify(client, auth.client_proof(KEY, hello, challenge))
    assert not auth.verify(client, auth.client_proof(b"another key of 16+ bytes", hello, challenge))
    assert not auth.verify(client, client[:-1])
    assert len(auth.new_nonce()) == 16 and auth.new_nonce() != auth.new_nonce()
