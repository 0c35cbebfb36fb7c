"""Model store settings (`models.*`): where weights are cached, the catalog."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edge_agent.homes import cache_home


@dataclass(frozen=True)
class ModelSettings:
    """The model store."""

    cache_dir: Path = field(default_factory=lambda: cache_home() / "models")
    """Where fetched and exported models live (never in git)."""
    catalog: Path | None = None
    """Extra catalog file whose entries add to or replace the built-in ones."""
