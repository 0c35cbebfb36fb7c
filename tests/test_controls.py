"""The user's microphone mute, volume and wake words survive a restart; an unreadable file keeps the
microphone muted."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from edge_agent.controls import MAX_BYTES, ControlChange, Controls, ControlState, ControlStore


def test_a_saved_state_is_loaded_again(tmp_path: Path) -> None:
    store = ControlStore(tmp_path / "daemon")
    store.save(ControlState(mic_muted=True, volume=0.25))
    assert ControlStore(tmp_path / "daemon").load() == ControlState(mic_muted=True, volume=0.25)
    store.save(ControlState(mic_muted=False))
    assert store.load() == ControlState(mic_muted=False, volume=None)
    assert [p.name for p in (tmp_path / "daemon").iterdir()] == ["controls.json"]  # no temp left


def test_no_file_means_nobody_changed_anything(tmp_path: Path) -> None:
    assert ControlStore(tmp_path / "never-written").load() == ControlState(mic_muted=False, volume=None)


@pytest.mark.parametrize(("content", "reason"), [
    (b"", "not JSON"),
    (b'{"mic_muted": tr', "not JSON"),  # torn by hand (our writes are atomic)
    (b"\xff\xfe{}", "not JSON"),
    (b"[true]", "'mic_muted'"),
    (b'{"volume": 0.5}', "'mic_muted'"),
    (b'{"mic_muted": "no"}', "'mic_muted'"),
    (b'{"mic_muted": 0}', "'mic_muted'"),
    (b"[" * 100000, "larger than"),
    (b'{"mic_muted": false, "pad": "' + b"x" * MAX_BYTES + b'"}', "larger than"),
])
def test_an_unreadable_file_keeps_the_microphone_muted_and_says_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, reason: str) -> None:
    store = ControlStore(tmp_path)
    store.path.write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="edge_agent.controls"):
        assert store.load() == ControlState(mic_muted=True, volume=None)
    assert reason in caplog.text and "stays muted" in caplog.text and str(store.path) in caplog.text


def test_a_symlink_a_fifo_or_a_directory_is_not_followed_or_waited_on(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text('{"mic_muted": false}')
    for make in (lambda p: p.symlink_to(target), os.mkfifo, lambda p: p.mkdir()):
        directory = tmp_path / f"case-{len(list(tmp_path.iterdir()))}"
        directory.mkdir()
        store = ControlStore(directory)
        make(store.path)
        assert store.load() == ControlState(mic_muted=True)  # returns at once (a FIFO has no writer)


def test_a_bad_volume_only_loses_the_volume(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = ControlStore(tmp_path)
    for volume in ("1.5", "-0.1", '"loud"', "true", "1e999"):
        store.path.write_text(f'{{"mic_muted": false, "volume": {volume}}}')
        with caplog.at_level(logging.WARNING, logger="edge_agent.controls"):
            assert store.load() == ControlState(mic_muted=False, volume=None), volume
    assert "is not a number 0..1" in caplog.text


def test_wake_words_round_trip_and_a_bad_list_only_loses_the_wake_words(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = ControlStore(tmp_path)
    store.save(ControlState(mic_muted=False, volume=0.5, wake_words=("hey_jarvis", "alexa")))
    assert store.load() == ControlState(mic_muted=False, volume=0.5, wake_words=("hey_jarvis", "alexa"))
    too_long, too_many = '["' + "x" * 300 + '"]', "[" + '"a",' * 16 + '"a"]'
    for wake in ("[]", '"hey_jarvis"', "[1]", '[""]', too_long, too_many):
        store.path.write_text(f'{{"mic_muted": true, "volume": 0.5, "wake_words": {wake}}}')
        with caplog.at_level(logging.WARNING, logger="edge_agent.controls"):
            assert store.load() == ControlState(mic_muted=True, volume=0.5, wake_words=None), wake
    assert "is not a list of model names" in caplog.text


def test_a_state_that_cannot_be_written_raises(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        ControlStore(tmp_path / "file").save(ControlState(mic_muted=True))


def test_the_music_mute_is_kept_and_a_bad_one_only_unmutes_the_music(tmp_path: Path, caplog) -> None:
    store = ControlStore(tmp_path)
    store.save(ControlState(mic_muted=False, media_muted=True))
    assert store.load().media_muted is True
    (tmp_path / "controls.json").write_text('{"mic_muted": true, "media_muted": "yes"}')
    assert store.load() == ControlState(mic_muted=True, media_muted=False)
    assert "media_muted 'yes' is not true/false" in caplog.text
    (tmp_path / "controls.json").write_text('{"mic_muted": false}')  # written before it existed
    assert store.load().media_muted is False


def test_controls_save_each_change_tell_the_owner_and_come_back_after_a_restart(tmp_path: Path) -> None:
    told: list[ControlChange] = []
    closed: list[bool] = []
    controls = Controls(tmp_path, config_volume=0.8, wake_offered=("okay_nabu", "hey_jarvis"),
                        on_change=told.append, close_mic=lambda: closed.append(True))
    assert (controls.volume(), controls.mic_muted(), controls.wake_words()) == (0.8, False, None)
    controls.set_volume(0.3)
    controls.set_mic_muted(True)
    controls.set_mic_muted(True)  # unchanged: saved again, nobody told
    controls.set_media_muted(True)
    controls.set_wake_words(["hey_jarvis"])
    assert told == ["volume", "mic", "media", "wake"]
    assert closed == [True, True]  # the microphone closes on every mute, before the save
    again = Controls(tmp_path, config_volume=0.8, wake_offered=("okay_nabu", "hey_jarvis"))
    assert (again.volume(), again.mic_muted(), again.media_muted(), again.wake_words()) == (
        0.3, True, True, ("hey_jarvis",))
    assert ControlStore(tmp_path).load() == again.state


def test_a_new_config_volume_replaces_the_users_and_wake_words_no_longer_offered_are_dropped(
        tmp_path: Path) -> None:
    ControlStore(tmp_path).save(ControlState(volume=0.3, wake_words=("gone", "okay_nabu")))
    controls = Controls(tmp_path, config_volume=0.8, wake_offered=("okay_nabu",))
    assert controls.wake_words() == ("okay_nabu",)
    assert not controls.reconfigured(0.8) and controls.volume() == 0.3  # the same config volume
    assert controls.reconfigured(0.6) and controls.volume() == 0.6  # the latest word wins
    assert ControlStore(tmp_path).load().volume is None


def test_a_change_that_cannot_be_saved_still_holds_and_says_so(tmp_path: Path, caplog) -> None:
    (tmp_path / "state").write_text("a file where the state directory should be")
    controls = Controls(tmp_path / "state", config_volume=1.0)  # unreadable: the microphone stays muted
    assert controls.mic_muted()
    with caplog.at_level(logging.ERROR, logger="edge_agent.controls"):
        controls.set_volume(0.4)
    assert controls.volume() == 0.4 and "they hold until the daemon restarts" in caplog.text
