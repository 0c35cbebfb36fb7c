"""The offload wire format (docs/protocol.md): what both sides share, and nothing of either side."""

from edge_agent.offload.wire.auth import PSK_ENV, load_psk
from edge_agent.offload.wire.transport import OffloadError, server_tls_context

__all__ = ["PSK_ENV", "OffloadError", "load_psk", "server_tls_context"]
