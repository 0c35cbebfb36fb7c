"""Model updates through fleet configs: real files from a real HTTP server, a real ONNX test-load."""

import os

import pytest

from edge_agent.errors import EdgeError
from tests.mqtt_support import FileServer, FleetDevice, sha, signed, tiny_onnx

V1, V2 = tiny_onnx(2.0), tiny_onnx(3.0)


@pytest.fixture
def server():
    srv = FileServer()
    srv.files["/v1/tiny.onnx"] = V1
    srv.files["/v2/tiny.onnx"] = V2
    yield srv
    srv.close()


def spec(server, path, data, **kw):
    return {"id": "tiny-mul", "url": server.url(path), "sha256": sha(data), "size": len(data),
            "task": "test", "runtime": "onnx"} | kw


def test_a_config_with_a_model_downloads_verifies_and_activates_it(tmp_path, server):
    dev = FleetDevice(tmp_path)
    report = dev.fm.handle(signed(1, models=[spec(server, "/v1/tiny.onnx", V1)]))
    assert report.state == "applied", report.error
    assert dev.scale() == 2.0
    assert (dev.cache / "tiny-mul").is_symlink()


def test_an_update_swaps_the_model_and_keeps_the_previous_version(tmp_path, server):
    dev = FleetDevice(tmp_path)
    dev.fm.handle(signed(1, models=[spec(server, "/v1/tiny.onnx", V1)]))
    old_target = os.readlink(dev.cache / "tiny-mul")
    assert dev.fm.handle(signed(2, models=[spec(server, "/v2/tiny.onnx", V2)])).state == "applied"
    assert dev.scale() == 3.0
    assert (dev.cache / old_target / "tiny.onnx").read_bytes() == V1  # kept for rollback


GARBAGE = os.urandom(len(V2))


@pytest.mark.parametrize(("served", "truncate", "declared", "reason"), [
    (V2, 99, V2, "download incomplete"),  # the server always cuts the file short
    (V2[:-1] + b"\x00", 0, V2, "does not match"),  # what arrives is not what was signed
    (GARBAGE, 0, GARBAGE, "test-load"),  # signed, hash matches, but not a loadable model
])
def test_a_bad_download_is_rejected_with_the_old_model_still_active(tmp_path, server, served, truncate,
                                                                    declared, reason):
    dev = FleetDevice(tmp_path)
    dev.fm.handle(signed(1, models=[spec(server, "/v1/tiny.onnx", V1)]))
    server.files["/v2/tiny.onnx"] = served
    server.truncate["/v2/tiny.onnx"] = truncate
    report = dev.fm.handle(signed(2, models=[spec(server, "/v2/tiny.onnx", declared)]))
    assert report.state == "rejected" and reason in report.error
    assert dev.fm.active.version == 1 and dev.scale() == 2.0


def test_a_download_cut_once_resumes_and_completes(tmp_path, server):
    dev = FleetDevice(tmp_path)
    server.truncate["/v1/tiny.onnx"] = 1
    assert dev.fm.handle(signed(1, models=[spec(server, "/v1/tiny.onnx", V1)])).state == "applied"
    ranges = [r for p, r in server.requests if p == "/v1/tiny.onnx"]
    assert ranges[0] is None and ranges[1].startswith("bytes=")


def test_a_failed_health_check_after_a_swap_restores_the_previous_model(tmp_path, server):
    def health(settings):
        if settings.audio.volume == 0.3:
            raise EdgeError("model misbehaves")

    dev = FleetDevice(tmp_path, health=health)
    dev.fm.handle(signed(1, models=[spec(server, "/v1/tiny.onnx", V1)]))
    report = dev.fm.handle(signed(2, {"audio": {"volume": 0.3}}, models=[spec(server, "/v2/tiny.onnx", V2)]))
    assert report.state == "rolled_back"
    assert dev.scale() == 2.0


def test_a_model_fetched_before_fleet_management_comes_back_when_no_config_pins_it(tmp_path, server):
    dev = FleetDevice(tmp_path)
    own = dev.cache / "tiny-mul"
    own.mkdir(parents=True)
    (own / "tiny.onnx").write_bytes(V1)
    dev.fm.handle(signed(1, models=[spec(server, "/v2/tiny.onnx", V2)]))
    assert dev.scale() == 3.0
    dev.fm.handle(signed(2, {"audio": {"volume": 0.9}}))  # no models any more
    assert (own / "tiny.onnx").read_bytes() == V1


def test_a_model_unknown_to_the_catalog_needs_task_and_runtime(tmp_path, server):
    dev = FleetDevice(tmp_path)
    bare = {"id": "mystery", "url": server.url("/v1/tiny.onnx"), "sha256": sha(V1), "size": len(V1)}
    report = dev.fm.handle(signed(1, models=[bare]))
    assert report.state == "rejected" and "'task' and 'runtime'" in report.error


def test_an_oversized_model_is_refused_before_downloading(tmp_path, server):
    dev = FleetDevice(tmp_path)
    big = spec(server, "/v1/tiny.onnx", V1) | {"size": 3 * 1024**3}
    report = dev.fm.handle(signed(1, models=[big]))
    assert report.state == "rejected" and "fleet.max_model_bytes" in report.error
    assert server.requests == []
