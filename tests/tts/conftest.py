"""The local voice's model file and its split ("prepared") graphs, once per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.models import ModelStore, load_catalog
from edge_agent.tts import vits

VOICE = "en_US-joe-medium"


@pytest.fixture(scope="module")
def model(shared_cache: Path) -> Path:
    files = ModelStore(shared_cache, load_catalog()).require(VOICE)
    return files.path(files.entry.files[0].name)


@pytest.fixture(scope="module")
def prepared(model: Path, tmp_path_factory: pytest.TempPathFactory) -> vits.Prepared:
    return vits.prepare(model, tmp_path_factory.mktemp("prepared") / "joe")
