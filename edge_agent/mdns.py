"""Zeroconf (mDNS) advertisement of the device's servers (Wyoming, the ESPHome API).

Home Assistant browses for each service type and offers each instance it finds as
a new device; an instance is named after the device id. A server bound to every
address (`0.0.0.0`) is advertised on every interface with each interface's IPv4
address; one bound to a single address only there.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Mapping

import ifaddr
from zeroconf import InterfaceChoice, IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 10.0
"""mDNS probing takes about a second; a network that swallows it must not hold up the start."""


def label(device_id: str, suffix: str = "") -> str:
    """`device_id` as an mDNS label (at most 63 bytes, no dots); `suffix` is kept whole, so two
    endpoints of one device never share a name."""
    room = 63 - len(suffix.encode("utf-8"))
    return device_id.replace(".", "-").encode("utf-8")[:room].decode("utf-8", "ignore") + suffix


def addresses_for(host: str) -> list[str]:
    """IPv4 addresses to advertise for a server listening on `host`."""
    if host not in ("0.0.0.0", "", "::"):
        return [host]
    found = [str(ip.ip) for adapter in ifaddr.get_adapters() for ip in adapter.ips
             if isinstance(ip.ip, str) and not ipaddress.ip_address(ip.ip).is_loopback]
    return found or ["127.0.0.1"]


class Advertisement:
    """One registered service instance; `start` registers it, `stop` says goodbye."""

    def __init__(self, service_type: str, device_id: str, host: str, port: int,
                 properties: Mapping[str, str], *, suffix: str = "", hostname: str | None = None) -> None:
        self.service_type = service_type
        self.name = f"{label(device_id, suffix)}.{service_type}"
        self.host = host
        self.port = port
        self.properties = dict(properties)
        self.hostname = hostname
        """The host name (`NAME.local.`) some browsers read the device's name from."""
        self.addresses = addresses_for(host)
        self._zc: AsyncZeroconf | None = None
        self._info: AsyncServiceInfo | None = None

    async def start(self) -> None:
        interfaces: InterfaceChoice | list[str] = (
            InterfaceChoice.All if self.host in ("0.0.0.0", "", "::") else [self.host])
        zc = AsyncZeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only)
        info = AsyncServiceInfo(
            self.service_type, self.name, port=self.port,
            addresses=[socket.inet_aton(a) for a in self.addresses],
            properties=self.properties, server=self.hostname,
        )
        self._zc, self._info = zc, info
        try:
            registering = await zc.async_register_service(info, allow_name_change=True)
            await asyncio.wait_for(registering, REGISTER_TIMEOUT_S)
        except Exception:
            await self.stop()
            raise
        self.name = info.name  # a clash on the network renames it ("kitchen (2)")
        log.info("advertised %s on %s port %d", self.name, ", ".join(self.addresses), self.port)

    async def stop(self) -> None:
        zc, info, self._zc, self._info = self._zc, self._info, None, None
        if zc is None:
            return
        try:
            if info is not None:
                await asyncio.wait_for(zc.async_unregister_service(info), REGISTER_TIMEOUT_S)
        except Exception as exc:  # a goodbye that cannot be sent only delays others noticing
            log.debug("zeroconf goodbye failed: %s", exc)
        finally:
            await zc.async_close()
