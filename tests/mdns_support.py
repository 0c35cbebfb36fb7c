"""Zeroconf's own browser on loopback, as Home Assistant's discovery sees an advertisement."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from zeroconf import IPVersion, ServiceStateChange
from zeroconf.asyncio import AsyncServiceBrowser, AsyncZeroconf


@dataclass(frozen=True)
class Seen:
    addresses: list[str]
    port: int
    properties: dict[str, str]
    server: str


async def browse(service_type: str, name: str, timeout: float) -> Seen:
    """The instance `name` of `service_type` once a browser on loopback finds it."""
    zc = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    found: asyncio.Queue[str] = asyncio.Queue()

    def on_change(zeroconf: object, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change is ServiceStateChange.Added:
            found.put_nowait(name)

    browser = AsyncServiceBrowser(zc.zeroconf, service_type, handlers=[on_change])
    try:
        while (seen := await asyncio.wait_for(found.get(), timeout)) != name:
            pass
        info = await zc.async_get_service_info(service_type, seen, 3000)
        assert info is not None
        props = {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
        return Seen(info.parsed_addresses(), int(info.port or 0), props, str(info.server))
    finally:
        await browser.async_cancel()
        await zc.async_close()
