"""The device's side of offload: the synthesizer that prefers a server, and the server check."""

from edge_agent.offload.client.connection import ServerInfo, probe
from edge_agent.offload.client.router import SynthRouter, make_synthesizer

__all__ = ["ServerInfo", "SynthRouter", "make_synthesizer", "probe"]
