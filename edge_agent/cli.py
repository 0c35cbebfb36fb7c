"""`edge-agent`: argument parsing and error reporting; each verb lives in `edge_agent.commands`.

Exit codes: 0 ok, 2 bad usage or bad input (one line on stderr), 1 internal failure.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from edge_agent import __version__
from edge_agent.errors import EdgeError
from edge_agent.logs import setup_logging

COMMANDS = ("say", "transcribe", "listen", "run", "serve", "wyoming", "fleet", "models", "doctor", "bench")
"""Verb modules under `edge_agent.commands`, each with `register(subparsers, common)`."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def common_options() -> argparse.ArgumentParser:
    """Options every verb takes."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", help="YAML config file (default: $EDGE_AGENT_CONFIG)")
    common.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                        help="override one setting, e.g. --set tts.threads=1 (repeatable)")
    common.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    return common


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The parser of every verb, or (`verb` given) of that verb alone.

    Each verb module imports what its verb needs, and some of that is heavy
    (cryptography, asyncio servers, the ASR stack); `say` should not pay for
    `serve`. The full parser is built for help, errors and unknown verbs.
    """
    parser = _Parser(prog="edge-agent", description="Offline-first speech appliance.")
    parser.add_argument("--version", action="version", version=f"edge-agent {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    common = common_options()
    for name in COMMANDS if verb is None else (verb,):
        importlib.import_module(f"edge_agent.commands.{name}").register(sub, common)
    return parser


def run_handler(prog: str, args: argparse.Namespace) -> int:
    """Run the chosen verb; turn an `EdgeError` into one line on stderr and exit code 2."""
    setup_logging(verbosity=args.verbose)
    log = logging.getLogger(prog)
    try:
        code: int = args.handler(args)
        return code
    except EdgeError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except Exception:
        log.exception("internal error")
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # The verb is the first argument that is not an option: the top level takes no option
    # with a value, only --help and --version.
    verb = next((a for a in args if not a.startswith("-")), None)
    return run_handler("edge-agent", build_parser(verb if verb in COMMANDS else None).parse_args(args))
