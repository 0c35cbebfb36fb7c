"""Checks the settings share."""

from __future__ import annotations


def positive(obj: object, *names: str) -> None:
    """Raise ValueError naming the first of `names` (attributes of `obj`) that is not positive."""
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ValueError(f"{name}: must be positive, not {value}")
