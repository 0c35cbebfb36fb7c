"""A device with no sound card (PortAudio present, no output device, as on this machine) tells its
MQTT consumers that an announcement was not heard: `done` with `played: false` and why, never a
plain `done` (real daemon, real mosquitto)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_support import HearingDaemon
from tests.mqtt_support import Producer, Watcher


def has_sound_card() -> bool:
    # Through our importer: PortAudio's import blocks SIGPIPE in this thread, and every child the
    # suite starts afterwards would inherit the mask.
    from edge_agent.audio.sinks import import_sounddevice

    try:
        import_sounddevice().query_devices(kind="output")
    except Exception:  # no PortAudio (OSError) or no default output (PortAudioError)
        return False
    return True


def announce_and_wait(tmp_path: Path, broker: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """The daemon with `overrides` speaks one announcement; its final status."""
    watcher = Watcher(broker.url)
    running = HearingDaemon(tmp_path, broker, None, overrides)
    producer = Producer(broker.url)
    try:
        producer.publish("edge/dev1/announce", {"id": "door-42", "text": "Someone is at the door."})
        final = watcher.wait("edge/dev1/announce/status",
                             lambda d: d["id"] == "door-42" and d["state"] not in ("queued", "speaking"))
    finally:
        producer.close()
        running.stop()
        watcher.close()
    return dict(final[0])


@pytest.mark.skipif(has_sound_card(), reason="this machine has a sound card to play on")
def test_an_announcement_with_no_sound_card_is_done_but_not_played(tmp_path: Path, broker: Any) -> None:
    status = announce_and_wait(tmp_path, broker, {"audio.output": "sounddevice", "audio.fallback": "null"})
    assert status["state"] == "done"  # final, not retried: consumers waiting for `done` still stop
    assert status["played"] is False
    assert status["error"].startswith("not played: no sound output")
    assert "audio.output_command" in status["error"]  # the next step
    assert "Error querying device" not in status["error"]


def test_an_announcement_sent_to_no_output_by_configuration_says_so(tmp_path: Path, broker: Any) -> None:
    status = announce_and_wait(tmp_path, broker, {"audio.output": "null"})
    assert status["state"] == "done" and status["played"] is False
    assert status["error"] == "not played: audio.output is null"


def test_an_announcement_that_reached_an_output_is_played(tmp_path: Path, broker: Any) -> None:
    played = tmp_path / "played.raw"
    command = shlex.join(["sh", "-c", f"cat > {shlex.quote(str(played))}"])  # aplay, for the test
    status = announce_and_wait(tmp_path, broker, {"audio.output_command": command})
    assert status["state"] == "done" and status["played"] is True and "error" not in status
    assert played.stat().st_size > 0
