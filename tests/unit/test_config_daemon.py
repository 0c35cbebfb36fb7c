import pytest

from edge_agent.config import FleetSettings, load_settings
from edge_agent.errors import ConfigError
from edge_agent.metrics import Metrics


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "message"), [
    ("mqtt:\n  session_expiry_s: 0\n", r"^mqtt\.session_expiry_s: must be more than 0"),
    ("mqtt:\n  client_id: a/b\n", r"^mqtt\.client_id:"),
    ("mqtt:\n  reconnect_min_s: 5\n  reconnect_max_s: 1\n", r"^mqtt\.reconnect_min_s"),
    ("fleet:\n  trusted_keys: [not-a-key]\n", r"^fleet\.trusted_keys: 'not-a-key'"),
    ("announcements:\n  default_priority: 10\n", r"^announcements\.default_priority: 10 is outside 0\.\.9"),
    ("daemon:\n  out_dir: 5\n", r"^daemon\.out_dir: expected a path"),
])
def test_daemon_settings_errors_name_their_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(write(tmp_path, text))


def test_device_id_and_fleet_are_protected_even_if_the_list_forgets_them():
    assert FleetSettings(protected_keys=("tts",)).protected == ("device.id", "fleet", "tts")


def test_layers_sit_between_the_file_and_the_overrides(tmp_path):
    path = write(tmp_path, "audio:\n  volume: 0.9\ntts:\n  threads: 1\n")
    layer = {"audio": {"volume": 0.5}, "tts": {"threads": 3}}
    settings = load_settings(path, {"tts.threads": 2}, layers=[layer])
    assert settings.audio.volume == 0.5 and settings.tts.threads == 2
    assert layer == {"audio": {"volume": 0.5}, "tts": {"threads": 3}}  # not mutated


def test_metrics_snapshot_counts_and_percentiles():
    m = Metrics()
    m.inc("a")
    m.inc("a", 2)
    for v in (0.01, 0.02, 0.2, 3.0):
        m.observe("lat", v)
    snap = m.snapshot()
    assert snap["counters"] == {"a": 3}
    hist = snap["histograms"]["lat"]
    assert hist["count"] == 4 and hist["buckets"]["le_0.01"] == 1 and hist["buckets"]["le_5"] == 1
    assert 0.02 <= hist["p50"] <= 0.2 and hist["p95"] > 1.0
