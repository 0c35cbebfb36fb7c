"""`edge-agent wyoming`: the Wyoming server on its own (text to speech, speech to text)."""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from edge_agent.commands.context import Context
from edge_agent.logs import setup_logging
from edge_agent.parts import load_transcriber, load_wake_models, routed_synthesizer, wyoming_service


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("wyoming", parents=[common], help="run the Wyoming server (Home Assistant)",
                       description="Serve our voice and speech recognition over the Wyoming protocol "
                                   "(what Home Assistant's Wyoming integration talks).")
    p.add_argument("--uri", help="tcp://HOST:PORT to listen on (default: wyoming.uri, tcp://0.0.0.0:10300)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    if args.uri:
        overrides["wyoming.uri"] = args.uri
    settings = Context(args, overrides).settings
    setup_logging(verbosity=max(1, args.verbose), json_lines=settings.logging.json)
    synth = routed_synthesizer(settings)
    try:
        service = wyoming_service(settings, lambda: synth, load_transcriber(settings),
                                  load_wake_models(settings))
        asyncio.run(_serve(service))
    finally:
        synth.close()
    return 0


async def _serve(service: Any) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    host, port = await service.start()
    print(f"wyoming server on tcp://{host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await service.stop()
