import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

UNIT = REPO / "packaging" / "systemd" / "edge-agent.service"
SERVE_UNIT = REPO / "packaging" / "systemd" / "edge-agent-serve.service"
UNITS = [UNIT, SERVE_UNIT]


def settings(text):
    out = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def test_the_unit_runs_hardened_as_a_dedicated_user_and_restarts():
    s = settings(UNIT.read_text())
    assert s["User"] == "edge-agent" and s["ProtectSystem"] == "strict"
    assert s["NoNewPrivileges"] == "yes" and s["CapabilityBoundingSet"] == ""
    assert s["Restart"] == "always" and s["KillSignal"] == "SIGTERM"
    assert "run --config /etc/edge-agent/config.yaml" in s["ExecStart"]
    sysusers = (REPO / "packaging" / "systemd" / "edge-agent.sysusers").read_text()
    assert re.search(r"^u edge-agent ", sysusers, re.M)


def test_the_server_unit_is_as_hardened_and_has_no_devices():
    s = settings(SERVE_UNIT.read_text())
    assert s["User"] == "edge-agent" and s["ProtectSystem"] == "strict" and s["Restart"] == "always"
    assert "serve --config /etc/edge-agent/server.yaml" in s["ExecStart"]
    assert s["PrivateDevices"] == "yes" and "DeviceAllow" not in s and "SupplementaryGroups" not in s


@pytest.fixture(params=UNITS, ids=lambda p: p.name)
def local_unit(request, tmp_path):
    """A unit with ExecStart pointing at this checkout's edge-agent (verify checks it exists)."""
    exe = Path(sys.executable).with_name("edge-agent")
    if not exe.exists():
        pytest.skip("edge-agent entry point is not installed next to this python")
    unit = tmp_path / request.param.name
    unit.write_text(request.param.read_text().replace("/opt/edge-speech/bin/edge-agent", str(exe)))
    return unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not available")
def test_systemd_analyze_verify_accepts_the_unit(local_unit):
    result = subprocess.run(["systemd-analyze", "verify", str(local_unit)], capture_output=True, text=True,
                            check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert local_unit.name not in result.stderr  # no warnings about our unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not available")
def test_the_exposure_score_stays_low(local_unit):
    result = subprocess.run(["systemd-analyze", "security", "--offline=true", str(local_unit)],
                            capture_output=True, text=True, check=False, timeout=60)
    match = re.search(rf"Overall exposure level for {re.escape(local_unit.name)}: ([\d.]+)", result.stdout)
    if match is None:
        pytest.skip("this systemd-analyze cannot score unit files offline")
    assert float(match.group(1)) <= 2.5
