"""`scheme://host:port` endpoints as the settings write them (MQTT, Wyoming, offload)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Endpoint:
    """A parsed `scheme://host:port`."""

    scheme: str
    host: str
    port: int


def parse_uri(uri: str, schemes: tuple[str, ...]) -> Endpoint:
    """Parse `scheme://host:port` (IPv6 hosts in brackets); ValueError says what is wrong."""
    parts = urlsplit(uri)
    if parts.scheme not in schemes:
        raise ValueError(f"{uri!r}: scheme must be one of {', '.join(s + '://' for s in schemes)}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ValueError(f"{uri!r}: expected {parts.scheme}://HOST:PORT")
    return Endpoint(parts.scheme, parts.hostname, port)
