"""Which voices Wyoming's `info` lists: read from the `Synthesizer` interface alone (`offers`)."""

from __future__ import annotations

from edge_agent.config import TtsSettings
from edge_agent.tts.voice import VoiceOffer
from edge_agent.wyoming.tts import offered_voices
from tests.mqtt_support import ToneSynth

LOCAL = "en_US-joe-medium"
REMOTE = "kokoro-82m"


class Offering(ToneSynth):
    """A synthesizer offering what it is told to: any `Synthesizer`, not only the offload router."""

    def __init__(self, *offers: VoiceOffer) -> None:
        super().__init__()
        self._offers = list(offers)

    def offers(self) -> list[VoiceOffer]:
        return self._offers


def _listed(synth: Offering, remote_voice: str = REMOTE) -> list[str]:
    return [v.id for v in offered_voices(synth, TtsSettings().voice, remote_voice)]


def test_the_configured_server_voice_is_listed_while_it_is_reachable():
    reachable = Offering(VoiceOffer(LOCAL, "local", True), VoiceOffer(REMOTE, "remote", True))
    assert _listed(reachable) == [LOCAL, REMOTE]
    listed = offered_voices(reachable, TtsSettings().voice, REMOTE)
    assert "synthesis server" in listed[1].description


def test_an_unreachable_server_voice_is_left_out_and_the_local_voice_stays():
    down = Offering(VoiceOffer(LOCAL, "local", True), VoiceOffer(REMOTE, "remote", False))
    assert _listed(down) == [LOCAL]


def test_only_the_configured_server_voice_is_listed_and_never_twice():
    other = Offering(VoiceOffer(LOCAL, "local", True), VoiceOffer("another", "remote", True))
    assert _listed(other) == [LOCAL]
    assert _listed(other, remote_voice="") == [LOCAL]
    same = Offering(VoiceOffer(LOCAL, "local", True), VoiceOffer(LOCAL, "remote", True))
    assert _listed(same, remote_voice=LOCAL) == [LOCAL]


def test_a_local_voice_with_the_server_voices_id_does_not_count_as_the_server():
    local_only = Offering(VoiceOffer(LOCAL, "local", True), VoiceOffer(REMOTE, "local", True))
    assert _listed(local_only) == [LOCAL]
