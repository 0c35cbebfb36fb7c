"""`edge-agent doctor`: one line per thing the agent depends on; exit 1 if a needed one fails."""

from __future__ import annotations

import argparse
import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edge_agent.asr.manifest import load_manifest, verify_files
from edge_agent.asr.whisper import Padding, WhisperOnnx, resolve_export_dir
from edge_agent.audio.sinks import OUTPUT_NEXT_STEP, AudioUnavailable, import_sounddevice
from edge_agent.commands.context import Context
from edge_agent.config import parse_uri
from edge_agent.errors import EdgeError, ModelError
from edge_agent.listen.endofturn import MODEL_ID as TURN_MODEL
from edge_agent.mqtt.settings import MqttSettings
from edge_agent.offload.client import probe
from edge_agent.offload.wire import PSK_ENV, load_psk
from edge_agent.runtime.providers import Use, available, cuda_libraries, for_use, running_on
from edge_agent.tts.registry import VoiceRegistry
from edge_agent.vad import SILERO_MODEL

USES: tuple[Use, ...] = ("tts", "asr", "server")
"""The uses whose providers `runtime.*` sets."""


@dataclass(frozen=True)
class Check:
    """The outcome of one check."""

    name: str
    ok: bool
    needed: bool
    detail: str

    def line(self) -> str:
        mark = "ok" if self.ok else ("FAIL" if self.needed else "warn")
        return f"{mark:<4}  {self.name:<8} {self.detail}"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("doctor", parents=[common], help="check audio, models, broker and server")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds per network check")
    p.set_defaults(handler=run)


def check_audio(ctx: Context) -> Check:
    audio = ctx.settings.audio
    needed = audio.output == "sounddevice" and audio.fallback == "error"
    if audio.output != "sounddevice":
        return Check("audio", True, needed, f"output is {audio.output!r} (no sound card used)")
    try:
        sd = import_sounddevice()
        info = sd.query_devices(audio.output_device, "output")
    except AudioUnavailable as exc:
        return Check("audio", False, needed, f"{exc}; fallback: {audio.fallback}")
    except Exception:  # PortAudioError / ValueError: no such device
        what = "no sound card" if audio.output_device is None else f"no device {audio.output_device!r}"
        return Check("audio", False, needed, f"PortAudio finds {what}: {OUTPUT_NEXT_STEP}; "
                                             f"fallback: {audio.fallback}")
    return Check("audio", True, needed,
                 f"{info['name']} ({int(info['default_samplerate'])} Hz) via PortAudio")


def check_models(ctx: Context) -> list[Check]:
    store = ctx.store
    settings = ctx.settings
    voice = settings.tts.voice
    # Listening needs the VAD's model; a device that only speaks does not, so it warns, never fails.
    listens = settings.listen.mode != "off" and settings.vad.engine == "silero"
    ends_turns = settings.listen.mode == "wake" and settings.listen.end_of_turn == "model"
    checks = []
    for entry in store.catalog:
        needed = entry.id == voice
        problems = store.verify(entry.id) if store.locate(entry.id) or needed else None
        if problems is None and listens and entry.id == SILERO_MODEL:
            checks.append(Check("model", False, False, f"{entry.id}: not fetched, and vad.engine is silero: "
                                                       f"run `edge-agent models fetch {entry.id}` to listen"))
        elif problems != [] and ends_turns and entry.id == TURN_MODEL:
            why = "not fetched" if problems is None else problems[0]
            checks.append(Check("model", False, False, f"{entry.id}: {why}, and listen.end_of_turn is model: "
                                                       f"turns end at the VAD's hangover until `edge-agent "
                                                       f"models fetch {entry.id}`"))
        elif problems is None:
            checks.append(Check("model", True, False, f"{entry.id}: not fetched (optional)"))
        elif problems:
            checks.append(Check("model", False, needed, f"{entry.id}: {problems[0]}"))
        else:
            checks.append(Check("model", True, needed, f"{entry.id}: present, sha256 verified"))
    return checks


def check_runtime(ctx: Context) -> Check:
    """The onnxruntime build, the providers it offers and those each use will run on."""
    import onnxruntime as ort  # ~250 ms: only when doctor runs (runtime/sessions.py keeps it lazy too)


    runtime, cache = ctx.settings.runtime, ctx.settings.models.cache_dir
    uses = "; ".join(f"{use}: {', '.join(for_use(runtime, use, cache).names)}" for use in USES)
    missing = cuda_libraries() if "cuda" in available() else None
    if missing is not None:  # the GPU build without its libraries: sessions would fall back to the CPU
        return Check("runtime", False, False, f"onnxruntime {ort.__version__}: {missing}")
    return Check("runtime", True, False, f"onnxruntime {ort.__version__} offers {', '.join(available())}; "
                                         f"{uses}")


def _ran_on(wanted: tuple[str, ...], sessions: dict[str, Any]) -> tuple[bool, str]:
    """Whether every session got the first provider asked for, and `part on providers` for each."""
    where = {part: running_on(s) for part, s in sessions.items()}
    ok = all(on.split(", ")[0] == wanted[0] for on in where.values())
    return ok, ", ".join(f"{part} on {on}" for part, on in where.items())


def check_tts(ctx: Context) -> Check:
    """One sentence from the configured voice on its providers; which provider each session got."""
    settings = ctx.settings
    try:
        accel = for_use(settings.runtime, "tts", settings.models.cache_dir)
        voice = VoiceRegistry(ctx.store, settings.tts, accel=accel).get(settings.tts.voice)
    except ModelError as exc:
        return Check("tts", False, True, str(exc))
    try:
        samples = sum(len(chunk) for chunk in voice.synthesize_sentence("Ready."))
        ok, where = _ran_on(settings.runtime.wanted("tts"), voice.sessions())
    finally:
        voice.close()
    detail = f"{voice.id}: {where}; one sentence, {samples / voice.sample_rate:.2f} s of audio"
    if not ok:
        detail += f" (asked for {', '.join(settings.runtime.wanted('tts'))})"
    return Check("tts", ok and samples > 0, samples == 0, detail)


def check_asr(ctx: Context) -> Check:
    """The Whisper export the listener would load: present, variant known, files as the manifest says;
    then one encoder and decoder run on its providers."""
    asr = ctx.settings.asr
    directory = resolve_export_dir(asr, ctx.settings.models)
    try:
        manifest = load_manifest(directory)
        variant = manifest.variant(asr.variant or None)
        verify_files(manifest, [variant.encoder, variant.decoder, "tokenizer.json"])
    except ModelError as exc:
        return Check("asr", False, False, str(exc))
    wanted = ctx.settings.runtime.wanted("asr")
    try:
        model = WhisperOnnx.load(directory, variant.name, asr.threads, decoder_threads=asr.decoder_threads,
                                 verify=False, accel=for_use(ctx.settings.runtime, "asr",
                                                                ctx.settings.models.cache_dir))
    except ModelError as exc:
        return Check("asr", False, False, str(exc))
    try:
        # One second of silence, bucket-padded: the encoder and one decoder step, for real.
        silence = np.zeros(16000, dtype=np.float32)
        frames = Padding.from_settings(asr).frames(silence.size)
        cross_k, cross_v = model.encode(model.features(silence, frames))
        model.decode(cross_k, cross_v, model.prompt(asr.language), max_tokens=1)
        ok, where = _ran_on(wanted, model.sessions())
    finally:
        model.close()
    asked = "" if ok else f" (asked for {', '.join(wanted)})"
    return Check("asr", ok, False, f"{directory} ({variant.name}), files verified; {where}{asked}")


def check_broker(ctx: Context, timeout: float) -> Check:
    broker = ctx.settings.mqtt.broker
    if not broker:
        return Check("broker", True, False, "MQTT disabled (mqtt.broker is empty)")
    ep = parse_uri(broker, ("mqtt", "mqtts"))
    ok, detail = _mqtt_connect(ep.host, ep.port, ep.scheme == "mqtts", timeout)
    # Say whose broker answered: the default one on this host may be another program's.
    origin = ("the default: set mqtt.broker, or `run --broker`, for another"
              if broker == MqttSettings.broker else "configured")
    return Check("broker", ok, True, f"mqtt.broker {broker} ({origin}): {detail}")


def _mqtt_connect(host: str, port: int, tls: bool, timeout: float) -> tuple[bool, str]:
    """A real MQTT CONNECT/CONNACK, not just an open port."""
    done = threading.Event()
    result: list[str] = []

    def on_connect(client: mqtt.Client, userdata: object, flags: object, reason: object,
                   props: object = None) -> None:
        result.append(str(reason))
        done.set()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_connect = on_connect
    if tls:
        client.tls_set()
    try:
        client.connect(host, port, keepalive=10)
    except OSError as exc:
        return False, f"unreachable ({exc.strerror or exc})"
    client.loop_start()
    try:
        if not done.wait(timeout):
            return False, f"no CONNACK within {timeout:g} s"
    finally:
        client.disconnect()
        client.loop_stop()
    return result[0] == "Success", f"MQTT CONNACK: {result[0]}"


def check_server(ctx: Context, timeout: float) -> Check | list[Check]:
    """One line per configured server (`offload.server` and `offload.servers`)."""
    offload = ctx.settings.offload
    if not offload.targets:
        return Check("server", True, False, "no offload server configured (local synthesis only)")
    needed = offload.policy == "remote"
    checks = []
    for uri in offload.targets:
        ok, detail = _offload_probe(ctx, uri, timeout)
        checks.append(Check("server", ok, needed, f"{uri}: {detail}"))
    return checks if len(checks) > 1 else checks[0]


def _offload_probe(ctx: Context, uri: str, timeout: float) -> tuple[bool, str]:
    """A real HELLO, key exchange and PING, not just an open port."""

    offload = ctx.settings.offload
    ep = parse_uri(uri, ("tcp", "tls"))
    psk: bytes | None = None
    tls_ca = str(offload.tls_ca) if offload.tls_ca else None
    try:
        psk = load_psk(offload.psk_file)
        info = asyncio.run(probe(ep, psk, timeout=timeout, tls_ca=tls_ca,
                                 server_name=offload.tls_server_name))
    except EdgeError as exc:
        hint = f" (no key: set offload.psk_file or ${PSK_ENV})" if "AUTH" in str(exc) and psk is None else ""
        return False, f"{str(exc).removeprefix(f'{ep.host}:{ep.port}: ')}{hint}"
    voices = ", ".join(f"{v} ({r} Hz)" for v, r in info.voices.items())
    missing = offload.voice and offload.voice not in info.voices
    auth = "authenticated" if info.authenticated else "NO KEY (insecure server)"
    detail = (f"{info.name}, {auth}, ping {info.rtt_s * 1000:.1f} ms, codecs "
              f"{'/'.join(sorted(c.name for c in info.codecs))}, voices {voices}")
    if missing:
        return False, f"{detail}; offload.voice {offload.voice!r} is not offered"
    return True, detail


def check_sendspin(ctx: Context) -> Check:
    """Whether the Sendspin player can run here (needed only when `sendspin.enabled`)."""
    from edge_agent.sendspin.player import sendspin_missing

    enabled = ctx.settings.sendspin.enabled
    missing = sendspin_missing()
    if missing is not None:
        return Check("sendspin", not enabled, enabled, missing if enabled else
                     f"off (sendspin.enabled is false); {missing.removesuffix('; the music player is off')}")
    port = ctx.settings.sendspin.port
    return Check("sendspin", True, enabled, f"player on port {port}" if enabled else
                 "off (sendspin.enabled is false); aiosendspin is installed")


def run(args: argparse.Namespace) -> int:
    ctx = Context(args)
    probes: list[Callable[[], Check | list[Check]]] = [
        lambda: check_audio(ctx),
        lambda: check_models(ctx),
        lambda: check_runtime(ctx),
        lambda: check_tts(ctx),
        lambda: check_asr(ctx),
        lambda: check_broker(ctx, args.timeout),
        lambda: check_server(ctx, args.timeout),
        lambda: check_sendspin(ctx),
    ]
    failed = False
    for check_one in probes:
        result = check_one()
        for check in result if isinstance(result, list) else [result]:
            print(check.line(), flush=True)
            failed |= check.needed and not check.ok
    return 1 if failed else 0
