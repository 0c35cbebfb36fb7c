"""Fixtures of esphome_support."""

from tests.esphome_support import device, media  # noqa: F401
