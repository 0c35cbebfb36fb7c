import json
import shutil

import pytest

from edge_agent.asr.manifest import load_manifest, verify_files
from edge_agent.asr.whisper import WhisperOnnx
from edge_agent.errors import ModelError


@pytest.fixture
def export_copy(tmp_path, whisper_dir):
    """The real export, ONNX files linked and the small files copied, so they can be altered."""
    out = tmp_path / "export"
    out.mkdir()
    for path in whisper_dir.iterdir():
        if path.suffix == ".onnx":
            (out / path.name).symlink_to(path)
        elif path.is_file() and not path.name.startswith("."):
            shutil.copy(path, out / path.name)
    return out


def edit_manifest(directory, change):
    path = directory / "manifest.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_the_real_manifest_parses_with_the_contracts_fields(whisper_dir):
    m = load_manifest(whisper_dir)
    assert m.dims.n_mels == 80 and m.dims.n_text_layer == 4 and not m.multilingual
    assert m.tokens.sot_sequence[0] == m.tokens.sot and m.tokens.no_timestamps in m.tokens.sot_sequence
    assert m.default_variant in m.variants and {"fp32", "int8"} <= set(m.variants)
    assert m.variant(None).name == m.default_variant
    assert m.suppress_tokens and m.begin_suppress_tokens


def test_a_missing_or_broken_manifest_is_a_model_error(tmp_path):
    with pytest.raises(ModelError, match="no exported Whisper here"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ModelError, match="unreadable manifest"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"dims": {"n_mels": 80}}))
    with pytest.raises(ModelError, match="malformed manifest"):
        load_manifest(tmp_path)


def test_an_unknown_variant_names_the_exported_ones(whisper_dir):
    with pytest.raises(ModelError, match=r"no variant 'int2' \(exported: .*int8"):
        WhisperOnnx.load(whisper_dir, "int2")


def test_failed_variants_are_not_offered(export_copy):
    edit_manifest(export_copy, lambda d: d["variants"]["fp16"].update(files={}, error="does not load"))
    assert "fp16" not in load_manifest(export_copy).variants


def test_an_altered_file_is_refused_by_its_hash(export_copy):
    tokenizer = export_copy / "tokenizer.json"
    data = bytearray(tokenizer.read_bytes())
    data[100] ^= 1
    tokenizer.write_bytes(bytes(data))
    with pytest.raises(ModelError, match=r"tokenizer\.json: sha256 .* does not match"):
        WhisperOnnx.load(export_copy, "int8")


def test_a_truncated_or_missing_file_is_refused_by_its_size(export_copy):
    m = load_manifest(export_copy)
    (export_copy / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelError, match="bytes, the manifest says"):
        verify_files(m, ["tokenizer.json"])
    (export_copy / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match="missing from the export"):
        verify_files(m, ["tokenizer.json"])


def test_a_verified_export_is_not_rehashed(export_copy, monkeypatch):
    WhisperOnnx.load(export_copy, "int8")
    import edge_agent.asr.manifest as manifest_module

    monkeypatch.setattr(manifest_module, "sha256_file", lambda path: pytest.fail(f"rehashed {path}"))
    WhisperOnnx.load(export_copy, "int8")
