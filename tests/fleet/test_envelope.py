import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_agent.fleet.envelope import (
    FleetRejected,
    canonical_json,
    decode_payload,
    parse_envelope,
    public_key_text,
    sign,
    trusted_keys,
    verify,
)

KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()
TRUSTED = trusted_keys([public_key_text(KEY.public_key())])
LIMIT = 262144


def body(**kw):
    doc = {"version": 7, "target": "group:kitchen", "issued_at": 1700000000,
           "config": {"tts": {"length_scale": 1.1}, "audio": {"volume": 0.8}}}
    doc.update(kw)
    return doc


def roundtrip(doc):
    return parse_envelope(decode_payload(json.dumps(doc).encode(), LIMIT))


def test_a_signed_envelope_verifies_with_the_trusted_key():
    env = roundtrip(sign(body(), KEY))
    assert verify(env, TRUSTED) == 0
    assert (env.version, env.target, env.config["audio"]["volume"]) == (7, "group:kitchen", 0.8)


def test_the_signature_covers_canonical_json_whatever_the_key_order():
    signed = sign(body(), KEY)
    reordered = json.loads(json.dumps(signed))
    reordered = {k: reordered[k] for k in reversed(list(reordered))}
    text = json.dumps(reordered, indent=4)
    env = parse_envelope(decode_payload(text.encode(), LIMIT))
    assert verify(env, TRUSTED) == 0
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'.encode()


@pytest.mark.parametrize("change", [
    lambda d: d["config"]["audio"].update(volume=1.0),
    lambda d: d.update(version=8),
    lambda d: d.update(target="all"),
    lambda d: d.update(expires_at=1),
])
def test_any_change_after_signing_breaks_the_signature(change):
    signed = sign(body(), KEY)
    change(signed)
    with pytest.raises(FleetRejected, match="bad signature"):
        verify(roundtrip(signed), TRUSTED)


def test_a_signature_by_an_untrusted_key_is_rejected():
    with pytest.raises(FleetRejected, match="bad signature"):
        verify(roundtrip(sign(body(), OTHER)), TRUSTED)


def test_no_trusted_keys_means_no_config_is_accepted():
    with pytest.raises(FleetRejected, match="no trusted keys"):
        verify(roundtrip(sign(body(), KEY)), [])


def test_a_yaml_payload_is_read_like_json():
    signed = sign(body(), KEY)
    yaml_text = "\n".join(f"{k}: {json.dumps(v)}" for k, v in signed.items())
    env = parse_envelope(decode_payload(yaml_text.encode(), LIMIT))
    assert verify(env, TRUSTED) == 0


@pytest.mark.parametrize(("payload", "reason"), [
    (b"a: &a [x,x,x,x,x,x,x,x,x]\n" + b"".join(
        f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n".encode()
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)), "YAML"),
    (b"x:" + b" [" * 200 + b"]" * 200, "deeper"),
    (b"[" * 5000 + b"]" * 5000, "deeper"),
    (b"{" + b'"a":1,' * 10 + b'"a":2}', "duplicate key"),
    (b'{"version": NaN}', "NaN"),
    (b"\xff\xfe", "not UTF-8"),
    (b"when: 2024-01-01\n", "date"),
    (b"x" * (LIMIT + 1), "limit is"),
])
def test_hostile_payloads_are_rejected_without_being_expanded(payload, reason):
    with pytest.raises(FleetRejected, match=reason):
        decode_payload(payload, LIMIT)


def test_a_10_mb_payload_is_rejected_before_parsing():
    payload = b"{" + b" " * (10 * 1024 * 1024) + b"}"
    with pytest.raises(FleetRejected, match=r"payload is 10485762 bytes, the limit is 262144"):
        decode_payload(payload, LIMIT)


@pytest.mark.parametrize(("doc", "reason"), [
    (body(version=0), "'version'"),
    (body(version="7"), "'version'"),
    (body(target="device:"), "'target'"),
    (body(target="room:x"), "'target'"),
    (body(target="all\n"), "'target'"),  # "$" alone would match before a final newline
    (body(issued_at="now"), "'issued_at'"),
    (body(config=[1]), "'config' must be a mapping"),
    (body(extra=1), "unknown envelope field 'extra'"),
    (body(models=[{"id": "m", "url": "ftp://x/m.onnx", "sha256": "0" * 64, "size": 1}]), "http"),
    (body(models=[{"id": "m", "url": "http://x/m.onnx", "sha256": "XYZ", "size": 1}]), "sha256"),
    (body(models=[{"id": "m\n", "url": "http://x/m.onnx", "sha256": "0" * 64, "size": 1}]), "id"),
    (body(models=[{"id": "m", "url": "http://x/", "files": [{"name": "../m", "sha256": "0" * 64,
                                                              "size": 1}]}]), "plain file name"),
])
def test_malformed_envelopes_are_rejected_with_the_field_named(doc, reason):
    with pytest.raises(FleetRejected, match=reason):
        parse_envelope({**doc, "signature": "AAAA"})


def test_a_single_file_model_names_its_file_from_the_url():
    env = parse_envelope({**body(models=[{"id": "tiny", "url": "http://h/m/tiny.onnx", "sha256": "a" * 64,
                                          "size": 10}]), "signature": "x"})
    spec = env.models[0]
    assert (spec.url, spec.files[0].name, spec.file_url("tiny.onnx")) == \
        ("http://h/m", "tiny.onnx", "http://h/m/tiny.onnx")


def test_targets_match_device_group_or_all():
    env = roundtrip(sign(body(target="device:d1"), KEY))
    assert env.matches("d1", "g") and not env.matches("d2", "g")
    assert roundtrip(sign(body(target="group:g"), KEY)).matches("d9", "g")
    assert roundtrip(sign(body(target="all"), KEY)).matches("any", "other")
