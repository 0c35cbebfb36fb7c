"""`bench asr` finds its reference engines by entry point, never by importing the exporter."""

from importlib.metadata import EntryPoint
from pathlib import Path

import tomllib

from benchmarks.asr import REFERENCE_GROUP, references

REPO = Path(__file__).resolve().parents[2]


def declared() -> dict[str, str]:
    doc = tomllib.loads((REPO / "tools" / "pyproject.toml").read_text())
    return doc["project"]["entry-points"][REFERENCE_GROUP]


def test_the_pytorch_reference_is_declared_under_the_group():
    assert declared() == {"torch-fp32": "exporters.asr_reference:torch_fp32"}


def test_an_entry_point_that_cannot_load_is_left_out_and_faster_whisper_stays():
    broken = EntryPoint("broken", "edge_speech_no_such_module:run", REFERENCE_GROUP)
    found = references([broken])
    assert set(found) == {"faster-whisper-int8"}


def test_a_loadable_entry_point_is_offered_under_its_name():
    entries = [EntryPoint(name, value, REFERENCE_GROUP) for name, value in declared().items()]
    try:
        import torch  # noqa: F401
    except ImportError:
        assert set(references(entries)) == {"faster-whisper-int8"}
    else:
        found = references(entries)
        assert set(found) == {"faster-whisper-int8", "torch-fp32"} and callable(found["torch-fp32"])
