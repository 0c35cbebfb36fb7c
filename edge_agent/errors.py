"""The error hierarchy: every error a user can act on derives from `EdgeError`.

The command line turns an `EdgeError` into one line on stderr and exit code 2;
anything else is an internal failure (exit 1).
"""

from __future__ import annotations

import asyncio
import concurrent.futures

TIMEOUTS: tuple[type[Exception], ...] = (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)
"""What an expired deadline raises: `asyncio.wait_for` and `Future.result(timeout=)` raise their
own classes on Python 3.10 (aliases of the built-in `TimeoutError` from 3.11 on), so a bare
`except TimeoutError` misses them there."""


class EdgeError(Exception):
    """Bad input or environment, explained in a message the user can act on."""


class UsageError(EdgeError):
    """A command was called with arguments that cannot work."""


class ConfigError(EdgeError):
    """A configuration document or value is invalid; the message names the key path."""


class ModelError(EdgeError):
    """A model is unknown, missing, altered or cannot be loaded."""


class AudioError(EdgeError):
    """Audio input or output failed (no device, unreadable file, wrong format)."""
