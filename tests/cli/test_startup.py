import subprocess
import sys

import pytest

from edge_agent.cli import COMMANDS, main

HEAVY = ("paho", "onnxruntime", "onnx", "torch", "sounddevice", "wyoming", "exporters", "benchmarks")


def test_say_starts_without_the_modules_other_verbs_need():
    code = ("import sys; from edge_agent.cli import build_parser; build_parser('say'); "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_an_unknown_verb_is_a_usage_error_that_lists_every_verb(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sya", "Hi."])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'sya'" in err
    assert all(f"'{verb}'" in err for verb in COMMANDS)


def test_reading_the_settings_loads_no_hearing_stack():
    """`config` assembles `listen.settings` and `vad.settings`: their packages load nothing more
    until asked (`edge_agent.lazy`), so `say` does not pay for Whisper and the VAD."""
    hearing = ("edge_agent.listen.hearing", "edge_agent.asr.whisper", "edge_agent.vad.classifiers")
    code = ("import sys; from edge_agent.cli import build_parser; build_parser('say'); "
            "import edge_agent.config; "
            f"print(sorted(m for m in {hearing!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
