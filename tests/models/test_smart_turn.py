"""`models fetch smart-turn`: the ONNX file read out of the pipecat-ai wheel, never installed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from edge_agent.errors import ModelError
from edge_agent.listen.endofturn import MODEL_FILE, MODEL_ID
from edge_agent.models import ModelStore, load_catalog
from edge_agent.models.catalog import builtin_catalog_path
from edge_agent.models.store import sha256_file


def test_the_catalog_takes_the_model_out_of_the_pipecat_wheel():
    entry = load_catalog().get(MODEL_ID)
    assert entry.licence == "BSD-2-Clause" and entry.task == "end-of-turn"
    assert [(p.name, p.version, p.dist) for p in entry.source.packages] == [("pipecat-ai", "1.14.0", "wheel")]
    spec = entry.file(MODEL_FILE)
    assert spec.parts == (f"pipecat/audio/turn/smart_turn/data/{MODEL_FILE}",)
    assert spec.sha256 == "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"


def test_the_fetched_model_verifies(turn_model: Path):
    assert sha256_file(turn_model) == load_catalog().get(MODEL_ID).file(MODEL_FILE).sha256
    assert importlib.util.find_spec("pipecat") is None  # read from the wheel, never installed


def test_fetch_refuses_a_file_with_the_wrong_hash(tmp_path: Path):
    doc = yaml.safe_load(builtin_catalog_path().read_text())
    (entry,) = [m for m in doc["models"] if m["id"] == MODEL_ID]
    entry["files"][0]["sha256"] = "0" * 64
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": [entry]}))
    store = ModelStore(tmp_path / "cache", load_catalog(catalog))
    refused = rf"{MODEL_FILE}: got 8679182 bytes with sha256 2bb02631.*expected .* 0000"
    with pytest.raises(ModelError, match=refused):
        store.fetch(MODEL_ID)
    assert store.locate(MODEL_ID) is None
    assert not any(p.name.endswith(".onnx") for p in (tmp_path / "cache").rglob("*"))
