"""Helpers for tests against a real mosquitto: a watching client, a producer, the daemon as a process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.announce.playout import DirOpener
from edge_agent.audio.sinks import WavSink
from edge_agent.config import parse_uri
from tests.waiting import TIMEOUT, wait_until  # also the MQTT tests' import of them


@dataclass(frozen=True)
class Seen:
    topic: str
    payload: bytes
    retain: bool

    def json(self) -> Any:
        return json.loads(self.payload)


class Watcher:
    """A client that records everything under `topic` (default `edge/#`)."""

    def __init__(self, url: str, topic: str = "edge/#", client_id: str = "") -> None:
        """With a `client_id` the session persists, so the broker keeps queueing for it across
        its own restarts (it saves sessions) while this client reconnects."""
        ep = parse_uri(url, ("mqtt",))
        self.messages: list[Seen] = []
        self._cond = threading.Condition()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, u, f, r, p: c.subscribe(topic, qos=1)
        self.client.on_subscribe = lambda c, u, m, r, p: self._subscribed.set()
        self.client.reconnect_delay_set(0.1, 0.5)
        props = None
        if client_id:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 3600
        self.client.connect(ep.host, ep.port, keepalive=10, clean_start=not client_id, properties=props)
        self.client.loop_start()
        assert self._subscribed.wait(TIMEOUT), "watcher could not subscribe"

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._cond:
            self.messages.append(Seen(msg.topic, bytes(msg.payload), bool(msg.retain)))
            self._cond.notify_all()

    def find(self, topic: str, pred: Callable[[Any], bool] = lambda _d: True) -> list[Any]:
        with self._cond:
            msgs = [m for m in self.messages if m.topic == topic]
        out = []
        for m in msgs:
            try:
                doc = m.json()
            except ValueError:
                continue
            if pred(doc):
                out.append(doc)
        return out

    def wait(self, topic: str, pred: Callable[[Any], bool] = lambda _d: True, count: int = 1,
             timeout: float = TIMEOUT) -> list[Any]:
        return wait_until(lambda: (found := self.find(topic, pred)) and len(found) >= count and found,
                          timeout, f"{count} message(s) on {topic}")

    def statuses(self, device: str, ann_id: str) -> list[str]:
        topic = f"edge/{device}/announce/status"
        return [d["state"] for d in self.find(topic, lambda d: d.get("id") == ann_id)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Producer:
    """Publishes with QoS 1 over a persistent session, as a well-behaved producer would."""

    def __init__(self, url: str, client_id: str = "test-producer") -> None:
        ep = parse_uri(url, ("mqtt",))
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.reconnect_delay_set(0.1, 0.5)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect(ep.host, ep.port, keepalive=10, clean_start=False, properties=props)
        self.client.loop_start()
        wait_until(self.client.is_connected, what="producer connection")

    def publish(self, topic: str, payload: bytes | str | dict[str, Any], *, retain: bool = False,
                wait: bool = True) -> mqtt.MQTTMessageInfo:
        data = json.dumps(payload).encode() if isinstance(payload, dict) else payload
        info = self.client.publish(topic, data, qos=1, retain=retain)
        if wait:
            info.wait_for_publish(timeout=TIMEOUT)
        return info

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class DaemonProcess:
    """`edge-agent run` in a subprocess; its JSON log lines accumulate in one file across restarts."""

    def __init__(self, workdir: Path, broker_url: str, device: str = "dev1", *, config: Path | None = None,
                 group: str = "default", extra_env: dict[str, str] | None = None,
                 use_out_dir: bool = True) -> None:
        self.workdir = workdir
        self.device = device
        self.broker_url = broker_url
        self.config = config
        self.group = group
        self.out_dir = workdir / "out"
        self.use_out_dir = use_out_dir
        self.log_path = workdir / "daemon.log"
        self.env = dict(os.environ)
        self.env["XDG_STATE_HOME"] = str(workdir / "state")
        self.env.update(extra_env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, extra_env: dict[str, str] | None = None) -> DaemonProcess:
        cmd = [sys.executable, "-m", "edge_agent", "run", "--broker", self.broker_url,
               "--device-id", self.device, "--group", self.group,
               "--set", "daemon.metrics_s=1", "--set", "mqtt.reconnect_max_s=1"]
        if self.use_out_dir:
            cmd += ["--out-dir", str(self.out_dir)]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        env = {**self.env, **(extra_env or {})}
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env)
        return self

    def wait_running(self, timeout: float = TIMEOUT) -> None:
        """Until the log says the speaker is ready (after the voice has loaded)."""
        start = len(self.log_lines())

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            return any(line.get("msg") == "running" for line in self.log_lines()[start:])

        wait_until(ready, timeout, "the daemon to start")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self, timeout: float = TIMEOUT) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def wait_exit(self, timeout: float = TIMEOUT) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log_text().splitlines():
            try:
                doc = json.loads(raw)
            except ValueError:
                continue
            if isinstance(doc, dict):
                lines.append(doc)
        return lines

    def spoken(self) -> list[str]:
        """Ids in speaking order, once per time each was spoken to the end."""
        return [line["id"] for line in self.log_lines() if line.get("event") == "spoken"]

    def started_speaking(self) -> list[str]:
        return [line["id"] for line in self.log_lines() if str(line.get("msg", "")).startswith("speaking (")]

    def close(self) -> None:
        if self.alive:
            self.kill()


# -- synthesis and sinks for the announcement pipeline ------------------------------------------

import numpy as np  # noqa: E402

from edge_agent.announce.message import Announcement  # noqa: E402
from edge_agent.audio.frames import AudioChunk  # noqa: E402
from edge_agent.tts.voice import VoiceOffer  # noqa: E402


class PacedSink(WavSink):
    """An announcement's WAV written at the pace a sound card takes it (its writes block), so the
    announcement lasts as long as its audio, as it does on a loudspeaker."""

    def __init__(self, path: Path, sample_rate: int) -> None:
        super().__init__(path, sample_rate)
        self._t0 = time.monotonic()

    def write(self, samples: Any) -> None:
        super().write(samples)
        time.sleep(max(0.0, self._t0 + self.frames / self.sample_rate - time.monotonic()))


class PacedOpener(DirOpener):
    def open(self, ann: Any, sample_rate: int) -> WavSink:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return PacedSink(self.out_dir / f"{ann.id}.wav", sample_rate)


class ToneSynth:
    """A `Synthesizer` whose sentence i is a constant level (i + 1) / 10: easy to recognise in a WAV."""

    def __init__(self, rate: int = 16000, engine: str = "local", per_sentence_s: float = 0.05,
                 rates: list[int] | None = None) -> None:
        self.rate = rate
        self.engine = engine
        self.n = round(per_sentence_s * rate)
        self.rates = rates
        self.calls: list[str] = []
        self.closed = False

    def stream(self, text: str, voice: str | None = None):
        self.calls.append(text)
        sentences = [s for s in text.split(".") if s.strip()]
        for i, _ in enumerate(sentences):
            rate = self.rates[i] if self.rates else self.rate
            n = round(self.n * rate / self.rate)
            level = np.float32((i + 1) / 10)
            for part, last in ((n // 2, False), (n - n // 2, True)):
                samples = np.full(part, level, dtype=np.float32)
                yield AudioChunk(samples, rate, i, last=last, engine=self.engine)

    def sample_rate(self, voice: str | None = None) -> int:
        return self.rate

    def offers(self) -> list[VoiceOffer]:
        return [VoiceOffer("tone", "local", True)]

    def unload_idle(self) -> list[str]:
        return []  # it loads no voice

    def close(self) -> None:
        self.closed = True


class GatedSink:
    """Wraps a sink; the first write blocks until `gate` is set (to interleave events deterministically)."""

    def __init__(self, inner, gate: threading.Event, entered: threading.Event) -> None:
        self.inner = inner
        self.gate = gate
        self.entered = entered
        self.sample_rate = inner.sample_rate
        self.frames = 0
        self._first = True

    def write(self, samples) -> None:
        if self._first:
            self._first = False
            self.entered.set()
            assert self.gate.wait(TIMEOUT)
        self.inner.write(samples)
        self.frames += len(samples)

    def close(self) -> None:
        self.inner.close()

    def abort(self) -> None:
        self.inner.abort()


class GatedOpener:
    """Opens real WAV sinks in a directory; the announcement named `gated` gets a `GatedSink`."""

    keeps_open = True

    def __init__(self, out_dir: Path, gated: str) -> None:
        from edge_agent.announce.playout import DirOpener

        self.dir = DirOpener(out_dir)
        self.gated = gated
        self.gate = threading.Event()
        self.entered = threading.Event()

    def open(self, ann: Announcement, sample_rate: int):
        sink = self.dir.open(ann, sample_rate)
        return GatedSink(sink, self.gate, self.entered) if ann.id == self.gated else sink


def wav_levels(path: Path) -> list[float]:
    """The distinct constant levels in a ToneSynth WAV, in order."""
    from edge_agent.audio.wav import read_wav

    samples = read_wav(path).samples
    levels: list[float] = []
    for value in np.round(samples, 2):
        if not levels or levels[-1] != value:
            levels.append(round(float(value), 2))
    return levels


# -- model files and a file server with Range support ----------------------------------------------

import hashlib  # noqa: E402
import http.server  # noqa: E402


def tiny_onnx(scale: float = 2.0) -> bytes:
    """A real one-node ONNX model (y = x * scale), built here."""
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Mul", ["x", "s"], ["y"])
    graph = helper.make_graph(
        [node], "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [helper.make_tensor("s", TensorProto.FLOAT, [1], [scale])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FileServer:
    """Serves `files` over HTTP on loopback; honours Range; can cut a response short on purpose."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.truncate: dict[str, int] = {}
        """path -> how many more responses to cut off halfway."""
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                range_header = self.headers.get("Range")
                server.requests.append((self.path, range_header))
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                start = 0
                if range_header:
                    start = int(range_header.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if server.truncate.get(self.path, 0) > 0:
                    server.truncate[self.path] -= 1
                    self.wfile.write(body[: max(1, len(body) // 2)])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# -- fleet ---------------------------------------------------------------------------------------

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

FLEET_KEY = Ed25519PrivateKey.generate()


def fleet_public_key() -> str:
    from edge_agent.fleet.envelope import public_key_text

    return public_key_text(FLEET_KEY.public_key())


def signed(version: int, config: dict[str, Any] | None = None, *, target: str = "device:dev1",
           models: list[dict[str, Any]] | None = None, key: Any = None, **extra: Any) -> bytes:
    """A signed envelope as the operator's `fleet sign` makes it."""
    from edge_agent.fleet.envelope import sign

    body: dict[str, Any] = {"version": version, "target": target, "issued_at": int(time.time()),
                            "config": config or {}, **extra}
    if models is not None:
        body["models"] = models
    return json.dumps(sign(body, key or FLEET_KEY)).encode()


def device_config(path: Path, tmp: Path, **sections: dict[str, Any]) -> Path:
    """A local config trusting FLEET_KEY, with state and cache under `tmp`."""
    import yaml

    doc: dict[str, Any] = {
        "fleet": {"trusted_keys": [fleet_public_key()], "state_dir": str(tmp / "fleet")},
        "announcements": {"state_dir": str(tmp / "announcements")},
        "models": {"cache_dir": str(tmp / "cache")},
        "audio": {"output": "null"},
    }
    for name, values in sections.items():
        doc.setdefault(name, {}).update(values)
    path.write_text(yaml.safe_dump(doc))
    vad_model_in(Path(doc["models"]["cache_dir"]))
    return path


def vad_model_in(cache: Path) -> None:
    """The default VAD's model in a device's own model cache, where `models fetch silero-vad` puts it,
    taken from the suite's shared cache (there once a test asked for Whisper: `whisper_dir`)."""
    shared = Path(os.environ.get("EDGE_SPEECH_CACHE", "")) / "models" / "silero-vad" / "silero_vad.onnx"
    if not shared.is_file():
        return
    mine = cache / "silero-vad" / shared.name
    if mine.exists():  # a device started again on the same cache
        return
    mine.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(shared, mine)  # the same file, not another 2.3 MB
    except OSError:
        shutil.copyfile(shared, mine)


class FleetDevice:
    """A FleetManager over a real local config; activation rehashes pinned models, then `health`."""

    def __init__(self, tmp_path: Path, health: Callable[[Any], None] | None = None) -> None:
        from edge_agent.daemon import SettingsSource
        from edge_agent.fleet.manager import FleetManager
        from edge_agent.models import load_catalog

        path = tmp_path / "device.yaml"
        if not path.exists():
            device_config(path, tmp_path, fleet={"download_attempts": 2, "download_timeout_s": 5})
        self.source = SettingsSource(path)
        base = self.source.build()
        self.cache = base.models.cache_dir
        self.health = health or (lambda settings: None)
        self.fm = FleetManager(base.fleet, device="dev1", group=lambda: "g", cache_dir=self.cache,
                               validate=self.source.build, activate=self._activate,
                               base_catalog=load_catalog(None))
        self.fm.recover()

    def _activate(self, active: Any) -> None:
        from edge_agent.models import ModelStore, load_catalog

        settings = self.source.build(active.layer)
        store = ModelStore(settings.models.cache_dir, load_catalog(settings.models.catalog))
        for model_id in active.pins:
            store.require(model_id)  # rehashes what the link points at
        self.health(settings)

    def scale(self) -> float:
        """Run the model the store serves now: it multiplies by its version's scale."""
        from edge_agent.models import ModelStore, load_catalog
        from edge_agent.runtime.sessions import make_session

        settings = self.source.build(self.fm.active.layer)
        store = ModelStore(settings.models.cache_dir, load_catalog(settings.models.catalog))
        files = store.require("tiny-mul")
        session = make_session(files.path("tiny.onnx"), 1)
        return float(session.run(None, {"x": np.array([1.0], dtype=np.float32)})[0][0])
