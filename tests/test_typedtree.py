from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import pytest

from edge_agent.errors import ConfigError
from edge_agent.typedtree import build, describe, merge, to_dict, upgrade, upgrade_key


@dataclass(frozen=True)
class Inner:
    rate: int = 16000
    gain: float = 1.0

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate: must be positive, not {self.rate}")


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    on: bool = False
    mode: Literal["a", "b"] = "a"
    path: Path | None = None
    tags: tuple[str, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)
    inners: tuple[Inner, ...] = ()


def test_plain_data_builds_the_typed_tree():
    built = build(Outer, {"name": "n", "on": True, "mode": "b", "path": "~/p", "tags": ["t"],
                          "limits": {"k": 2}, "inner": {"rate": 8000, "gain": 2},
                          "inners": [{"rate": 1}]})
    assert built == Outer("n", True, "b", Path("~/p").expanduser(), ("t",), {"k": 2},
                          Inner(8000, 2.0), (Inner(1),))
    assert isinstance(built.inner.gain, float)


def test_missing_data_means_the_defaults():
    assert build(Outer, None) == Outer()
    assert build(Outer, {"path": None, "inner": None}) == Outer()


def test_unknown_key_names_its_path_and_the_known_ones():
    with pytest.raises(ConfigError, match=r"^inner\.rat: unknown key \(expected one of: gain, rate\)$"):
        build(Outer, {"inner": {"rat": 1}})


@pytest.mark.parametrize(("data", "message"), [
    ({"on": 1}, r"^on: expected true or false, got int 1$"),
    ({"inner": {"rate": True}}, r"^inner\.rate: expected an integer, got a boolean$"),
    ({"inner": {"gain": "loud"}}, r"^inner\.gain: expected a number, got a string$"),
    ({"name": 3}, r"^name: expected a string, got int 3$"),
    ({"path": ""}, r"^path: expected a path, got a string$"),
    ({"mode": "c"}, r"^mode: 'c' is not one of 'a', 'b'$"),
    ({"tags": "t"}, r"^tags: expected a list, got a string$"),
    ({"tags": ["t", 1]}, r"^tags\[1\]: expected a string, got int 1$"),
    ({"limits": {"k": "v"}}, r"^limits\.k: expected an integer, got a string$"),
    ({"limits": []}, r"^limits: expected a mapping, got a list$"),
    ({"inner": 5}, r"^inner: expected a mapping, got int 5$"),
    ({"inners": [{"rate": 0}]}, r"^inners\[0\]\.rate: must be positive, not 0$"),
])
def test_a_wrong_value_is_named_by_its_key_path(data, message):
    with pytest.raises(ConfigError, match=message):
        build(Outer, data)


def test_a_top_level_check_keeps_its_own_message():
    with pytest.raises(ConfigError, match=r"^rate: must be positive, not -1$"):
        build(Inner, {"rate": -1})
    with pytest.raises(ConfigError, match=r"^config: expected a mapping, got a list$"):
        build(Inner, [1])  # type: ignore[arg-type]


def test_merge_is_deep_and_the_top_wins_without_mutating_either():
    base = {"a": {"x": 1, "y": 2}, "b": 1}
    top = {"a": {"y": 3}, "b": {"z": 1}}
    assert merge(base, top) == {"a": {"x": 1, "y": 3}, "b": {"z": 1}}
    assert base == {"a": {"x": 1, "y": 2}, "b": 1} and top == {"a": {"y": 3}, "b": {"z": 1}}


def test_to_dict_round_trips_through_build():
    tree = Outer(path=Path("/p"), tags=("t",), limits={"k": 1}, inners=(Inner(2),))
    plain = to_dict(tree)
    assert plain["path"] == "/p" and plain["inners"] == [{"rate": 2, "gain": 1.0}]
    assert build(Outer, plain) == tree


def test_describe_names_the_kind_of_a_value():
    assert [describe(v) for v in (None, {}, [], "s", True, 2.5)] == [
        "null", "a mapping", "a list", "a string", "a boolean", "float 2.5"]


@dataclass(frozen=True)
class Renamed:
    RENAMED: ClassVar[dict[str, str]] = {"bound": "limit"}
    limit: int = 1
    inner: Inner = field(default_factory=Inner)


@dataclass(frozen=True)
class Holder:
    section: Renamed = field(default_factory=Renamed)


def test_a_renamed_key_is_read_under_its_new_name_with_a_warning(caplog):
    with caplog.at_level("WARNING", logger="edge_agent.typedtree"):
        assert build(Holder, {"section": {"bound": 4}}) == Holder(Renamed(limit=4))
    assert [r.getMessage() for r in caplog.records] == [
        "section.bound: renamed to section.limit; read as that for now, but write section.limit: "
        "the old name will go"]


def test_a_renamed_key_given_under_both_names_is_an_error():
    with pytest.raises(ConfigError, match=r"^section\.bound: renamed to section\.limit, which is given too; "
                                          r"keep only section\.limit$"):
        build(Holder, {"section": {"bound": 4, "limit": 5}})


def test_upgrade_renames_one_layer_through_its_sections_and_leaves_the_rest():
    layer = {"section": {"bound": 4, "inner": {"rate": 8000}}, "other": [1]}
    assert upgrade(Holder, layer) == {"section": {"limit": 4, "inner": {"rate": 8000}}, "other": [1]}
    assert layer["section"] == {"bound": 4, "inner": {"rate": 8000}}  # not mutated
    assert upgrade(Holder, {"section": 3}) == {"section": 3}  # left for build to refuse
    assert upgrade_key(Holder, "section.bound") == "section.limit"
    assert upgrade_key(Holder, "section.inner.rate") == "section.inner.rate"
    assert upgrade_key(Holder, "nothing.bound") == "nothing.bound"
