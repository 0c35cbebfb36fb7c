"""Package exports that load on first use.

A package whose settings section `config` reads (`listen`, `vad`) is imported by every command;
its `__init__` naming the package's classes would load them (Whisper, numpy, ONNX sessions) into
`say` too. Such a package names its exports here, each with the submodule that holds it, and the
submodule loads when the name is first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: each name of `homes` (name -> submodule) imported from
    its submodule when first asked for."""

    def attribute(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)

    return attribute
