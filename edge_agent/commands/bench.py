"""`edge-agent bench SUBJECT [--json]`: performance against a reference, measured side by side."""

from __future__ import annotations

import argparse
import importlib

from edge_agent.commands.context import Context

SUBJECTS = {
    "tts": "edge_agent.bench.tts",
    "asr": "edge_agent.bench.asr",
    "offload": "edge_agent.bench.offload",
    "mqtt": "edge_agent.bench.mqtt",
    "fleet": "edge_agent.bench.fleet",
    "failover": "edge_agent.bench.failover",
    "wyoming": "edge_agent.bench.wyoming",
    "startup": "edge_agent.bench.startup",
    "wake": "edge_agent.bench.wake",
    "hear": "edge_agent.bench.hear",
}
"""Subject name -> module with `add_arguments(parser)` and `run(ctx, args) -> int`."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("bench", help="benchmarks (tts, ...)")
    subjects = p.add_subparsers(dest="subject", metavar="SUBJECT")
    subjects.required = True
    for name, module_name in SUBJECTS.items():
        module = importlib.import_module(module_name)
        sp = subjects.add_parser(name, parents=[common], help=(module.__doc__ or name).splitlines()[0])
        sp.add_argument("--json", action="store_true", help="print one JSON object as the last line")
        module.add_arguments(sp)
        sp.set_defaults(handler=lambda args, m=module: m.run(Context(args), args))
