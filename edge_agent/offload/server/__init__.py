"""The server's side of offload: `edge-agent serve`, its metrics and its HTTP monitor."""

from edge_agent.offload.server.http_monitor import Monitor
from edge_agent.offload.server.server_metrics import ServerMetrics
from edge_agent.offload.server.synth_server import ServerThread, SynthServer, check_key

__all__ = ["Monitor", "ServerMetrics", "ServerThread", "SynthServer", "check_key"]
