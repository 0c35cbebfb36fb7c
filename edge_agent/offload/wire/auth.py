"""Pre-shared-key challenge-response: HMAC-SHA256 over both nonces and both offers.

Client HELLO carries nonce_c, server CHALLENGE carries nonce_s. The client
proves the key with HMAC(key, "edge-offload/1 client" | HELLO | CHALLENGE),
the server answers with HMAC(key, "edge-offload/1 server" | HELLO | CHALLENGE),
so each side knows the other holds the key and that neither offer (codecs,
frame limits) was altered on the way. The key never crosses the wire. This
authenticates the connection, not each frame: on an untrusted network, use TLS
as well.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from edge_agent.errors import ConfigError
from edge_agent.offload.wire.messages import MAC_SIZE, NONCE_SIZE

log = logging.getLogger(__name__)

PSK_ENV = "EDGE_OFFLOAD_PSK"
"""Environment variable holding the pre-shared key (when no key file is configured)."""
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 4096
_CLIENT = b"edge-offload/1 client"
_SERVER = b"edge-offload/1 server"


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_SIZE)


def client_proof(key: bytes, hello: bytes, challenge: bytes) -> bytes:
    return hmac.new(key, _CLIENT + hello + challenge, hashlib.sha256).digest()


def server_proof(key: bytes, hello: bytes, challenge: bytes) -> bytes:
    return hmac.new(key, _SERVER + hello + challenge, hashlib.sha256).digest()


def verify(expected: bytes, got: bytes) -> bool:
    """Constant-time comparison."""
    return len(got) == MAC_SIZE and hmac.compare_digest(expected, got)


def _check(key: bytes, source: str) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(f"{source}: the pre-shared key is {len(key)} bytes; use at least "
                          f"{MIN_KEY_BYTES} (e.g. `openssl rand -hex 32`)")
    return key


def load_psk(path: Path | None, env: Mapping[str, str] | None = None) -> bytes | None:
    """The key from `path` (surrounding whitespace removed), else from $EDGE_OFFLOAD_PSK, else None."""
    env = os.environ if env is None else env
    if path is not None:
        try:
            st = path.stat()
            if st.st_size > MAX_KEY_BYTES:
                raise ConfigError(f"{path}: a key file larger than {MAX_KEY_BYTES} bytes is not a key")
            raw = path.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"psk_file {path}: cannot read ({exc.strerror})") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("key file %s is readable by others (mode %o); chmod 600 it",
                        path, stat.S_IMODE(st.st_mode))
        return _check(raw, str(path))
    value = env.get(PSK_ENV, "").strip()
    if value:
        return _check(value.encode("utf-8"), PSK_ENV)
    return None
