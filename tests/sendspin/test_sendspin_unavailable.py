"""Where Sendspin cannot run (Python before 3.12, no aiosendspin), the daemon says why once and runs
on; `doctor` names the reason. Runs on every Python: what it asserts depends on which this is."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from edge_agent.daemon import Daemon, SettingsSource
from edge_agent.sendspin.player import sendspin_missing
from tests.conftest import run_cli
from tests.mqtt_support import ToneSynth, device_config, wait_until


def test_doctor_says_whether_the_music_player_can_run_here():
    result = run_cli("doctor", "--set", "mqtt.broker=''", "--set", "sendspin.enabled=true")
    [line] = [line for line in result.stdout.splitlines() if line.split()[1:2] == ["sendspin"]]
    missing = sendspin_missing()
    if missing is None:
        assert line.startswith("ok    sendspin player on port 8928")
    else:
        assert line == f"FAIL  sendspin {missing}"
        assert result.returncode == 1


def test_the_daemon_says_once_why_the_player_is_off_and_runs_on(tmp_path, caplog):
    missing = sendspin_missing()
    if missing is None:
        pytest.skip("Sendspin runs on this Python; the player's own tests cover it")
    caplog.set_level(logging.INFO)
    config = device_config(tmp_path / "device.yaml", tmp_path, daemon={"state_dir": str(tmp_path / "d")})
    source = SettingsSource(config, {"mqtt.broker": "", "device.id": "dev1", "daemon.listen": False,
                                     "sendspin.enabled": True})
    daemon = Daemon(source, synthesizer_factory=lambda s: ToneSynth())
    thread = threading.Thread(target=lambda: asyncio.run(daemon.run()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: "running" in [r.getMessage() for r in caplog.records], what="the daemon running")
    finally:
        daemon.stop()
        thread.join(60)
    lines = [r for r in caplog.records if r.name == "edge_agent.daemon" and "sendspin" in r.getMessage()]
    assert [r.getMessage() for r in lines] == [f"sendspin: {missing}"]
    assert daemon.sendspin is None
