"""Zeroconf (mDNS) advertisement of the Wyoming server as `_wyoming._tcp.local.`.

Home Assistant browses for this service type and offers each instance it finds
as a new Wyoming device; the instance is named after the device id (with a
suffix where the device offers two endpoints: the satellite and its services).
How an instance is registered is `edge_agent.mdns`'s, shared with the ESPHome API.
"""

from __future__ import annotations

from edge_agent import __version__
from edge_agent.mdns import Advertisement, label

SERVICE_TYPE = "_wyoming._tcp.local."


def service_name(device_id: str, suffix: str = "") -> str:
    """The instance name for `device_id` (and `suffix`, kept whole)."""
    return f"{label(device_id, suffix)}.{SERVICE_TYPE}"


def advertisement(device_id: str, host: str, port: int, suffix: str = "") -> Advertisement:
    """The Wyoming server listening on `host`:`port`, as Home Assistant discovers it."""
    return Advertisement(SERVICE_TYPE, device_id, host, port,
                         {"version": __version__, "program": "edge-speech"}, suffix=suffix)
