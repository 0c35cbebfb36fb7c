import json

import pytest

from edge_agent.daemon import SettingsSource
from edge_agent.errors import EdgeError
from edge_agent.fleet.manager import FleetManager
from edge_agent.models import load_catalog
from tests.mqtt_support import device_config, signed


class Harness:
    """A FleetManager over a real local config; activation builds the real settings."""

    def __init__(self, tmp_path, group="kitchen", fail_health=None):
        self.path = tmp_path / "device.yaml"
        if not self.path.exists():
            device_config(self.path, tmp_path)
        self.source = SettingsSource(self.path)
        base = self.source.build()
        self.reports = []
        self.activated = []
        self.fail_health = fail_health or (lambda settings: False)
        self.fm = FleetManager(base.fleet, device="dev1", group=lambda: group,
                               cache_dir=base.models.cache_dir, validate=self.source.build,
                               activate=self._activate, base_catalog=load_catalog(None),
                               report=self.reports.append)
        self.fm.recover()

    def _activate(self, active):
        settings = self.source.build(active.layer)
        self.activated.append(active.version)
        if self.fail_health(settings):
            raise EdgeError("voice produced no audio")

    @property
    def settings(self):
        return self.source.build(self.fm.active.layer)

    def send(self, payload):
        return self.fm.handle(payload)


@pytest.fixture
def h(tmp_path):
    return Harness(tmp_path)


def test_a_valid_config_is_applied_and_takes_effect(h):
    report = h.send(signed(5, {"audio": {"volume": 0.5}, "tts": {"length_scale": 1.2}}))
    assert (report.state, report.version, report.error) == ("applied", 5, None)
    assert h.settings.audio.volume == 0.5 and h.settings.tts.length_scale == 1.2
    assert h.reports[-1].to_json()["state"] == "applied"
    assert h.activated == [5]


def test_the_applied_config_is_active_again_after_a_restart(h, tmp_path):
    h.send(signed(5, {"audio": {"volume": 0.5}}))
    again = Harness(tmp_path)
    assert again.fm.active.version == 5
    assert again.settings.audio.volume == 0.5


def test_the_same_envelope_again_changes_nothing(h):
    payload = signed(5, {"audio": {"volume": 0.5}})
    h.send(payload)
    report = h.send(payload)
    assert report.state == "applied" and report.unchanged
    assert h.activated == [5]


@pytest.mark.parametrize("version", [3, 5])
def test_a_replayed_version_is_rejected_and_the_old_config_stays(h, version):
    h.send(signed(5, {"audio": {"volume": 0.5}}))
    report = h.send(signed(version, {"audio": {"volume": 0.1}}))
    assert report.state == "rejected" and "replay" in report.error
    assert h.settings.audio.volume == 0.5 and report.active_version == 5


def test_a_bad_signature_is_rejected_and_the_old_config_stays(h):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    h.send(signed(5, {"audio": {"volume": 0.5}}))
    report = h.send(signed(6, {"audio": {"volume": 0.1}}, key=Ed25519PrivateKey.generate()))
    assert report.state == "rejected" and "bad signature" in report.error
    tampered = json.loads(signed(7, {"audio": {"volume": 0.1}}))
    tampered["config"]["audio"]["volume"] = 0.9
    assert h.send(json.dumps(tampered).encode()).state == "rejected"
    assert h.settings.audio.volume == 0.5


@pytest.mark.parametrize(("target", "applies"), [
    ("device:dev1", True), ("device:dev2", False), ("group:kitchen", True), ("group:hall", False),
    ("all", True),
])
def test_only_configs_targeting_this_device_apply(h, target, applies):
    report = h.send(signed(5, {"audio": {"volume": 0.5}}, target=target))
    assert report.state == ("applied" if applies else "rejected")
    if not applies:
        assert "is not this device" in report.error and h.fm.active.version == 0


def test_an_expired_config_is_rejected(h):
    report = h.send(signed(5, {"audio": {"volume": 0.5}}, expires_at=1000))
    assert report.state == "rejected" and "expired" in report.error


@pytest.mark.parametrize("config", [
    {"device": {"id": "evil"}},
    {"fleet": {"trusted_keys": []}},
    {"mqtt": {"broker": "mqtt://evil:1883"}},
    {"device": None},
    {"announcements": {"state_dir": "/tmp/elsewhere"}},
])
def test_protected_keys_cannot_be_set_by_the_fleet(h, config):
    report = h.send(signed(5, config))
    assert report.state == "rejected" and "protected key" in report.error


@pytest.mark.parametrize(("config", "reason"), [
    ({"tts": {"threads": 0}}, "tts.threads"),
    ({"tts": {"voice": "nobody"}}, "unknown voice"),
    ({"audio": {"volumes": 1}}, "audio.volumes: unknown key"),
])
def test_an_invalid_config_is_rejected_with_its_key_path(h, config, reason):
    report = h.send(signed(5, config))
    assert report.state == "rejected" and reason in report.error
    assert h.fm.active.version == 0


def test_hostile_yaml_is_rejected_with_the_old_config_active(h):
    h.send(signed(5, {"audio": {"volume": 0.5}}))
    bomb = b'a: &a ["x","x","x","x","x","x","x","x"]\n' + b"".join(
        f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n".encode()
        for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    for payload in (bomb, b"x:" + b" [" * 100 + b"]" * 100, b"a: " + b"x" * (10 * 1024 * 1024)):
        report = h.send(payload)
        assert report.state == "rejected" and report.version is None
    assert h.settings.audio.volume == 0.5 and h.fm.active.version == 5


def test_a_failed_health_check_rolls_back_and_the_version_is_burnt(tmp_path):
    h = Harness(tmp_path, fail_health=lambda s: s.audio.volume < 0.2)
    h.send(signed(5, {"audio": {"volume": 0.5}}))
    report = h.send(signed(6, {"audio": {"volume": 0.1}}))
    assert report.state == "rolled_back" and "voice produced no audio" in report.error
    assert h.fm.active.version == 5 and h.settings.audio.volume == 0.5
    assert h.activated == [5, 6, 5]
    assert h.send(signed(6, {"audio": {"volume": 0.1}})).state == "rejected"  # not retried forever
    assert h.send(signed(7, {"audio": {"volume": 0.3}})).state == "applied"


def test_a_restart_during_the_trial_rolls_back(tmp_path):
    h = Harness(tmp_path)
    h.send(signed(5, {"audio": {"volume": 0.5}}))
    state = json.loads((tmp_path / "fleet" / "active.json").read_text())
    # What a crash between activation and commit leaves behind:
    state["previous"], state["current"] = state["current"], {
        "envelope": json.loads(signed(6, {"audio": {"volume": 0.2}})), "pins": {}, "catalog": None}
    state["state"] = "trial"
    (tmp_path / "fleet" / "active.json").write_text(json.dumps(state))
    again = Harness(tmp_path)
    assert again.fm.active.version == 5 and again.settings.audio.volume == 0.5
    report = again.fm.take_startup_report()
    assert report.state == "rolled_back" and "restarted" in report.error


def test_payloads_wait_in_the_inbox_until_processed(tmp_path):
    h = Harness(tmp_path)
    assert h.fm.enqueue(signed(5, {"audio": {"volume": 0.5}}))
    assert h.fm.enqueue(b"")  # a cleared retained message: nothing to do
    again = Harness(tmp_path)  # e.g. after a crash before processing
    reports = again.fm.process_inbox()
    assert [r.state for r in reports] == ["applied"]
    assert list((tmp_path / "fleet" / "inbox").iterdir()) == []


def test_an_oversized_payload_is_rejected_without_being_stored(h, tmp_path):
    assert h.fm.enqueue(b"{" + b" " * 300_000 + b"}")
    assert h.reports[-1].state == "rejected" and "limit is 262144" in h.reports[-1].error
    assert list((tmp_path / "fleet" / "inbox").iterdir()) == []
