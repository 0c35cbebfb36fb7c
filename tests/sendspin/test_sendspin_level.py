"""The music's level on its own (no aiosendspin needed): the server's commands, the shared controls
and the cues, and how they combine into the gain."""

from __future__ import annotations

from edge_agent.sendspin.level import LocalControls, MusicLevel


def test_a_server_command_moves_the_music_and_is_saved_to_the_shared_controls_only_when_asked():
    controls = LocalControls(volume=0.5)
    level = MusicLevel(controls, duck_level=0.2)
    assert level.command("volume", 37, None) and level.state() == (37, False)
    assert not level.command("volume", None, None) and not level.command("next", None, None)
    assert controls.volume() == 0.5  # saved later (`player.SAVE_EVERY_S`), not on each command
    level.save(*level.state())
    assert controls.volume() == 0.37
    assert abs(level.gain() - 0.37 ** 1.5) < 1e-9


def test_the_shared_controls_changed_elsewhere_are_followed_and_report_whether_they_moved_the_music():
    controls = LocalControls(volume=1.0)
    level = MusicLevel(controls, duck_level=0.2)
    assert not level.follow_controls()
    controls.set_media_muted(True)
    assert level.follow_controls() and level.gain() == 0.0
    assert level.status() == {"volume": 100, "muted": True, "ducked": False, "paused": False}


def test_ducking_and_pausing_cues_nest_by_reason():
    level = MusicLevel(LocalControls(volume=1.0), duck_level=0.2)
    level.cue("ducked", "announcement:a", on=True)
    level.cue("paused", "turn:t", on=True)
    assert level.gain() == 0.0
    level.cue("paused", "turn:t", on=False)
    assert abs(level.gain() - 0.2) < 1e-9
    level.cue("ducked", "announcement:a", on=False)
    assert level.gain() == 1.0 and level.status()["ducked"] is False
