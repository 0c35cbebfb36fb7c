import json
import stat

import pytest

from edge_agent.daemon import SettingsSource
from edge_agent.fleet.envelope import parse_envelope, public_key_text, trusted_keys, verify
from tests.conftest import REPO, run_cli
from tests.mqtt_support import FLEET_KEY, DaemonProcess, Watcher, device_config


@pytest.fixture
def keys(tmp_path):
    key = tmp_path / "fleet.key"
    result = run_cli("fleet", "keygen", "--out", str(key))
    assert result.returncode == 0, result.stderr
    return key


def test_keygen_writes_a_private_key_only_we_can_read_and_prints_the_public_one(keys):
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    pub = keys.with_name("fleet.key.pub").read_text().strip()
    assert len(trusted_keys([pub])) == 1
    again = run_cli("fleet", "keygen", "--out", str(keys))
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr


def test_sign_then_verify_and_a_tampered_envelope_fails(tmp_path, keys):
    source = tmp_path / "src.yaml"
    source.write_text("target: device:dev1\nconfig:\n  audio: {volume: 0.5}\n")
    out = tmp_path / "env.json"
    assert run_cli("fleet", "sign", str(source), "--key", str(keys), "--version", "42",
                   "--out", str(out)).returncode == 0
    pub = str(keys.with_name("fleet.key.pub"))
    ok = run_cli("fleet", "verify", str(out), "--key", pub, "--device-id", "dev1")
    assert ok.returncode == 0 and "ok: version 42, target device:dev1" in ok.stdout
    other = run_cli("fleet", "verify", str(out), "--key", pub, "--device-id", "dev2")
    assert other.returncode == 2 and "does not include device dev2" in other.stderr
    doc = json.loads(out.read_text())
    doc["config"]["audio"]["volume"] = 1.0
    out.write_text(json.dumps(doc))
    bad = run_cli("fleet", "verify", str(out), "--key", pub)
    assert bad.returncode == 2 and "bad signature" in bad.stderr


def test_verify_uses_the_trusted_keys_of_the_device_config(tmp_path, keys):
    source = tmp_path / "src.yaml"
    source.write_text("target: all\nconfig: {}\n")
    out = tmp_path / "env.json"
    run_cli("fleet", "sign", str(source), "--key", str(keys), "--out", str(out), "--expires-in", "-5")
    config = tmp_path / "device.yaml"
    config.write_text(f"fleet:\n  trusted_keys: [{keys.with_name('fleet.key.pub').read_text().strip()}]\n")
    result = run_cli("fleet", "verify", str(out), "--config", str(config))
    assert result.returncode == 2 and "expired" in result.stderr
    untrusted = run_cli("fleet", "verify", str(out))
    assert untrusted.returncode == 2 and "no trusted keys" in untrusted.stderr


@pytest.mark.parametrize("example", sorted((REPO / "configs" / "fleet").glob("*.yaml")), ids=lambda p: p.name)
def test_example_fleet_configs_sign_and_make_valid_settings(tmp_path, example):
    from edge_agent.fleet.envelope import sign
    from edge_agent.safeyaml import load_yaml_file

    body = load_yaml_file(example) | {"version": 1, "issued_at": 1}
    envelope = parse_envelope(sign(body, FLEET_KEY))
    assert verify(envelope, trusted_keys([public_key_text(FLEET_KEY.public_key())])) == 0
    SettingsSource().build(envelope.config)
    assert not set(envelope.config) & {"fleet", "mqtt", "models", "daemon"}  # protected by default


def test_push_publishes_retained_and_reports_what_the_device_did(tmp_path, broker):
    config = device_config(tmp_path / "device.yaml", tmp_path)
    daemon = DaemonProcess(tmp_path, broker.url, config=config)
    daemon.start().wait_running()
    try:
        from edge_agent.fleet.envelope import sign

        envelope = tmp_path / "env.json"
        envelope.write_text(json.dumps(sign({"version": 9, "target": "device:dev1", "issued_at": 1,
                                             "config": {"audio": {"volume": 0.3}}}, FLEET_KEY)))
        result = run_cli("fleet", "push", str(envelope), "--broker", broker.url, "--wait", "60")
        assert result.returncode == 0, result.stderr
        assert "published version 9 to edge/dev1/config" in result.stdout
        assert "dev1: applied" in result.stdout
        again = run_cli("fleet", "push", str(envelope), "--broker", broker.url, "--wait", "60")
        assert again.returncode == 0 and "dev1: applied" in again.stdout  # unchanged, still applied
    finally:
        daemon.close()
    watcher = Watcher(broker.url, "edge/dev1/config")
    try:
        assert watcher.wait("edge/dev1/config")[0]["version"] == 9  # retained for later devices
    finally:
        watcher.close()


def test_push_without_a_device_answering_says_so(tmp_path, broker):
    from edge_agent.fleet.envelope import sign

    envelope = tmp_path / "env.json"
    envelope.write_text(json.dumps(sign({"version": 1, "target": "device:ghost", "issued_at": 1,
                                         "config": {}}, FLEET_KEY)))
    result = run_cli("fleet", "push", str(envelope), "--broker", broker.url, "--wait", "1")
    assert result.returncode == 2 and "no report from ghost" in result.stderr


def test_run_refuses_a_bad_broker_uri(tmp_path):
    result = run_cli("run", "--broker", "http://example:80")
    assert result.returncode == 2 and "--broker" in result.stderr
