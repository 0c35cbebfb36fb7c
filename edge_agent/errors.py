"""The error hierarchy: every error a user can act on derives from `EdgeError`.

The command line turns an `EdgeError` into one line on stderr and exit code 2;
anything else is an internal failure (exit 1).
"""


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
