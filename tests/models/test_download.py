import pytest

from edge_agent.errors import ModelError
from edge_agent.models.download import download
from tests.mqtt_support import FileServer, sha

DATA = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture
def server():
    srv = FileServer()
    srv.files["/m.bin"] = DATA
    yield srv
    srv.close()


def fetch(server, tmp_path, **kw):
    args = {"sha256": sha(DATA), "size": len(DATA), "attempts": 3, "timeout": 10} | kw
    return download(server.url("/m.bin"), tmp_path / "m.bin", **args)


def test_a_complete_download_lands_verified(server, tmp_path):
    assert fetch(server, tmp_path).read_bytes() == DATA
    assert server.requests == [("/m.bin", None)]
    assert not (tmp_path / "m.bin.part").exists()


def test_a_cut_connection_is_resumed_with_a_range_request(server, tmp_path):
    server.truncate["/m.bin"] = 1
    assert fetch(server, tmp_path).read_bytes() == DATA
    (_, first), (_, second) = server.requests
    assert first is None
    assert second == f"bytes={len(DATA) // 2}-"


def test_a_part_left_by_an_earlier_run_is_resumed(server, tmp_path):
    (tmp_path / "m.bin.part").write_bytes(DATA[:1000])
    assert fetch(server, tmp_path).read_bytes() == DATA
    assert server.requests == [("/m.bin", "bytes=1000-")]


def test_a_download_that_keeps_failing_is_refused_and_the_part_kept_for_later(server, tmp_path):
    server.truncate["/m.bin"] = 99
    with pytest.raises(ModelError, match="download incomplete"):
        fetch(server, tmp_path)
    assert not (tmp_path / "m.bin").exists()
    assert 0 < (tmp_path / "m.bin.part").stat().st_size < len(DATA)


def test_a_wrong_hash_is_refused_and_nothing_lands(server, tmp_path):
    with pytest.raises(ModelError, match="does not match the expected"):
        fetch(server, tmp_path, sha256="0" * 64)
    assert list(tmp_path.iterdir()) == []


def test_a_server_offering_more_than_expected_is_refused(server, tmp_path):
    with pytest.raises(ModelError, match="expected 1000"):
        fetch(server, tmp_path, size=1000)


def test_a_missing_file_fails_at_once_without_retrying(server, tmp_path):
    with pytest.raises(ModelError, match="HTTP 404"):
        download(server.url("/nope"), tmp_path / "x", sha256="0" * 64, size=1, attempts=5)
    assert len(server.requests) == 1
