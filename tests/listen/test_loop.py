"""The one listening loop (`listen.loop`) in mode `always`: every utterance transcribed, as the
`transcribe` verb and the benchmarks run it; the pump's ways to consume it and its errors."""

import asyncio
import itertools
import threading
import time

import numpy as np
import pytest

from edge_agent.asr.transcriber import Transcriber
from edge_agent.config import AsrSettings, ListenSettings, VadSettings
from edge_agent.errors import AudioError
from edge_agent.listen import Heard, HearingModels, hearing_loop
from edge_agent.listen.microphone import Microphone
from edge_agent.text.wer import wer
from edge_agent.vad import Segmenter, SileroClassifier, WebRtcClassifier
from tests.speech_fixtures import RATE, silence
from tests.waiting import wait_until


class ArraySource:
    """A recording played as a stream; optionally paced, optionally failing part-way."""

    live = False
    sample_rate = RATE

    def __init__(self, samples, block=1600, pace=0.0, fail_after=None):
        self.samples, self.block, self.pace, self.fail_after = samples, block, pace, fail_after
        self.closed = threading.Event()
        self.reading = threading.Event()
        """Set once the first block has been handed out."""

    def blocks(self):
        for i in range(0, len(self.samples), self.block):
            if self.closed.is_set():
                return
            if self.fail_after is not None and i >= self.fail_after * RATE:
                raise AudioError("device vanished")
            if self.pace:
                time.sleep(self.pace)
            self.reading.set()
            yield self.samples[i:i + self.block]

    def close(self):
        self.closed.set()


@pytest.fixture(scope="module")
def commands(espeak_clips):
    clips = espeak_clips[:3]
    audio = np.concatenate([p for c in clips for p in (silence(1.5), c.audio())] + [silence(1.5)])
    return [c.text for c in clips], audio


def make(whisper, source):
    segmenter = Segmenter(WebRtcClassifier(2), VadSettings())
    models = HearingModels(segmenter, Transcriber(whisper, AsrSettings()))
    return hearing_loop("always", ListenSettings(), models, Microphone(source, source))


def transcripts(events):
    assert all(isinstance(e, Heard) for e in events)  # mode `always` has no turns
    return [e.transcript for e in events]


def test_iterating_yields_each_utterance_in_order(whisper, commands):
    texts, audio = commands
    listener = make(whisper, ArraySource(audio))
    got = transcripts(list(listener))
    assert len(got) == 3
    assert wer(texts, [t.text for t in got]) <= 0.25
    assert all(a.end < b.start for a, b in itertools.pairwise(got))
    assert all(t.latency_s >= 0.5 and t.asr_s > 0 for t in got)
    assert listener.stats.transcripts == 3 and listener.source.closed.is_set()


def test_callbacks_deliver_from_a_worker_thread_and_stop_releases_the_source(whisper, commands):
    _, audio = commands
    got, ended = [], threading.Event()
    source = ArraySource(np.concatenate([audio, silence(60)]), pace=0.002)
    listener = make(whisper, source).start(got.append, on_end=ended.set)
    wait_until(lambda: len(got) >= 3, 60, "three transcripts")
    assert len(got) == 3 and listener.running
    started = time.monotonic()
    listener.stop()
    assert time.monotonic() - started < 5
    assert ended.is_set() and source.closed.is_set() and not listener.running


def test_async_stream_yields_transcripts_and_stops_when_left(whisper, commands):
    texts, audio = commands

    async def first_two():
        out = []
        listener = make(whisper, ArraySource(np.concatenate([audio, silence(30)]), pace=0.001))
        async for event in listener.stream():
            out.append(event.transcript.text)
            if len(out) == 2:
                break
        return out, listener

    out, listener = asyncio.run(asyncio.wait_for(first_two(), timeout=60))
    assert wer(texts[:2], out) <= 0.25
    assert not listener.running and listener.source.closed.is_set()


def test_a_failing_source_surfaces_its_error_in_every_mode(whisper, commands):
    _, audio = commands
    with pytest.raises(AudioError, match="device vanished"):
        list(make(whisper, ArraySource(audio, fail_after=2.0)))

    errors, ended = [], threading.Event()
    make(whisper, ArraySource(audio, fail_after=2.0)).start(lambda t: None, errors.append, ended.set)
    assert ended.wait(30) and isinstance(errors[0], AudioError)

    async def consume():
        return [t async for t in make(whisper, ArraySource(audio, fail_after=2.0)).stream()]

    with pytest.raises(AudioError, match="device vanished"):
        asyncio.run(asyncio.wait_for(consume(), timeout=30))


def test_loud_noise_that_webrtc_passes_is_dropped_as_no_speech(whisper):
    noise = np.random.default_rng(7).normal(0, 0.1, 6 * RATE).astype(np.float32)
    listener = make(whisper, ArraySource(np.concatenate([silence(1), noise, silence(1)])))
    assert list(listener) == []
    assert listener.stats.utterances >= 1 and listener.transcriber.dropped >= 1


def test_build_hearing_wires_the_configured_vad_and_model(whisper_dir, commands, shared_cache, silero_model):
    from edge_agent.config import load_settings
    from edge_agent.models import ModelStore, load_catalog
    from edge_agent.parts import build_hearing

    settings = load_settings(None, {"asr.model": str(whisper_dir), "vad.engine": "silero",
                                    "listen.mode": "always"})
    texts, audio = commands
    listener = build_hearing(settings, ModelStore(shared_cache, load_catalog()), ArraySource(audio),
                             front_end=False)
    assert isinstance(listener.hearing.transcribing.segmenter.classifier, SileroClassifier)
    assert wer(texts, [t.text for t in transcripts(list(listener))]) <= 0.25


def test_stop_during_a_read_is_not_reported_as_an_error(whisper, commands):
    _, audio = commands
    errors, ended = [], threading.Event()
    source = ArraySource(np.concatenate([audio, silence(60)]), pace=0.005)
    listener = make(whisper, source)
    listener.start(lambda t: None, errors.append, ended.set)
    assert source.reading.wait(10)
    listener.stop()
    assert ended.wait(10) and errors == []
