"""YAML for untrusted documents: `safe_load` semantics under hard limits.

`yaml.safe_load` returns a 324-byte alias bomb in milliseconds, and the blow-up
only happens later, when the result is walked. So the limits are enforced while
composing (alias count, nesting depth) and on the composed graph (expanded node
count), before any Python object is built. Duplicate mapping keys are an error
rather than a silent override.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from edge_agent.errors import ConfigError


@dataclass(frozen=True)
class YamlLimits:
    """Bounds on a YAML document; defaults suit configuration files."""

    max_bytes: int = 1 << 20
    """Largest accepted document, in bytes."""
    max_aliases: int = 64
    """Most alias references (`*name`) in one document."""
    max_depth: int = 32
    """Deepest nesting of mappings and sequences."""
    max_nodes: int = 100_000
    """Most nodes once every alias is expanded."""


class _LimitedLoader(yaml.SafeLoader):
    def __init__(self, stream: str, limits: YamlLimits) -> None:
        super().__init__(stream)
        self._limits = limits
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self._limits.max_aliases:
                raise ConfigError(f"YAML has more than {self._limits.max_aliases} aliases")
        self._depth += 1
        if self._depth > self._limits.max_depth:
            raise ConfigError(f"YAML nests deeper than {self._limits.max_depth} levels")
        try:
            return Composer.compose_node(self, parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (dict, list)):
                raise ConfigError(f"YAML mapping key must be a scalar (line {key_node.start_mark.line + 1})")
            if key in seen:
                raise ConfigError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_LimitedLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LimitedLoader.construct_mapping
)


def _expanded_size(node: Node, limit: int) -> int:
    """Count nodes as if every alias were expanded, without expanding anything."""
    memo: dict[int, int] = {}

    def size(n: Node) -> int:
        key = id(n)
        if key in memo:
            return memo[key]
        memo[key] = limit + 1  # a cycle counts as unbounded
        total = 1
        if isinstance(n, SequenceNode):
            total += sum(size(child) for child in n.value)
        elif isinstance(n, MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        memo[key] = min(total, limit + 1)
        return memo[key]

    return size(node)


def load_yaml(data: str | bytes, *, source: str = "<yaml>", limits: YamlLimits | None = None) -> Any:
    """Parse one YAML document with `limits`; raise `ConfigError` naming `source`."""
    limits = limits or YamlLimits()
    if len(data) > limits.max_bytes:
        raise ConfigError(f"{source}: document is {len(data)} bytes, the limit is {limits.max_bytes}")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    loader = _LimitedLoader(data, limits)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        if not isinstance(root, (ScalarNode, SequenceNode, MappingNode)):
            raise ConfigError(f"{source}: unsupported YAML node")
        if _expanded_size(root, limits.max_nodes) > limits.max_nodes:
            raise ConfigError(f"{source}: YAML expands to more than {limits.max_nodes} nodes")
        return loader.construct_document(root)
    except ConfigError as exc:
        msg = str(exc)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {_one_line(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{source}: YAML nests too deeply") from None
    finally:
        loader.dispose()


def load_yaml_file(path: Path, *, limits: YamlLimits | None = None) -> Any:
    """Read and parse `path`, refusing files over the size limit before reading them."""
    limits = limits or YamlLimits()
    try:
        size = path.stat().st_size
        if size > limits.max_bytes:
            raise ConfigError(f"{path}: file is {size} bytes, the limit is {limits.max_bytes}")
        with path.open("rb") as fh:
            data = fh.read(limits.max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return load_yaml(data, source=str(path), limits=limits)


def _one_line(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return str(problem)
