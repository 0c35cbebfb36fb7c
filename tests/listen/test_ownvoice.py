"""Our own voice saying the wake phrase never opens a turn; a user saying it over our playback does.

Real signals throughout: our Piper voice played through a simulated room into a live microphone,
the playback reference on the same clock, the real okay_nabu model on both (`bench hear`'s path).
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.clips import load_16k, piper_clip
from benchmarks.hear import play_and_hear
from edge_agent.config import WakeSettings
from edge_agent.listen.ownvoice import OwnVoice
from edge_agent.wake import Detection
from tests.speech_fixtures import room_impulse, silence

RATE = 16000
OWN = ("OK Nabu, the washing machine has finished.", "Ok, Nabu: the front door is still open.",
       "Okey Nabu, it is going to rain.")
"""Announcements whose words are not the wake phrase's spelling but whose sound is (through the room
below they fire okay_nabu at 0.93, 0.98 and 0.89 against its cutoff 0.85)."""
OTHER = ("The washing machine has finished its program, and the dryer is next. "
         "Please move the clothes before they start to smell.")
SECOND = "Your parcel has been delivered to the front porch. The courier left it beside the door."
USER = "Okay Nabu, turn on the kitchen lights."


@pytest.fixture(scope="module")
def say(clip_cache, piper_voice):
    return lambda text: load_16k(piper_clip(text, clip_cache, piper_voice))


def hear(played: np.ndarray, user: np.ndarray | None, *,
         echo_cancel: bool) -> tuple[list[Detection], list[Detection]]:
    """Our voice at full level, 100 ms of card and air away through a room; the user next to the
    microphone."""
    return play_and_hear(played, room_impulse(delay_s=0.1, gain=0.8), user, echo_cancel=echo_cancel)


@pytest.mark.parametrize("text", OWN)
def test_our_announcement_saying_the_wake_phrase_is_recognised_as_our_own_by_its_audio(say, text):
    """Without the canceller the microphone fires on our voice; the guard drops it."""
    heard, accepted = hear(say(text), None, echo_cancel=False)
    assert [d.model for d in heard] == ["okay_nabu"]  # the model alone cannot tell us from a user
    assert accepted == []


@pytest.mark.parametrize("text", OWN)
def test_with_echo_cancelling_our_announcement_opens_no_turn(say, text):
    _, accepted = hear(say(text), None, echo_cancel=True)
    assert accepted == []


@pytest.fixture(scope="module")
def two_announcements(say) -> tuple[np.ndarray, float]:
    """Two announcements 1 s apart (the canceller learns the room during the first), and when the
    second starts (seconds into the first)."""
    first, second = say(OTHER), say(SECOND)
    return np.concatenate([first, silence(1.0), second]), first.size / RATE + 1.0


def test_a_user_saying_the_wake_word_over_our_playback_wakes(say, two_announcements):
    """The user half a second into our second announcement, about 8 dB below it at the microphone."""
    played, second_at = two_announcements
    user = 0.5 * np.concatenate([silence(second_at + 0.5), say(USER)])
    _, accepted = hear(played, user, echo_cancel=True)
    assert [d.model for d in accepted] == ["okay_nabu"]


def test_without_the_canceller_the_same_user_is_not_heard_over_our_playback(say, two_announcements):
    """What the canceller is for: the status quo needed a user ~15 dB above our voice."""
    played, second_at = two_announcements
    user = 0.5 * np.concatenate([silence(second_at + 0.5), say(USER)])
    heard, _ = hear(played, user, echo_cancel=False)
    assert heard == []


def test_the_guard_skips_silent_reference_without_running_the_detector():
    guard = OwnVoice(WakeSettings())
    guard.hear(np.zeros(RATE, dtype=np.float32))
    assert guard.fed_s == 0.0
    assert not guard.is_own(Detection("okay_nabu", "Okay Nabu", 0.9, 0.95))


def test_the_hearing_loop_with_a_playback_reference_hears_through_the_front_end_and_the_guard(
        whisper_dir, tmp_path):
    """What the daemon builds for a live microphone: the front end around the source, the guard
    ahead of the daemon's own wake filter (which is still asked for what the guard lets through)."""
    from benchmarks.livemic import Clock, LiveMic
    from edge_agent.audio.frontend import FrontEndSource
    from edge_agent.audio.reference import PlaybackReference
    from edge_agent.config import load_settings
    from edge_agent.models import ModelStore, load_catalog
    from edge_agent.parts import build_hearing

    settings = load_settings(None, {"asr": {"model": str(whisper_dir)}})
    store = ModelStore(settings.models.cache_dir, load_catalog())
    clock = Clock()
    asked: list[Detection] = []
    loop = build_hearing(settings, store, LiveMic(np.zeros(1600, dtype=np.float32), clock),
                         lambda d: asked.append(d) or True, PlaybackReference(clock=clock))
    assert isinstance(loop.source, FrontEndSource) and loop.source.front_end.echo is not None
    user = Detection("okay_nabu", "Okay Nabu", 1.0, 0.95)
    assert loop.hearing.accept_wake is not None and loop.hearing.accept_wake(user) and asked == [user]
