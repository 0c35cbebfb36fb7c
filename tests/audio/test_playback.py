import time

import numpy as np
import pytest

from edge_agent.audio.frames import AudioChunk
from edge_agent.audio.playback import play
from edge_agent.audio.sinks import NullSink


def chunks(sentences: int, per_sentence: int = 2, produced: list | None = None):
    for s in range(sentences):
        for i in range(per_sentence):
            if produced is not None:
                produced.append((s, i))
            yield AudioChunk(np.ones(100, dtype=np.float32), 16000, s, last=i == per_sentence - 1)


def test_plays_every_chunk_and_counts_sentences():
    sink = NullSink(16000)
    stats = play(chunks(3), sink)
    assert (stats.frames, stats.sentences, sink.frames) == (600, 3, 600)
    assert stats.first_audio_s is not None and stats.first_audio_s <= stats.total_s


def test_stop_request_takes_effect_at_a_sentence_boundary():
    sink = NullSink(16000)
    stats = play(chunks(5), sink, should_stop=lambda: True)
    assert stats.interrupted and stats.sentences == 1 and sink.frames == 200


def test_synthesis_errors_reach_the_caller():
    def failing():
        yield AudioChunk(np.ones(10, dtype=np.float32), 16000, 0, last=True)
        raise RuntimeError("model exploded")

    with pytest.raises(RuntimeError, match="model exploded"):
        play(failing(), NullSink(16000))


class SlowSink(NullSink):
    def __init__(self, produced: list) -> None:
        super().__init__(16000)
        self.produced = produced
        self.written = 0
        self.max_ahead = 0

    def write(self, samples):
        time.sleep(0.01)
        self.max_ahead = max(self.max_ahead, len(self.produced) - self.written)
        self.written += 1
        super().write(samples)


def test_synthesis_runs_ahead_of_a_slow_sink_but_boundedly():
    produced: list = []
    sink = SlowSink(produced)
    play(chunks(40, produced=produced), sink, depth=4)
    assert len(produced) == 80 and sink.frames == 8000
    assert 2 <= sink.max_ahead <= 4 + 2, "runs ahead, but no further than the queue depth"
