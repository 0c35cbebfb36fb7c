"""What goes wrong between a device and one server: each error means local synthesis may take over."""

from __future__ import annotations

from edge_agent.offload.wire.transport import OffloadError


class RemoteError(OffloadError):
    """The server answered a request with ERROR."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(f"server error {name}: {message}")
        self.code = code
        self.name = name


class RemoteTimeout(OffloadError):
    """The server did not deliver in time (first-audio or sentence deadline)."""


class Unavailable(OffloadError):
    """No usable connection to the server right now."""
