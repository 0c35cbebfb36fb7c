"""TLS and username/password against a real mosquitto with a certificate made here."""

import datetime
import ipaddress
import shutil
import subprocess

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edge_agent.config import MqttSettings
from edge_agent.errors import ConfigError
from edge_agent.mqtt.bridge import Bridge, Message
from edge_agent.mqtt.localbroker import LocalBroker, find_mosquitto
from tests.mqtt_support import wait_until

pytestmark = pytest.mark.skipif(
    find_mosquitto() is None or shutil.which("mosquitto_passwd") is None, reason="mosquitto not installed")


def _cert(subject, issuer_key, key, issuer=None, ca=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path, cert=None, key=None):
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return path


@pytest.fixture
def tls_broker(tmp_path):
    pki = tmp_path / "pki"
    pki.mkdir()
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert("test CA", ca_key, ca_key, ca=True)
    server = _cert("127.0.0.1", ca_key, server_key, issuer=ca.subject)
    ca_path = _write(pki / "ca.pem", cert=ca)
    _write(pki / "server.pem", cert=server)
    _write(pki / "server.key", key=server_key)
    passwd = pki / "passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(passwd), "device", "s3cret"], check=True,
                   capture_output=True)
    options = f"cafile {ca_path}\ncertfile {pki / 'server.pem'}\nkeyfile {pki / 'server.key'}"
    broker = LocalBroker(tmp_path / "broker", listener_options=options, allow_anonymous=False,
                         extra=f"password_file {passwd}")
    broker.start()
    yield broker, ca_path
    broker.kill()


def _bridge(settings):
    received = []
    bridge = Bridge(settings, "tls-dev", will=Message("edge/tls-dev/status", b"offline", 1, True),
                    on_message=lambda t, p, r: received.append(p) or True)
    bridge.set_subscriptions(["edge/tls-dev/announce"])
    bridge.start()
    return bridge, received


def test_tls_with_a_password_file_connects_and_carries_messages(tls_broker, tmp_path):
    broker, ca = tls_broker
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    settings = MqttSettings(broker=f"mqtts://127.0.0.1:{broker.port}", tls_ca=ca, username="device",
                            password_file=secret)
    bridge, received = _bridge(settings)
    try:
        assert bridge.wait_connected(30)
        bridge.publish(Message("edge/tls-dev/announce", b"over tls"))
        wait_until(lambda: received == [b"over tls"], what="loopback message over TLS")
    finally:
        bridge.stop()


def test_a_wrong_password_is_refused_and_retried_without_crashing(tls_broker):
    broker, ca = tls_broker
    settings = MqttSettings(broker=f"mqtts://127.0.0.1:{broker.port}", tls_ca=ca, username="device",
                            password="wrong", reconnect_min_s=0.05, reconnect_max_s=0.2)
    bridge, _ = _bridge(settings)
    try:
        wait_until(lambda: bridge._attempts >= 3, what="refused attempts")
        assert not bridge.connected and bridge._thread.is_alive()
    finally:
        bridge.stop()


def test_an_untrusted_certificate_is_not_accepted(tls_broker):
    broker, _ = tls_broker
    settings = MqttSettings(broker=f"mqtts://127.0.0.1:{broker.port}", username="device", password="s3cret",
                            reconnect_min_s=0.05, reconnect_max_s=0.2)
    bridge, _ = _bridge(settings)  # system CAs do not know our test CA
    try:
        wait_until(lambda: bridge._attempts >= 2, what="failed TLS attempts")
        assert not bridge.connected
    finally:
        bridge.stop()


def test_a_missing_password_file_is_a_config_error(tmp_path):
    settings = MqttSettings(broker="mqtt://127.0.0.1:1", username="u", password_file=tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"mqtt\.password_file"):
        Bridge(settings, "x", will=Message("t", b""), on_message=lambda *a: True)
