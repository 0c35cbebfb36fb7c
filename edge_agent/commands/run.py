"""`edge-agent run`: the device daemon (announcements, fleet config, listener, status, metrics)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from edge_agent.config import parse_override, parse_uri
from edge_agent.daemon import Daemon, SettingsSource
from edge_agent.errors import UsageError
from edge_agent.logs import setup_logging


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", parents=[common], help="run the device daemon",
                       description="Listen, speak MQTT announcements and accept signed fleet config. "
                                   "Keeps running without a broker (reconnecting) or a sound card "
                                   "(configured fallback); stops cleanly on SIGTERM.")
    p.add_argument("--broker", metavar="mqtt://HOST:PORT", help="MQTT broker (default: mqtt.broker)")
    p.add_argument("--device-id", metavar="ID", help="device id in topics (default: device.id or host name)")
    p.add_argument("--group", metavar="G", help="fleet group (default: device.group)")
    p.add_argument("--out-dir", metavar="DIR", type=Path,
                   help="write each announcement to DIR/<id>.wav instead of the sound card")
    p.set_defaults(handler=run)


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = dict(parse_override(item) for item in args.overrides)
    if args.broker is not None:
        try:
            parse_uri(args.broker, ("mqtt", "mqtts"))
        except ValueError as exc:
            raise UsageError(f"--broker: {exc}") from None
        out["mqtt.broker"] = args.broker
    if args.device_id is not None:
        out["device.id"] = args.device_id
    if args.group is not None:
        out["device.group"] = args.group
    if args.out_dir is not None:
        if args.out_dir.exists() and not args.out_dir.is_dir():
            raise UsageError(f"--out-dir {args.out_dir}: not a directory")
        out["daemon.out_dir"] = str(args.out_dir)
    return out


def run(args: argparse.Namespace) -> int:
    source = SettingsSource(Path(args.config) if args.config else None, overrides(args))
    settings = source.build()
    # Structured lines for journald and log shippers; plain ones on a terminal unless asked.
    json_lines = settings.logging.json or not sys.stderr.isatty()
    level = "debug" if args.verbose > 1 else settings.logging.level
    setup_logging(json_lines=json_lines, level=level)
    logging.captureWarnings(True)
    daemon = Daemon(source)
    return asyncio.run(daemon.run())
