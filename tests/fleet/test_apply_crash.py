"""A SIGKILL at each step of applying a config leaves exactly one complete config active."""

import json
import os
import signal
import subprocess
import sys

import pytest

from edge_agent.faults import CRASH_ENV
from edge_agent.fleet.manager import STEPS
from tests.conftest import REPO
from tests.mqtt_support import FileServer, FleetDevice, sha, signed, tiny_onnx

V1, V2 = tiny_onnx(2.0), tiny_onnx(3.0)
TRIAL = ("active:renamed", "links", "health-checked", "commit:temp-written")
"""Steps after the new config is on disk on trial and before it is committed."""


@pytest.fixture(scope="module")
def server():
    srv = FileServer()
    srv.files["/v1/tiny.onnx"] = V1
    srv.files["/v2/tiny.onnx"] = V2
    yield srv
    srv.close()


def model(server, path, data):
    return [{"id": "tiny-mul", "url": server.url(path), "sha256": sha(data), "size": len(data),
             "task": "test", "runtime": "onnx"}]


def test_every_step_has_a_crash_point():
    assert len(STEPS) == 11


@pytest.mark.parametrize("step", STEPS)
def test_a_kill_at_each_step_of_an_apply_leaves_one_complete_config(tmp_path, server, step):
    device = FleetDevice(tmp_path)
    assert device.fm.handle(signed(1, {"audio": {"volume": 0.5}},
                                   models=model(server, "/v1/tiny.onnx", V1))).state == "applied"
    payload = signed(2, {"audio": {"volume": 0.25}}, models=model(server, "/v2/tiny.onnx", V2))
    (tmp_path / "v2.json").write_bytes(payload)

    env = {**os.environ, CRASH_ENV: f"fleet:{step}", "PYTHONPATH": str(REPO)}
    child = subprocess.run([sys.executable, str(REPO / "tests/fleet/crash_child.py"), str(tmp_path),
                            str(tmp_path / "v2.json")], env=env, capture_output=True, text=True, timeout=120,
                           check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr

    restarted = FleetDevice(tmp_path)
    active = restarted.fm.active
    expected = 2 if step == "commit:renamed" else 1
    assert active.version == expected
    # Complete: settings, pinned model and the model the store serves all agree.
    settings = restarted.source.build(active.layer)
    assert settings.audio.volume == {1: 0.5, 2: 0.25}[expected]
    assert restarted.scale() == {1: 2.0, 2: 3.0}[expected]
    assert not list((tmp_path / "fleet").glob(".*.tmp"))
    state = json.loads((tmp_path / "fleet" / "active.json").read_text())
    assert state["state"] == "applied"
    if step in TRIAL:
        assert restarted.fm.take_startup_report().state == "rolled_back"

    # The payload is still in the inbox after a crash: handling it again finishes the job,
    # except for a config that was on trial, which stays rolled back.
    retry = restarted.fm.handle(payload)
    if step in TRIAL:
        assert retry.state == "rejected" and restarted.fm.active.version == 1
    else:
        assert retry.state == "applied" and restarted.fm.active.version == 2
        assert restarted.scale() == 3.0
