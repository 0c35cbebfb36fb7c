"""`bench fleet` on a small fleet (50 devices): fan-out, a signed config to all, a broker restart."""

from __future__ import annotations

import pytest

from benchmarks.fleet import Plan, measure
from edge_agent.errors import UsageError
from edge_agent.mqtt.localbroker import find_mosquitto
from tests.conftest import run_cli

pytestmark = pytest.mark.skipif(find_mosquitto() is None, reason="mosquitto is not installed")


def test_a_small_fleet_gets_everything_once_across_a_broker_restart():
    report = measure(Plan(devices=50, announcements=2, while_down=2, down_s=0.5, bin_s=0.1, timeout=60))
    fan, config, restart = report["fanout"], report["config"], report["restart"]
    assert fan["deliveries"] == 100 and fan["lost"] == 0
    assert 0 < fan["p50_s"] <= fan["p95_s"] <= fan["max_s"]
    assert config["verified"] == 50 and config["rejected"] == {} and config["missing"] == 0
    # On a failure the report says which devices did not come back and which missed an announcement.
    assert restart["complete"] and restart["sessions_resumed"] == 50 and restart["reconnected"] == 50, restart
    assert restart["not_reconnected"] == 0 and restart["missing_announcements"] == 0
    assert restart["expected"] == 100 and restart["exactly_once"] == 100
    assert restart["lost"] == 0 and restart["duplicates"] == 0
    assert sum(restart["connections_per_bin"]) == 50
    # The jittered backoff spreads the reconnections over several 0.1 s bins.
    assert sum(1 for n in restart["connections_per_bin"] if n) >= 3
    assert report["goals_met"] is True


def test_a_plan_without_devices_is_refused():
    with pytest.raises(UsageError, match="at least 1"):
        Plan(devices=0)
    result = run_cli("bench", "fleet", "--devices", "0", timeout=60)
    assert result.returncode == 2 and "at least 1" in result.stderr
