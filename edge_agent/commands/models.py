"""`edge-agent models list|fetch|verify`: the model store from the command line."""

from __future__ import annotations

import argparse
import sys

from edge_agent.commands.context import Context
from edge_agent.errors import ModelError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("models", help="list, fetch and verify models")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    ls = verbs.add_parser("list", parents=[common], help="known models and whether they are present")
    ls.set_defaults(handler=list_models)
    fetch = verbs.add_parser("fetch", parents=[common], help="download and verify models")
    fetch.add_argument("ids", nargs="+", metavar="ID")
    fetch.set_defaults(handler=fetch_models)
    verify = verbs.add_parser("verify", parents=[common], help="rehash present models")
    verify.add_argument("ids", nargs="*", metavar="ID", help="default: every present model")
    verify.set_defaults(handler=verify_models)


def list_models(args: argparse.Namespace) -> int:
    store = Context(args).store
    print(f"{'ID':<20} {'TASK':<14} {'SIZE':>9}  {'RATE':>6}  {'STATE':<17} LICENCE")
    for entry in store.catalog:
        states = ["present" if store.locate(entry.id) else "-"]
        # Sources (Whisper, HiFi-GAN) run on the device once `edge-export` has converted them.
        if (store.cache_dir / "exported" / entry.id / "manifest.json").is_file():
            states.append("exported")
        rate = str(entry.sample_rate or "")
        size = f"{entry.total_size / 1e6:.1f} MB"
        state = ", ".join(states)
        print(f"{entry.id:<20} {entry.task:<14} {size:>9}  {rate:>6}  {state:<17} {entry.licence}")
    return 0


def fetch_models(args: argparse.Namespace) -> int:
    store = Context(args).store
    for model_id in args.ids:
        store.catalog.get(model_id)  # unknown ids fail before any download starts
    for model_id in args.ids:
        store.fetch(model_id, progress=lambda line: print(line, file=sys.stderr, flush=True))
    return 0


def verify_models(args: argparse.Namespace) -> int:
    store = Context(args).store
    ids = args.ids or [e.id for e in store.catalog if store.locate(e.id) is not None]
    problems = []
    for model_id in ids:
        found = store.verify(model_id)
        problems.extend(found)
        print(f"{model_id}: {'ok' if not found else 'FAILED'}")
    if problems:
        raise ModelError("; ".join(problems))
    return 0
