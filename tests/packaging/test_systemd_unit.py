import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

UNIT = REPO / "packaging" / "systemd" / "edge-agent.service"


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


@pytest.fixture
def local_unit(tmp_path):
    """The unit with ExecStart pointing at this checkout's edge-agent (verify checks it exists)."""
    exe = Path(sys.executable).with_name("edge-agent")
    if not exe.exists():
        pytest.skip("edge-agent entry point is not installed next to this python")
    unit = tmp_path / "edge-agent.service"
    unit.write_text(UNIT.read_text().replace("/opt/edge-speech/bin/edge-agent", str(exe)))
    return unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not available")
def test_systemd_analyze_verify_accepts_the_unit(local_unit):
    result = subprocess.run(["systemd-analyze", "verify", str(local_unit)], capture_output=True, text=True,
                            check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "edge-agent.service" not in result.stderr  # no warnings about our unit


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not available")
def test_the_exposure_score_stays_low(local_unit):
    result = subprocess.run(["systemd-analyze", "security", "--offline=true", str(local_unit)],
                            capture_output=True, text=True, check=False, timeout=60)
    match = re.search(r"Overall exposure level for edge-agent.service: ([\d.]+)", result.stdout)
    if match is None:
        pytest.skip("this systemd-analyze cannot score unit files offline")
    assert float(match.group(1)) <= 2.5
