import numpy as np
import pytest

from edge_agent.announce.message import Announcement
from edge_agent.announce.playout import DirOpener, chime, speak
from edge_agent.announce.queue import Item
from edge_agent.audio.wav import read_wav
from edge_agent.config import TtsSettings
from edge_agent.models import ModelStore, load_catalog
from edge_agent.tts.local import LocalSynthesizer
from edge_agent.tts.registry import VoiceRegistry
from tests.mqtt_support import ToneSynth, wav_levels


@pytest.fixture(scope="module")
def voice(tmp_path_factory):
    store = ModelStore(tmp_path_factory.mktemp("cache"), load_catalog())
    return LocalSynthesizer(VoiceRegistry(store, TtsSettings(sentence_silence_s=0.0)), TtsSettings())


def item(ann_id, text, **kw):
    return Item(Announcement(ann_id, text, **kw), 0)


def run(it, synth, opener, stop=lambda: False):
    engines = []
    result = speak(it, synth, opener, should_stop=stop, on_start=engines.append)
    return result, engines


def test_the_real_voice_speaks_into_the_announcement_wav(tmp_path, voice):
    result, engines = run(item("hello-1", "Dinner is ready. Please come down."), voice, DirOpener(tmp_path))
    audio = read_wav(tmp_path / "hello-1.wav")
    assert result.complete and result.engine == "local" and engines == ["local"]
    assert audio.sample_rate == 22050
    assert 1.0 < len(audio.samples) / audio.sample_rate < 6.0
    assert np.sqrt(np.mean(audio.samples ** 2)) > 0.01  # speech, not silence


def test_volume_scales_and_the_chime_comes_first(tmp_path):
    synth = ToneSynth(rate=22050)
    run(item("half", "Hello.", volume=0.5, chime=True), synth, DirOpener(tmp_path))
    half = read_wav(tmp_path / "half.wav").samples
    bell = chime(22050)
    np.testing.assert_allclose(half[: len(bell)], bell * 0.5, atol=2e-4)
    np.testing.assert_allclose(half[len(bell):], 0.05, atol=1e-4)  # level 0.1 at half volume


def test_stop_between_sentences_keeps_the_file_open_and_resume_finishes_it(tmp_path):
    synth = ToneSynth()
    opener = DirOpener(tmp_path)
    first, _ = run(item("a", "One. Two. Three."), synth, opener, stop=lambda: True)
    assert not first.complete and first.resume == 1 and first.sink is not None
    assert not (tmp_path / "a.wav").exists()  # nothing half-written appears
    rest = Item(Announcement("a", "One. Two. Three."), 0, resume=first.resume, sink=first.sink)
    second, _ = run(rest, synth, opener)
    assert second.complete
    assert wav_levels(tmp_path / "a.wav") == [0.1, 0.2, 0.3]


def test_stop_after_the_last_sentence_counts_as_complete(tmp_path):
    result, _ = run(item("a", "Only one."), ToneSynth(), DirOpener(tmp_path), stop=lambda: True)
    assert result.complete
    assert wav_levels(tmp_path / "a.wav") == [0.1]


def test_chunks_at_another_rate_are_resampled_to_the_sink(tmp_path):
    synth = ToneSynth(rate=16000, rates=[16000, 24000], per_sentence_s=0.5)
    result, _ = run(item("mixed", "Local. Remote."), synth, DirOpener(tmp_path))
    audio = read_wav(tmp_path / "mixed.wav")
    assert result.complete and audio.sample_rate == 16000
    assert abs(len(audio.samples) - 16000) < 200  # 2 x 0.5 s at the sink's rate


def test_a_synthesis_error_aborts_the_file(tmp_path):
    class Broken(ToneSynth):
        def stream(self, text, voice=None):
            yield from list(super().stream("One."))[:1]
            raise RuntimeError("voice crashed")

    with pytest.raises(RuntimeError, match="voice crashed"):
        run(item("bad", "One. Two."), Broken(), DirOpener(tmp_path))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("volume", [1.0, 0.5])
def test_audio_sent_nowhere_is_reported_discarded_with_the_reason(volume):
    from edge_agent.announce.playout import DeviceOpener
    from edge_agent.audio.settings import AudioSettings
    from edge_agent.audio.sinks import AudioOutput

    opener = DeviceOpener(AudioOutput(AudioSettings(output="null")))
    result, _ = run(item("nowhere", "One. Two.", volume=volume), ToneSynth(), opener)
    assert result.complete and result.audio_s > 0
    assert result.discarded == "audio.output is null"


def test_audio_written_to_a_file_is_not_discarded(tmp_path):
    result, _ = run(item("kept", "One."), ToneSynth(), DirOpener(tmp_path))
    assert result.complete and result.discarded is None
