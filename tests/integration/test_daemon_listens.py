"""`edge-agent run` with the real listener: VAD + exported Whisper -> transcripts over MQTT."""

import numpy as np

from edge_agent.text.wer import wer
from tests.mqtt_support import DaemonProcess, Watcher
from tests.speech_fixtures import silence, write_wav


def spoken_file(tmp_path, clips) -> tuple:
    """Two commands separated and surrounded by silence, as a microphone would hear them."""
    parts, texts = [silence(1.0)], []
    for clip in clips[:2]:
        parts += [clip.audio(), silence(1.5)]
        texts.append(clip.text)
    return write_wav(tmp_path / "heard.wav", np.concatenate(parts)), texts


def test_daemon_in_always_mode_publishes_a_transcript_per_utterance(tmp_path, broker, whisper_dir,
                                                                   espeak_clips):
    wav, texts = spoken_file(tmp_path, espeak_clips)
    watcher = Watcher(broker.url)
    daemon = DaemonProcess(tmp_path / "d", broker.url, extra_env={})
    daemon.config = tmp_path / "listen.yaml"
    daemon.config.write_text(f"asr:\n  model: {whisper_dir}\naudio:\n  input_file: {wav}\n"
                             "listen:\n  mode: always\n")
    try:
        daemon.start()
        heard = watcher.wait("edge/dev1/transcript", count=2, timeout=120)
        for doc, text in zip(heard, texts, strict=True):
            assert wer([text], [doc["text"]]) <= 0.25, (text, doc["text"])
            assert 0 <= doc["start"] < doc["end"]
        assert heard[0]["end"] <= heard[1]["start"]
        assert any(line.get("msg") == "listening" for line in daemon.log_lines())
    finally:
        daemon.close()
        watcher.close()


def test_daemon_without_an_asr_export_announces_but_does_not_listen(tmp_path, broker):
    daemon = DaemonProcess(tmp_path / "d", broker.url)
    daemon.config = tmp_path / "c.yaml"
    daemon.config.write_text(f"asr:\n  model: {tmp_path / 'no-export'}\n")
    try:
        daemon.start().wait_running()
        lines = [line for line in daemon.log_lines()
                 if line.get("msg", "").startswith("not listening: no ASR model present")]
        assert len(lines) == 1 and lines[0]["level"] == "warning"
        assert "pip install './tools[export]'" in lines[0]["msg"]  # the next step
        assert "edge-export whisper --source whisper-tiny.en" in lines[0]["msg"]
    finally:
        daemon.close()
