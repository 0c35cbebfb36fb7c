"""A typed tree: frozen dataclasses built from plain data (YAML, JSON), and back.

`build` checks every key and type against the dataclass's annotations and names the
key path in each error (`tts.threads: expected an integer, got a string`); a
`ValueError` raised by a dataclass's `__post_init__` becomes a `ConfigError` under
its path. Supported field types: bool, int, float, str, Path, Literal, unions with
None, tuple[X, ...], dict[K, V] and nested dataclasses.

A key that was renamed keeps being read under its old name, so config files written before
keep loading: a dataclass names its old keys in `RENAMED` (old -> new), and each one met logs a
warning naming the new key. `upgrade` applies the renames to one layer of plain data before the
layers are merged, so a later layer's new key wins over an earlier layer's old one.
"""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from edge_agent.errors import ConfigError

T = TypeVar("T")

log = logging.getLogger(__name__)


def build(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Build dataclass `cls` from plain data, checking keys and types recursively."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {describe(data)}")
    assert dataclasses.is_dataclass(cls)
    data = _rename(cls, data, path)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = _join(path, str(unknown[0]))
        raise ConfigError(f"{key}: unknown key (expected one of: {', '.join(sorted(fields))})")
    kwargs = {name: _coerce(hints[name], value, _join(path, name)) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as exc:
        msg = str(exc)
        raise ConfigError(f"{_join(path, msg)}" if path else msg) from None


def upgrade(cls: type[Any], data: Any, path: str = "") -> Any:
    """`data` (one layer of plain data for `cls`) with every renamed key, in `cls` and the sections
    nested in it, under its new name; anything that is not a mapping is left for `build` to judge."""
    if not isinstance(data, Mapping) or not dataclasses.is_dataclass(cls):
        return data
    data = _rename(cls, data, path)
    hints = typing.get_type_hints(cls)
    return {key: upgrade(hints[key], value, _join(path, str(key))) if key in hints else value
            for key, value in data.items()}


def upgrade_key(cls: type[Any], dotted: str) -> str:
    """A dotted key (`server.queue_bound`, as `--set` gives it), its renamed parts under their new names."""
    parts = dotted.split(".")
    tp: Any = cls
    for i, part in enumerate(parts):
        if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
            break
        parts[i] = _new_name(tp, part, ".".join(parts[:i]))
        tp = typing.get_type_hints(tp).get(parts[i])
    return ".".join(parts)


def _rename(cls: type[Any], data: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    old = [key for key in data if key in getattr(cls, "RENAMED", {})]
    if not old:
        return data
    out = dict(data)
    for key in old:
        new = _new_name(cls, key, path)
        if new in data:
            raise ConfigError(f"{_join(path, key)}: renamed to {_join(path, new)}, which is given too; "
                              f"keep only {_join(path, new)}")
        out[new] = out.pop(key)
    return out


def _new_name(cls: type[Any], key: str, path: str) -> str:
    new: str | None = getattr(cls, "RENAMED", {}).get(key)
    if new is None:
        return key
    log.warning("%s: renamed to %s; read as that for now, but write %s: the old name will go",
                _join(path, key), _join(path, new), _join(path, new))
    return new


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for candidate in inner:
            try:
                return _coerce(candidate, value, path)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(f"{path}: {value!r} is not one of {choices}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {describe(value)}")
        return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {describe(value)}")
        return {
            _coerce(args[0], k, path): _coerce(args[1], v, _join(path, str(k)))
            for k, v in value.items()
        }
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)  # type: ignore[arg-type]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {describe(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: expected a number, got {describe(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {describe(value)}")
        return value
    if tp is Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: expected a path, got {describe(value)}")
        return Path(value).expanduser()
    raise ConfigError(f"{path}: unsupported setting type {tp!r}")


def describe(value: Any) -> str:
    """How an error message names a value of the wrong kind (`a list`, `int 3`)."""
    if value is None:
        return "null"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), f"{type(value).__name__} {value!r}"
    )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge two plain config trees; `top` wins, mappings merge key by key."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def to_dict(obj: Any) -> Any:
    """Plain-data form of a settings tree (paths as strings), for printing and diffing."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
