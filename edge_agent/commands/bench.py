"""`edge-agent bench SUBJECT [--json]`: performance against a reference, measured side by side.

The benchmarks ship apart from the device runtime (the `edge-speech-tools` distribution in
`tools/`), so this verb finds them by entry point group and never imports them by name.
"""

from __future__ import annotations

import argparse
from importlib.metadata import EntryPoint, entry_points

from edge_agent.commands.context import Context
from edge_agent.errors import UsageError

GROUP = "edge_speech.benchmarks"
"""Entry point group: subject name -> module with `add_arguments(parser)` and `run(ctx, args) -> int`."""

INSTALL = ("the benchmarks are not installed (they ship apart from the device runtime); "
           "from an edge-speech checkout: pip install './tools[bench]'")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    found = sorted(entry_points(group=GROUP), key=lambda entry: entry.name)
    if not found:
        _answer_only(sub, "bench", "benchmarks (not installed here)", INSTALL)
        return
    p = sub.add_parser("bench", help="benchmarks: ours against a reference, side by side")
    subjects = p.add_subparsers(dest="subject", metavar="SUBJECT")
    subjects.required = True
    for entry in found:
        _add_subject(subjects, common, entry)


def _add_subject(subjects: argparse._SubParsersAction[argparse.ArgumentParser],
                 common: argparse.ArgumentParser, entry: EntryPoint) -> None:
    try:
        module = entry.load()
    except ImportError as exc:
        # A benchmark whose own imports fail: say which and why when it is asked for, and let
        # the others run.
        _answer_only(subjects, entry.name, f"(unavailable: {exc})",
                     f"bench {entry.name} cannot load {entry.value}: {exc}")
        return
    summary = (module.__doc__ or entry.name).splitlines()[0]
    sp = subjects.add_parser(entry.name, parents=[common], help=summary)
    sp.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    module.add_arguments(sp)
    sp.set_defaults(handler=lambda args, m=module: m.run(Context(args), args))


def _answer_only(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str,
                 reason: str) -> None:
    """A verb that answers `reason` in one line (exit 2) whatever follows it.

    The options it would take belong to code that is not here, so it takes every argument as
    a plain word (no option prefix: an argument cannot hold a NUL), --help included.
    """
    def answer(args: argparse.Namespace) -> int:
        raise UsageError(reason)

    parser = sub.add_parser(name, help=summary, prefix_chars="\0", add_help=False)
    parser.add_argument("rest", nargs="*")
    parser.set_defaults(handler=answer, verbose=0)
