"""A model's JSON file (an export's `manifest.json`, a checkpoint's `config.json`), read with its
failures as a `ModelError` that names the file: the runtime and the exporter read them alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge_agent.errors import ModelError


def read_json(path: Path, missing: str, unreadable: str = "unreadable") -> Any:
    """The JSON document in `path`, unchecked (the caller knows its shape).

    An absent file is `{path}: missing ({missing})`, `missing` saying what the directory is not or
    lacks; a file that cannot be read or parsed is `{path}: {unreadable} ({the reason})`.
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path}: missing ({missing})") from None
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: {unreadable} ({exc})") from None
