import pytest

from edge_agent.errors import ModelError
from exporters.report import variant_table


def manifest(unit: str | None, wer: float, wer_truth: float, drift: float, ref_truth: float) -> dict:
    doc = {
        "default_variant": "int8",
        "reference": {"rtf": 0.5, "wer_truth": ref_truth},
        "variants": {
            "int8": {"size_bytes": 62_000_000, "load_s": 0.12, "rtf": 0.089, "trimmed": {"rtf": 0.046},
                     "max_logit_diff": 3.7, "wer": wer, "wer_truth": wer_truth, "wer_drift": drift},
            "int8-static": {"error": "RuntimeError: broken"},
        },
    }
    if unit is not None:
        doc["wer_unit"] = unit
    return doc


def test_the_table_shows_wer_as_a_fraction():
    table = variant_table(manifest("fraction", 0.0179, 0.0268, 0.0089, 0.0179))
    assert "| int8 (default) | 62.0 | 0.12 | 0.089 | 0.046 | 3.7 | 0.018 | 0.027 | +0.009 |" in table
    assert "| PyTorch (reference) | | | 0.500 | | | | 0.018 | |" in table
    assert "| int8-static | failed: RuntimeError: broken |" in table


def test_a_manifest_without_a_wer_unit_recorded_percent_and_reads_the_same():
    old, new = manifest(None, 1.79, 2.68, 0.89, 1.79), manifest("fraction", 0.0179, 0.0268, 0.0089, 0.0179)
    assert variant_table(old) == variant_table(new)


def test_an_unknown_wer_unit_is_a_clear_error():
    with pytest.raises(ModelError, match="unknown wer_unit 'permille'"):
        variant_table(manifest("permille", 1, 1, 0, 1))
