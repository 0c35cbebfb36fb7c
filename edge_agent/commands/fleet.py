"""`edge-agent fleet keygen|sign|verify|push`: operator tools for signed fleet config."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from paho.mqtt.enums import CallbackAPIVersion

from edge_agent.commands.context import Context
from edge_agent.config import MqttSettings, parse_uri
from edge_agent.errors import ConfigError, UsageError
from edge_agent.fleet.envelope import (
    FleetRejected,
    decode_payload,
    load_private_key,
    parse_envelope,
    parse_public_key,
    private_key_pem,
    public_key_text,
    sign,
    trusted_keys,
    verify,
)
from edge_agent.mqtt.bridge import read_password, tls_context
from edge_agent.mqtt.topics import config_topic
from edge_agent.safeyaml import load_yaml_file


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("fleet", help="create, sign, check and publish fleet configs")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    keygen = verbs.add_parser("keygen", parents=[common], help="create an Ed25519 signing key")
    keygen.add_argument("--out", metavar="KEY", type=Path, required=True,
                        help="private key file to write (PEM, mode 0600); KEY.pub gets the public key")
    keygen.set_defaults(handler=cmd_keygen)

    sg = verbs.add_parser("sign", parents=[common], help="sign a config file into an envelope",
                          description="SOURCE (YAML or JSON) holds target, config and optionally models, "
                                      "expires_at and version; prints the signed JSON envelope.")
    sg.add_argument("source", metavar="SOURCE", type=Path)
    sg.add_argument("--key", metavar="KEY", type=Path, required=True, help="private key from keygen")
    sg.add_argument("--version", type=int,
                    help="config version (default: SOURCE's, else now in unix seconds)")
    sg.add_argument("--target", help="device:<id>, group:<name> or all (default: SOURCE's)")
    sg.add_argument("--expires-in", type=float, metavar="SECONDS", help="refuse it after this long")
    sg.add_argument("--out", metavar="FILE", type=Path, help="write here instead of stdout")
    sg.set_defaults(handler=cmd_sign)

    vf = verbs.add_parser("verify", parents=[common], help="check an envelope's signature and fields")
    vf.add_argument("envelope", metavar="ENVELOPE", type=Path)
    vf.add_argument("--key", metavar="PUBLIC", action="append", default=[],
                    help="trusted public key (base64) or .pub file; default: fleet.trusted_keys")
    vf.add_argument("--device-id", help="also check the target matches this device")
    vf.add_argument("--group", help="the device's group (with --device-id)")
    vf.set_defaults(handler=cmd_verify)

    push = verbs.add_parser("push", parents=[common], help="publish an envelope (retained) to its target")
    push.add_argument("envelope", metavar="ENVELOPE", type=Path)
    push.add_argument("--broker", metavar="mqtt://HOST:PORT", help="default: mqtt.broker")
    push.add_argument("--wait", type=float, default=10.0, metavar="SECONDS",
                      help="wait this long for devices' config/status reports (0: do not wait)")
    push.add_argument("--no-retain", action="store_true", help="do not retain it on the broker")
    push.set_defaults(handler=cmd_push)


def cmd_keygen(args: argparse.Namespace) -> int:
    path: Path = args.out
    pub = path.with_name(path.name + ".pub")
    for target in (path, pub):
        if target.exists():
            raise UsageError(f"{target} exists; refusing to overwrite a key")
    key = Ed25519PrivateKey.generate()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot create {path}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(private_key_pem(key))
    text = public_key_text(key.public_key())
    pub.write_text(text + "\n")
    print(f"private key: {path} (keep it off the devices)")
    print(f"public key:  {text}")
    print("add the public key to fleet.trusted_keys in each device's config")
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    source = load_yaml_file(args.source)
    if not isinstance(source, dict):
        raise ConfigError(f"{args.source}: expected a mapping with target and config")
    key = load_private_key(args.key)
    body: dict[str, Any] = {k: v for k, v in source.items() if k != "signature"}
    if args.target:
        body["target"] = args.target
    now = time.time()
    body["version"] = args.version if args.version is not None else body.get("version", int(now))
    body["issued_at"] = int(now)
    if args.expires_in is not None:
        body["expires_at"] = int(now + args.expires_in)
    body.setdefault("config", {})
    envelope = sign(body, key)
    try:
        parse_envelope(envelope)
    except FleetRejected as exc:
        raise UsageError(f"{args.source}: {exc.reason}") from None
    text = json.dumps(envelope, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if args.out is not None:
        args.out.write_text(text)
        print(f"{args.out}: version {body['version']}, target {body['target']}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _read_envelope(path: Path, max_bytes: int) -> Any:
    try:
        payload = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return payload, parse_envelope(decode_payload(payload, max_bytes))
    except FleetRejected as exc:
        raise UsageError(f"{path}: {exc.reason}") from None


def cmd_verify(args: argparse.Namespace) -> int:
    ctx = Context(args)
    _, envelope = _read_envelope(args.envelope, ctx.settings.fleet.max_payload_bytes)
    texts = []
    for item in args.key:
        path = Path(item)
        texts.append(path.read_text().strip() if path.is_file() else item)
    keys = [parse_public_key(t) for t in texts] if texts else trusted_keys(ctx.settings.fleet.trusted_keys)
    try:
        index = verify(envelope, keys)
        if envelope.expired():
            raise FleetRejected(f"expired at {envelope.expires_at:.0f}")
        if args.device_id and not envelope.matches(args.device_id, args.group or ""):
            raise FleetRejected(f"target {envelope.target} does not include device {args.device_id}")
    except FleetRejected as exc:
        raise UsageError(f"{args.envelope}: {exc.reason}") from None
    models = ", ".join(m.id for m in envelope.models) or "none"
    print(f"ok: version {envelope.version}, target {envelope.target}, signed by trusted key #{index + 1}, "
          f"models: {models}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    ctx = Context(args, {"mqtt.broker": args.broker} if args.broker else None)
    settings = ctx.settings
    payload, envelope = _read_envelope(args.envelope, settings.fleet.max_payload_bytes)
    if not settings.mqtt.broker:
        raise UsageError("no broker: give --broker mqtt://HOST:PORT")
    topic = config_topic(settings.mqtt.prefix, envelope.target)
    want = envelope.target.partition(":")[2] if envelope.target.startswith("device:") else None
    seen = _publish_and_collect(settings.mqtt, topic, payload, envelope.version, retain=not args.no_retain,
                                wait=args.wait, want=want)
    print(f"published version {envelope.version} to {topic}")
    if args.wait <= 0:
        return 0
    for device, doc in sorted(seen.items()):
        error = f": {doc['error']}" if doc.get("error") else ""
        print(f"{device}: {doc.get('state')}{error}")
    if want and want not in seen:
        raise UsageError(f"no report from {want} within {args.wait:g} s")
    bad = [d for d, doc in seen.items() if doc.get("state") != "applied"]
    if bad:
        raise UsageError(f"not applied on {', '.join(sorted(bad))}")
    return 0


def _publish_and_collect(mqtt_settings: MqttSettings, topic: str, payload: bytes, version: int, *,
                         retain: bool, wait: float, want: str | None) -> dict[str, dict[str, Any]]:
    """Publish, then gather `config/status` reports for `version` for `wait` seconds
    (or until device `want` has reported)."""

    ep = parse_uri(mqtt_settings.broker, ("mqtt", "mqtts"))
    prefix = mqtt_settings.prefix
    reports: dict[str, dict[str, Any]] = {}
    cond = threading.Condition()

    def on_message(client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        try:
            doc = json.loads(message.payload)
        except ValueError:
            return
        if isinstance(doc, dict) and doc.get("version") == version:
            with cond:
                reports[message.topic[len(prefix) + 1:].split("/")[0]] = doc
                cond.notify_all()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    if mqtt_settings.username:
        client.username_pw_set(mqtt_settings.username, read_password(mqtt_settings))
    if ep.scheme == "mqtts":
        client.tls_set_context(tls_context(mqtt_settings))
    client.on_message = on_message
    try:
        client.connect(ep.host, ep.port, keepalive=30)
    except OSError as exc:
        raise UsageError(f"cannot reach {mqtt_settings.broker}: {exc.strerror or exc}") from None
    client.loop_start()
    try:
        if wait > 0:
            client.subscribe(f"{prefix}/+/config/status", qos=1)
        info = client.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(timeout=10)
        if not info.is_published():
            raise UsageError(f"{mqtt_settings.broker}: publish to {topic} not acknowledged")
        deadline = time.monotonic() + wait
        with cond:
            while time.monotonic() < deadline and not (want and want in reports):
                cond.wait(deadline - time.monotonic())
            return dict(reports)
    finally:
        client.disconnect()
        client.loop_stop()
