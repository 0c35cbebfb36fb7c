"""What a verb needs from its arguments: settings, the model store, voices."""

from __future__ import annotations

import argparse
from functools import cached_property
from pathlib import Path
from typing import Any

from edge_agent.config import Settings, load_settings, parse_override
from edge_agent.models import ModelStore, load_catalog


class Context:
    """Lazily built services for one command invocation."""

    def __init__(self, args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> None:
        self.args = args
        self._extra = overrides or {}

    @cached_property
    def settings(self) -> Settings:
        overrides = dict(parse_override(item) for item in self.args.overrides)
        overrides.update(self._extra)
        path = Path(self.args.config) if self.args.config else None
        return load_settings(path, overrides)

    @cached_property
    def store(self) -> ModelStore:
        return ModelStore(self.settings.models.cache_dir, load_catalog(self.settings.models.catalog))
