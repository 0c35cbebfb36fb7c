"""docs/configuration.md is generated from the settings classes and must match them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from edge_agent import configref
from edge_agent.config import Settings

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"


def test_configuration_page_matches_the_settings_classes():
    expected = configref.render()
    current = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else ""
    assert current == expected, (
        "docs/configuration.md is out of date with the settings classes (a key, default or "
        f"docstring changed): run `{configref.REGENERATE}` from the repository root and commit the result"
    )


def test_every_setting_has_a_docstring():
    missing = [k.key for s in configref.sections(Settings) for k in s.keys if not k.doc]
    assert not missing, (
        f"settings without a docstring under the field: {', '.join(missing)} "
        f"(write one, then run `{configref.REGENERATE}`)"
    )


@dataclass(frozen=True)
class _Inner:
    """The inner section."""

    rate: int = 16000
    """Hertz."""


@dataclass(frozen=True)
class _Outer:
    """The outer section."""

    mode: Literal["wake", "always"] = "wake"
    """What the microphone is for,
    over two lines."""
    cutoffs: dict[str, float] = field(default_factory=dict)
    """Per model | name."""
    names: tuple[str, ...] = ("a", "b")
    providers: tuple[Literal["cuda", "cpu"], ...] | None = None
    """Best first."""
    undocumented: float | None = None
    where: Path = field(default_factory=lambda: Path.home() / ".cache" / "x")
    """A path in the home directory."""
    inner: _Inner = field(default_factory=_Inner)


@dataclass(frozen=True)
class _Root:
    top: _Outer = field(default_factory=_Outer)


def test_keys_get_type_default_and_docstring_and_nested_sections_come_apart():
    found = configref.sections(_Root)
    assert [(s.name, s.doc) for s in found] == [
        ("top", "The outer section."), ("top.inner", "The inner section.")]
    rows = {k.key: (k.type, k.default, k.doc) for k in found[0].keys}
    assert rows == {
        "top.mode": ("one of wake, always", '"wake"', "What the microphone is for, over two lines."),
        "top.cutoffs": ("map of str to float", "{}", "Per model | name."),
        "top.names": ("list of str", '["a", "b"]', ""),
        "top.providers": ("list, each one of cuda, cpu, or null", "null", "Best first."),
        "top.undocumented": ("float or null", "null", ""),
        "top.where": ("path", '"~/.cache/x"', "A path in the home directory."),
    }
    assert [(k.key, k.type, k.default, k.doc) for k in found[1].keys] == [
        ("top.inner.rate", "int", "16000", "Hertz.")]


def test_a_pipe_in_a_docstring_does_not_break_the_table():
    page = configref.render(_Root)
    assert "| `top.cutoffs` | map of str to float | `{}` | Per model \\| name. |" in page


def test_path_defaults_do_not_depend_on_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("EDGE_SPEECH_CACHE", str(tmp_path / "cache"))
    rows = {k.key: k.default for s in configref.sections(Settings) for k in s.keys}
    assert rows["announcements.state_dir"] == '"~/.local/state/edge-speech/announcements"'
    assert rows["models.cache_dir"] == '"~/.cache/edge-speech/models"'
    assert str(tmp_path) not in configref.render()


def test_check_names_the_command_when_the_page_is_stale(tmp_path, capsys):
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n", encoding="utf-8")
    assert configref.main(["--check", "--out", str(stale)]) == 1
    assert configref.REGENERATE in capsys.readouterr().err
    assert configref.main(["--out", str(stale)]) == 0
    assert configref.main(["--check", "--out", str(stale)]) == 0


def test_a_renamed_key_is_named_under_its_section():
    server = next(s for s in configref.sections() if s.name == "server")
    assert server.renamed == (("server.queue_bound", "server.max_streams"),)
    assert ("`server.queue_bound` is the old name of `server.max_streams`: still read, with a warning"
            in configref.render())
