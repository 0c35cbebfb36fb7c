import pytest

from tests.speech_fixtures import run_cli

pytestmark = pytest.mark.slow


def test_doctor_reports_the_whisper_export(whisper_dir, tmp_path):
    ok = run_cli("doctor", "--set", 'mqtt.broker=""', "--set", f"asr.model={whisper_dir}")
    (line,) = [x for x in ok.stdout.splitlines() if " asr " in x]
    assert line.startswith("ok") and "files verified" in line
    assert "encoder on cpu, decoder on cpu" in line  # one real run on each
    missing = run_cli("doctor", "--set", 'mqtt.broker=""', "--set", f"asr.model={tmp_path}")
    (line,) = [x for x in missing.stdout.splitlines() if " asr " in x]
    assert line.startswith("warn") and "edge-export whisper" in line
