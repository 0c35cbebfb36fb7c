"""Fixtures of esphome_support."""

from esphome_support import device, media  # noqa: F401
