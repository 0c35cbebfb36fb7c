"""TLS with a CA the test makes itself: the server proves its name, the client checks it."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edge_agent.config import Endpoint
from edge_agent.errors import ConfigError
from edge_agent.offload.client.connection import ClientConnection
from edge_agent.offload.client.errors import Unavailable
from edge_agent.offload.wire import messages as m
from edge_agent.offload.wire.transport import OffloadError, client_tls_context, server_tls_context
from tests.integration.offload.offload_helpers import PIPER, PSK, make_router, spoken


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(directory: Path, label: str) -> tuple[Path, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(label)).issuer_name(_name(label))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    path = directory / f"{label}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key, cert


def make_server_cert(directory: Path, ca_key, ca_cert) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name("edge-offload test server"))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def pki(tmp_path):
    ca_path, ca_key, ca_cert = make_ca(tmp_path, "test-ca")
    other_ca, _, _ = make_ca(tmp_path, "other-ca")
    cert, key = make_server_cert(tmp_path, ca_key, ca_cert)
    return {"ca": ca_path, "other_ca": other_ca, "cert": cert, "key": key}


@pytest.fixture
def tls_server(serve, pki):
    return serve(tls=server_tls_context(pki["cert"], pki["key"]))


def test_tls_connection_with_the_test_ca_synthesizes(tls_server, pki):
    async def go():
        conn = await ClientConnection.open(Endpoint("tls", "127.0.0.1", tls_server.port), PSK,
                                           timeout=10, tls_ca=str(pki["ca"]))
        try:
            q: asyncio.Queue = asyncio.Queue()
            await conn.request(q.put_nowait, ("Encrypted hello.",), PIPER, m.Codec.OPUS)
            msgs = [await asyncio.wait_for(q.get(), 30)]
            while not isinstance(msgs[-1], m.End | m.Error):
                msgs.append(await asyncio.wait_for(q.get(), 30))
            return conn.conn.close_reason, msgs
        finally:
            await conn.close()

    _, msgs = asyncio.run(go())
    assert isinstance(msgs[-1], m.End) and msgs[-1].samples > 0


def test_tls_client_refuses_a_server_its_ca_did_not_sign(tls_server, pki):
    with pytest.raises(Unavailable, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        asyncio.run(ClientConnection.open(Endpoint("tls", "127.0.0.1", tls_server.port), PSK,
                                          timeout=10, tls_ca=str(pki["other_ca"])))


def test_tls_client_checks_the_server_name(tls_server, pki):
    with pytest.raises(Unavailable, match=r"mismatch|doesn't match|not valid for"):
        asyncio.run(ClientConnection.open(Endpoint("tls", "127.0.0.1", tls_server.port), PSK, timeout=10,
                                          tls_ca=str(pki["ca"]), server_name="somewhere-else.example"))


def test_plain_client_cannot_talk_to_a_tls_server(tls_server):
    with pytest.raises(OffloadError, match="connection closed"):
        asyncio.run(ClientConnection.open(Endpoint("tcp", "127.0.0.1", tls_server.port), PSK, timeout=3))


def test_router_speaks_remotely_over_tls(tls_server, pki, local_synth):
    router = make_router(local_synth, f"tls://127.0.0.1:{tls_server.port}", voice=PIPER,
                         tls_ca=pki["ca"], codec="opus")
    try:
        assert spoken(list(router.stream("Secure channel. Still speaking.")), 2) == ["remote", "remote"]
    finally:
        router.close()


def test_bad_tls_files_are_config_errors(tmp_path, pki):
    with pytest.raises(ConfigError, match="tls_cert/tls_key"):
        server_tls_context(pki["cert"], tmp_path / "missing.key")
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"offload\.tls_ca"):
        client_tls_context(bogus)
