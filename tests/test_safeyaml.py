import time

import pytest

from edge_agent.errors import ConfigError
from edge_agent.safeyaml import YamlLimits, load_yaml, load_yaml_file

ALIAS_BOMB = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi", strict=True)]
)


def test_alias_bomb_is_rejected_quickly():
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"expands to more than|aliases"):
        load_yaml(ALIAS_BOMB)
    assert time.perf_counter() - started < 1.0


def test_many_aliases_are_rejected():
    doc = "x: &x 1\nl: [" + ", ".join(["*x"] * 100) + "]"
    with pytest.raises(ConfigError, match="more than 64 aliases"):
        load_yaml(doc)


def test_deep_nesting_is_rejected_without_recursion_error():
    with pytest.raises(ConfigError, match="nests deeper"):
        load_yaml("[" * 5000 + "]" * 5000)
    with pytest.raises(ConfigError, match="nests deeper"):
        load_yaml("".join(f"{' ' * i}k{i}:\n" for i in range(100)) + " " * 100 + "leaf: 1")


def test_oversized_document_is_rejected_before_parsing(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: " + b"x" * (10 << 20))
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="limit is"):
        load_yaml_file(big)
    assert time.perf_counter() - started < 1.0


def test_duplicate_keys_are_an_error_not_an_override():
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        load_yaml("a: 1\nb: 2\na: 3\n")


def test_python_tags_are_refused():
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_yaml("!!python/object/apply:os.system ['true']")


def test_plain_documents_load_with_their_types():
    assert load_yaml("a: {b: [1, 2.5, true, null, text]}") == {"a": {"b": [1, 2.5, True, None, "text"]}}


def test_limits_are_configurable():
    with pytest.raises(ConfigError):
        load_yaml("a: [[[1]]]", limits=YamlLimits(max_depth=4))
    assert load_yaml("a: [[1]]", limits=YamlLimits(max_depth=4)) == {"a": [[1]]}


def test_non_utf8_is_a_clear_error():
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_yaml(b"a: \xff\xfe")
