"""Logging set-up and its settings section (`logging`): plain lines on a terminal, one JSON object
per line in the daemon."""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class LoggingSettings:
    """Log output."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    json: bool = False
    """One JSON object per line (the daemon's default under systemd)."""


_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """`{"ts":..., "level":..., "logger":..., "msg":..., **extra}` per record."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup_logging(verbosity: int = 0, *, json_lines: bool = False, level: str | None = None) -> None:
    """Configure the root logger once; later calls replace the handler."""
    if level is None:
        level = "warning" if verbosity <= 0 else "info" if verbosity == 1 else "debug"
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        fmt.converter = time.localtime
        handler.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class Throttle:
    """At most one line per `interval_s` for a condition that can repeat many times a second.

    `ready()` is True for the first call and then once per interval; `suppressed` says
    how many calls were swallowed since the last line, so that line can tell.
    """

    def __init__(self, interval_s: float, clock: Any = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._next = float("-inf")
        self.suppressed = 0

    def ready(self) -> bool:
        now = self._clock()
        if now < self._next:
            self.suppressed += 1
            return False
        self._next = now + self.interval_s
        return True

    def take_suppressed(self) -> int:
        """How many lines were swallowed since the last one (and start counting again)."""
        count, self.suppressed = self.suppressed, 0
        return count

    def reset(self) -> None:
        """The condition is over: the next occurrence is logged at once."""
        self._next = float("-inf")
        self.suppressed = 0
