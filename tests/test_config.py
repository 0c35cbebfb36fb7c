from pathlib import Path

import pytest

from edge_agent.config import FleetSettings, Settings, load_settings, parse_override
from edge_agent.errors import ConfigError
from edge_agent.typedtree import to_dict

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_default_yaml_matches_built_in_defaults(monkeypatch):
    for var in ("XDG_STATE_HOME", "XDG_CACHE_HOME", "EDGE_SPEECH_CACHE"):
        monkeypatch.delenv(var, raising=False)
    assert to_dict(load_settings(REPO / "configs" / "default.yaml")) == to_dict(Settings())


def test_unknown_key_names_its_path(tmp_path):
    with pytest.raises(ConfigError, match=r"^tts\.voise: unknown key"):
        load_settings(write(tmp_path, "tts:\n  voise: x\n"))


def test_unknown_section_names_its_path(tmp_path):
    with pytest.raises(ConfigError, match=r"^ttss: unknown key"):
        load_settings(write(tmp_path, "ttss: {}\n"))


def test_wrong_type_names_its_path(tmp_path):
    with pytest.raises(ConfigError, match=r"^tts\.threads: expected an integer, got a string"):
        load_settings(write(tmp_path, "tts:\n  threads: two\n"))
    with pytest.raises(ConfigError, match=r"^audio\.volume: expected a number"):
        load_settings(write(tmp_path, "audio:\n  volume: true\n"))
    with pytest.raises(ConfigError, match=r"^audio: expected a mapping, got a list"):
        load_settings(write(tmp_path, "audio: [1]\n"))


def test_value_checks_name_their_path(tmp_path):
    with pytest.raises(ConfigError, match=r"^audio\.volume: 1.5 is outside 0\.\.1"):
        load_settings(write(tmp_path, "audio:\n  volume: 1.5\n"))
    with pytest.raises(ConfigError, match=r"^audio\.output: 'speaker' is not one of"):
        load_settings(write(tmp_path, "audio:\n  output: speaker\n"))
    with pytest.raises(ConfigError, match=r"^mqtt\.broker: 'http://x:1': scheme must be"):
        load_settings(write(tmp_path, "mqtt:\n  broker: http://x:1\n"))
    with pytest.raises(ConfigError, match=r"^tts\.noise_w: -0.5 is outside 0\.\.2"):
        load_settings(write(tmp_path, "tts:\n  noise_w: -0.5\n"))


def test_unknown_voice_is_reported_with_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"^tts\.voice: unknown voice 'x' \(known: .*en_US-joe-medium"):
        load_settings(write(tmp_path, "tts:\n  voice: x\n"))


def test_layers_defaults_then_file_then_overrides(tmp_path):
    path = write(tmp_path, "tts:\n  threads: 3\n  sentence_silence_s: 0.5\n")
    settings = load_settings(path, {"tts.threads": 1})
    assert settings.tts.threads == 1
    assert settings.tts.sentence_silence_s == 0.5
    assert settings.tts.idle_unload_s == Settings().tts.idle_unload_s


def test_config_file_comes_from_the_environment_when_not_given(tmp_path):
    path = write(tmp_path, "device:\n  group: kitchen\n")
    assert load_settings(env={"EDGE_AGENT_CONFIG": str(path)}).device.group == "kitchen"


def test_override_values_are_parsed_as_yaml():
    assert parse_override("tts.threads=4") == ("tts.threads", 4)
    assert parse_override("audio.output_device=null") == ("audio.output_device", None)
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_override("tts.threads")


def test_override_into_a_scalar_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^tts\.voice: is not a section"):
        load_settings(None, {"tts.voice": "x", "tts.voice.x": 1})
    with pytest.raises(ConfigError, match=r"^tts\.threads: expected an integer, got a mapping"):
        load_settings(None, {"tts.threads.x": 1})


def test_missing_config_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "absent.yaml")


def test_empty_file_means_defaults(tmp_path):
    assert to_dict(load_settings(write(tmp_path, ""))) == to_dict(Settings())


def test_top_level_must_be_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_settings(write(tmp_path, "- a\n- b\n"))


def test_device_id_cannot_break_topics(tmp_path):
    with pytest.raises(ConfigError, match=r"^device\.id: 'a/b' may not contain"):
        load_settings(write(tmp_path, "device:\n  id: a/b\n"))


def test_example_server_config_loads(monkeypatch):
    settings = load_settings(REPO / "configs" / "server.yaml")
    assert settings.server.host == "0.0.0.0"
    assert settings.server.voices[0] == "kokoro-82m"


def test_server_and_offload_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"^server\.port: 70000 is outside"):
        load_settings(write(tmp_path, "server:\n  port: 70000\n"))
    with pytest.raises(ConfigError, match=r"^server\.tls_cert: tls_cert and tls_key go together"):
        load_settings(write(tmp_path, "server:\n  tls_cert: /etc/cert.pem\n"))
    with pytest.raises(ConfigError, match=r"^server\.voices\[0\]: unknown voice 'nope'"):
        load_settings(write(tmp_path, "server:\n  voices: [nope]\n"))
    with pytest.raises(ConfigError, match=r"^offload\.voice: unknown voice 'nope'"):
        load_settings(write(tmp_path, "offload:\n  voice: nope\n"))
    with pytest.raises(ConfigError, match=r"^offload\.reconnect_max_s: must not be below"):
        load_settings(write(tmp_path, "offload:\n  reconnect_min_s: 5\n  reconnect_max_s: 1\n"))
    with pytest.raises(ConfigError, match=r"^offload\.max_frame_bytes: 100 is outside"):
        load_settings(write(tmp_path, "offload:\n  max_frame_bytes: 100\n"))
    with pytest.raises(ConfigError, match=r"^offload\.server: 'http://x:1': scheme must be"):
        load_settings(write(tmp_path, "offload:\n  server: http://x:1\n"))


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


def test_server_queue_bound_is_read_as_max_streams_with_a_warning(tmp_path, caplog):
    """A config file written before the rename keeps loading, and says what to write instead."""
    path = write(tmp_path, "server:\n  queue_bound: 5\n")
    with caplog.at_level("WARNING"):
        assert load_settings(path).server.max_streams == 5
    assert any("server.queue_bound: renamed to server.max_streams" in r.getMessage() for r in caplog.records)
    assert load_settings(None, {"server.queue_bound": 6}).server.max_streams == 6


def test_a_later_layer_wins_whichever_name_of_a_renamed_key_each_used(tmp_path):
    old_file = write(tmp_path, "server:\n  queue_bound: 5\n")
    assert load_settings(old_file, {"server.max_streams": 7}).server.max_streams == 7
    assert load_settings(old_file, layers=[{"server": {"max_streams": 8}}]).server.max_streams == 8
    new_file = write(tmp_path, "server:\n  max_streams: 5\n")
    assert load_settings(new_file, {"server.queue_bound": 9}).server.max_streams == 9
    with pytest.raises(ConfigError, match=r"^server\.queue_bound: renamed to server\.max_streams, "
                                          r"which is given too"):
        load_settings(write(tmp_path, "server:\n  queue_bound: 5\n  max_streams: 6\n"))


@pytest.mark.parametrize(("overrides", "message"), [
    ({"audio.input_file": "a.wav", "audio.input_command": "arecord"},
     r"^audio\.input_file and input_command: set one of them"),
    ({"audio.input_command": "arecord -D 'hw:1"},
     r"^audio\.input_command: cannot split .* \(No closing quotation\)"),
    ({"audio.output_command": "  "}, r"^audio\.output_command: the command is empty"),
    ({"audio.input_pipe": ""}, r"^audio\.input_pipe: empty"),
    ({"audio.output_width": 5},
     r"^audio\.output_width: 5 is not a sample width in bytes \(1 = U8, 2 = S16_LE"),
    ({"audio.input_rate": 1000}, r"^audio\.input_rate: 1000 Hz is outside 8000\.\.192000"),
    ({"audio.input_channels": 0}, r"^audio\.input_channels: 0 is outside 1\.\.8"),
])
def test_audio_commands_and_formats_are_checked_with_a_clear_message(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(None, overrides, env={})
