"""A model's JSON file read once for the runtime and the exporter: its failures name the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.errors import ModelError
from edge_agent.models.jsonfile import read_json


def test_the_document_is_returned_as_it_is(tmp_path: Path):
    path = tmp_path / "manifest.json"
    path.write_text('{"files": {}, "note": "é"}', encoding="utf-8")
    assert read_json(path, "not an export directory") == {"files": {}, "note": "é"}


def test_a_missing_file_says_what_the_directory_is_not(tmp_path: Path):
    with pytest.raises(ModelError, match=r"manifest\.json: missing \(not an export directory\)$"):
        read_json(tmp_path / "manifest.json", "not an export directory")


@pytest.mark.parametrize("unreadable", ["unreadable", "not a readable JSON config"])
def test_a_file_that_is_not_json_is_refused_with_the_reason(tmp_path: Path, unreadable: str):
    path = tmp_path / "config.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelError, match=rf"config\.json: {unreadable} \(Expecting"):
        read_json(path, "-", unreadable) if unreadable != "unreadable" else read_json(path, "-")


def test_a_directory_in_its_place_is_unreadable(tmp_path: Path):
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(ModelError, match=r"manifest\.json: unreadable \("):
        read_json(tmp_path / "manifest.json", "-")
