"""What a server streams, taken onto the playout (no aiosendspin needed): a format refused once and
its chunks dropped, a change of format a new stream, a stream's end and a disconnect reported."""

from __future__ import annotations

import numpy as np

from edge_agent.audio.sinks import WavSink
from edge_agent.sendspin.intake import Intake
from edge_agent.sendspin.playout import Playout
from edge_agent.sendspin.settings import SendspinSettings
from edge_agent.sendspin.timeline import StreamFormat


def same(us: int) -> int:
    return us


def intake(tmp_path):
    states: list[tuple[str, str | None]] = []
    playout = Playout(lambda rate, name: WavSink(tmp_path / f"{name}.wav", rate), lambda: 0, lambda: 1.0,
                      block_ms=20, stall_s=5.0, on_state=lambda *_: None)
    return Intake(SendspinSettings(), playout, lambda state, error: states.append((state, error))), states


def chunk(frames: int = 960, channels: int = 2) -> bytes:
    return np.zeros(frames * channels, dtype="<i2").tobytes()


def test_a_format_we_cannot_play_is_refused_once_and_its_chunks_dropped_till_the_next_stream(
        tmp_path, caplog):
    taken, states = intake(tmp_path)
    flac = StreamFormat("flac", 48000, 2, 16)
    assert taken.begin(flac, same, same) is None
    for i in range(100):
        taken.chunk(i * 20_000, b"fLaC" + bytes(400), flac, same, same)
    assert states == [("unsupported format",
                       "stream 1: codec 'flac' is not decoded here (only PCM was offered)")]
    assert taken.playout.stream is None and taken.streams == 1
    assert caplog.text.count("the server sent a stream we cannot play") == 1
    taken.end()
    assert states[-1] == ("connected", None)


def test_chunks_go_onto_the_stream_and_a_change_of_format_starts_a_new_one(tmp_path):
    taken, states = intake(tmp_path)
    pcm = StreamFormat("pcm", 48000, 2, 16)
    first = taken.begin(pcm, same, same)
    assert first is not None and states == [("connected", None)]
    taken.chunk(0, chunk(), pcm, same, same)
    assert first.timeline.stats.chunks == 1
    mono = StreamFormat("pcm", 44100, 1, 16)
    taken.chunk(20_000, chunk(channels=1), mono, same, same)
    second = taken.playout.stream
    assert second is not None and second is not first and second.format == mono and taken.streams == 2
    taken.clear()
    taken.disconnected()
    assert taken.playout.stream is None and states[-1] == ("idle", None)
