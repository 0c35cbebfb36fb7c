"""Where state and caches live by default (XDG, or `EDGE_SPEECH_CACHE` for the model cache).

The ground of the settings: the defaults of `audio.fallback_dir`, `models.cache_dir` and the
state directories come from here; it imports nothing of ours.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_home() -> Path:
    """Where the agent keeps its state: `$XDG_STATE_HOME/edge-speech`."""
    return Path(os.environ.get("XDG_STATE_HOME", "~/.local/state")).expanduser() / "edge-speech"


def cache_home() -> Path:
    """Where models are cached: `$EDGE_SPEECH_CACHE`, else `$XDG_CACHE_HOME/edge-speech`."""
    env = os.environ.get("EDGE_SPEECH_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "edge-speech"
