"""The Piper graph split at the latent: same audio as the original, streamed in windows."""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent.config import TtsSettings
from edge_agent.models import ModelStore, load_catalog
from edge_agent.runtime.sessions import cpu_fingerprint, load_weights, make_session
from edge_agent.tts import piper, vits, windowed
from edge_agent.tts.piper import PiperVoice
from edge_agent.tts.voice import synthesize
from tests.waiting import wait_until

VOICE = "en_US-joe-medium"
LONG = ("The washing machine in the basement has finished its cycle and the clothes should be "
        "moved to the dryer right away so that they do not start to smell before tomorrow morning.")




@pytest.fixture(scope="module")
def streaming(model: Path, prepared: vits.Prepared) -> PiperVoice:
    # No noise in the flow or the durations, so two runs can be compared sample by sample.
    voice = PiperVoice.load(VOICE, model, threads=2, noise_scale=0.0, noise_w=0.0,
                            prepared_dir=prepared.directory.parent)
    assert voice.streaming
    yield voice
    voice.close()


@pytest.fixture(scope="module")
def whole(model: Path) -> PiperVoice:
    voice = PiperVoice.load(VOICE, model, threads=2, noise_scale=0.0, noise_w=0.0)
    assert not voice.streaming
    yield voice
    voice.close()


def test_the_split_finds_the_latent_and_an_exact_context(prepared: vits.Prepared) -> None:
    info = prepared.info
    assert (info.channels, info.hop) == (192, 256)
    assert 8 <= info.context <= 20  # computed from the kernels, dilations and strides
    vocoder = onnx.load(str(prepared.vocoder))
    convs = [n for n in vocoder.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    assert {n.op_type for n in convs} == {"Conv", "ConvTranspose"}
    kernels = [a.ints for n in convs for a in n.attribute if a.name == "kernel_shape"]
    assert len(kernels) == len(convs) and all(len(k) == 2 and k[0] == 1 for k in kernels)  # 2-D


def test_split_voice_speaks_as_the_original_graph(streaming: PiperVoice, whole: PiperVoice) -> None:
    ids = whole.phoneme_ids(LONG)[0]
    ours = streaming.synthesize_ids(ids)
    theirs = whole.synthesize_ids(ids)
    assert ours.shape == theirs.shape and ours.size > 5 * 22050
    assert np.abs(ours - theirs).max() < 1e-4


def test_windows_decode_to_the_same_samples_as_the_whole_latent(
        streaming: PiperVoice, prepared: vits.Prepared) -> None:
    ids = streaming.phoneme_ids(LONG)[0]
    z = streaming._session.run(None, streaming._inputs(ids))[0]
    vocoder = windowed.Vocoder(make_session(prepared.vocoder, 1), prepared.info)
    full = vocoder.decode(z)
    frames = z.shape[-1]
    plans = [windowed.plan_windows(frames, first=True, workers=4), windowed.plan_windows(frames, first=False),
             [(n, n + 1) for n in range(frames)]]  # one frame at a time: every cut at its tightest
    for windows in plans:
        assert len(windows) >= 4
        pieces = np.concatenate([vocoder.decode(z, a, b) for a, b in windows])
        assert pieces.shape == full.shape
        assert np.abs(pieces - full).max() < 1e-5

    def cut(info: windowed.VocoderInfo) -> float:
        decoder = windowed.Vocoder(vocoder.session, info)
        plan = windowed.plan_windows(frames, first=True)
        pieces = np.concatenate([decoder.decode(z, a, b) for a, b in plan])
        return float(np.abs(pieces - full).max())

    # Too little context, or cuts that keep too little of it, are audibly wrong:
    # the computed figures are what make it exact.
    assert cut(dataclasses.replace(prepared.info, context=2)) > 1e-3
    for n in range(len(prepared.info.cuts)):
        cuts = list(prepared.info.cuts)
        cuts[n] = (cuts[n][0], 0)
        assert cut(dataclasses.replace(prepared.info, cuts=tuple(cuts))) > 1e-4, f"cut {n} keeps nothing"


def test_cuts_drop_context_where_the_layers_after_them_no_longer_reach(prepared: vits.Prepared) -> None:
    cuts = prepared.info.cuts
    assert [rate for rate, _ in cuts] == sorted(rate for rate, _ in cuts) and cuts[-1][0] == prepared.info.hop
    kept_frames = [keep / rate for rate, keep in cuts]
    assert kept_frames == sorted(kept_frames, reverse=True)
    assert kept_frames[0] < prepared.info.context
    assert kept_frames[-1] < 0.1  # the last layers, the costly ones, need almost none


@given(st.integers(1, 3000), st.booleans(), st.integers(1, 4))
def test_windows_cover_the_latent_once_in_order(frames: int, first: bool, workers: int) -> None:
    assert windowed.plan_windows(0, first=first, workers=workers) == []
    windows = windowed.plan_windows(frames, first=first, workers=workers)
    assert windows[0][0] == 0 and windows[-1][1] == frames
    assert all(a < b for a, b in windows)
    assert all(b == c for (_, b), (c, _) in itertools.pairwise(windows))
    head = 1 if first and frames >= windowed.FIRST_FRAMES * 3 // 2 else 0
    if head:
        assert windows[0] == (0, windowed.FIRST_FRAMES)
    rest = windows[head:]
    assert all(b - a <= windowed.WINDOW_FRAMES for a, b in rest)
    if len(rest) > 1:
        assert all(b - a >= windowed.MIN_FRAMES for a, b in rest)
        assert len(rest) % workers == 0 or len(rest) == (frames - windows[head][0]) // windowed.MIN_FRAMES


def test_stream_starts_with_a_small_window_and_ends_each_sentence_once(streaming: PiperVoice) -> None:
    sentences = streaming.sentences(f"{LONG} Thank you. Bye.")
    pieces = list(streaming.stream(sentences))
    assert pieces[0][1].size == windowed.FIRST_FRAMES * 256
    assert [i for i, _, _ in pieces] == sorted(i for i, _, _ in pieces)
    assert [i for i, _, last in pieces if last] == [0, 1, 2]
    audio = np.concatenate([s for i, s, _ in pieces if i == 0])
    assert np.abs(audio - streaming.synthesize_ids(streaming.phoneme_ids(sentences[0])[0])).max() < 1e-4


def test_a_sentence_without_phonemes_still_ends(streaming: PiperVoice) -> None:
    chunks = list(synthesize(streaming, "Hello. ... Goodbye."))
    lasts = [c.sentence for c in chunks if c.last]
    assert lasts == sorted(set(lasts)) and len(lasts) == len(streaming.sentences("Hello. ... Goodbye."))


def test_closing_the_stream_early_cancels_queued_windows(streaming: PiperVoice) -> None:
    stream = streaming.stream(streaming.sentences(LONG * 3))
    next(stream)
    stream.close()
    # The pool is free again: a new stream runs to the end.
    assert sum(s.size for _, s, _ in streaming.stream(["Ready."])) > 0


def test_streams_from_several_threads_do_not_mix(streaming: PiperVoice) -> None:
    expected = {text: np.concatenate([s for _, s, _ in streaming.stream([text])])
                for text in ("One two three.", "Four five six seven eight.")}
    results: dict[str, list[np.ndarray]] = {t: [] for t in expected}

    def speak(text: str) -> None:
        for _ in range(3):
            results[text].append(np.concatenate([s for _, s, _ in streaming.stream([text])]))

    threads = [threading.Thread(target=speak, args=(t,)) for t in expected]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for text, runs in results.items():
        assert len(runs) == 3
        assert all(np.abs(r - expected[text]).max() < 1e-4 for r in runs)


def test_a_graph_that_is_not_piper_runs_whole(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="/enc/Identity")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(windowed.UnsupportedGraph, match="no nodes"):
        vits.prepare(path, tmp_path / "prep")
    assert not (tmp_path / "prep").exists()


@pytest.mark.parametrize("damaged", ["vocoder.onnx", vits.FRONT_WEIGHTS, "front.onnx"])
def test_a_damaged_split_is_prepared_again(model: Path, tmp_path: Path, damaged: str) -> None:
    directory = tmp_path / "joe"
    path = vits.prepare(model, directory).directory / damaged
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:1000])  # truncated on disk
    voice = PiperVoice.load(VOICE, model, threads=2, prepared_dir=directory)
    try:
        assert voice.streaming and voice.synthesize_ids(voice.phoneme_ids("Hello.")[0]).size > 0
        assert path.stat().st_size == size
    finally:
        voice.close()


def test_stale_metadata_is_prepared_again(model: Path, tmp_path: Path) -> None:
    directory = tmp_path / "joe"
    meta = vits.prepare(model, directory).directory / "prepared.json"
    meta.write_text('{"format": 0}')
    assert vits.prepare(model, directory).info.hop == 256
    assert f'"format": {vits.FORMAT}' in meta.read_text()


def test_the_registry_prepares_once_per_model_hash_and_can_be_told_not_to(shared_cache: Path) -> None:
    from edge_agent.tts.registry import PREPARED_SUBDIR, VoiceRegistry

    store = ModelStore(shared_cache, load_catalog())
    registry = VoiceRegistry(store, TtsSettings(threads=1))
    try:
        voice = registry.get(VOICE)
        assert isinstance(voice, PiperVoice) and voice.streaming
        sha = store.catalog.get(VOICE).files[0].sha256
        split = shared_cache / PREPARED_SUBDIR / f"{VOICE}-{sha[:16]}" / f"v{vits.FORMAT}"
        assert (split / "prepared.json").is_file()
    finally:
        registry.close()
    plain = VoiceRegistry(store, TtsSettings(threads=1, stream_vocoder=False))
    try:
        voice = plain.get(VOICE)
        assert isinstance(voice, PiperVoice) and not voice.streaming
    finally:
        plain.close()


def test_a_slow_next_front_does_not_hold_back_audio_that_is_ready(streaming: PiperVoice) -> None:
    real = streaming._session
    release = threading.Event()
    long_ids = len(streaming.phoneme_ids(LONG)[0])

    class GatedFront:
        def run(self, names, feed):
            if feed["input"].shape[1] == long_ids:  # the second sentence's front stalls
                assert release.wait(30)
            return real.run(names, feed)

    streaming._session = GatedFront()  # whichever front session runs the second sentence
    real_pooled = streaming._front
    streaming._front = GatedFront()
    try:
        stream = streaming.stream(["Dinner is ready.", LONG])
        first_sentence = []
        for index, samples, last in stream:
            assert index == 0, "sentence 1 cannot be ready: its front is stalled"
            first_sentence.append(samples)
            if last:
                break
        assert len(first_sentence) >= 2 and not release.is_set()
        release.set()
        rest = list(stream)
        assert rest and {i for i, _, _ in rest} == {1} and rest[-1][2]
    finally:
        release.set()
        streaming._session, streaming._front = real, real_pooled


def test_nothing_else_of_a_stream_runs_until_its_first_window_is_decoded(
        streaming: PiperVoice, monkeypatch: pytest.MonkeyPatch) -> None:
    """On shared cores a job of ours beside the first window only delays the first audio; on idle
    ones the window itself is cut into one piece per worker, decoded side by side."""
    monkeypatch.setattr(piper, "idle_cores", lambda: 2)
    sentences = ["Dinner is ready.", "The front door is open.", "Please close it before you leave."]
    assert streaming._vocoder is not None and streaming._pool is not None
    vocoder, pool = streaming._vocoder, streaming._pool
    ids = streaming.phoneme_ids(sentences[0])[0]
    frames = streaming._session.run(None, streaming._inputs(ids))[0].shape[-1]
    rest = len(windowed.plan_windows(frames, first=True, workers=streaming._workers)) - 1
    pieces_of_first = windowed.split_window(0, windowed.FIRST_FRAMES, streaming._workers)
    assert rest >= 1 and len(pieces_of_first) == streaming._workers == 2
    real_decode, real_pooled = vocoder.decode, streaming._decode_pooled
    started = threading.Event()
    release = threading.Event()
    log: list[str] = []

    def decode(z, start=0, end=None):  # type: ignore[no-untyped-def]
        log.append(f"window {start}")
        if start == 0:
            started.set()
            assert release.wait(30)
        try:
            return real_decode(z, start, end)
        finally:
            log.append(f"window {start} done")

    def pooled(ids, cancelled):  # type: ignore[no-untyped-def]
        log.append("front")
        return real_pooled(ids, cancelled)

    vocoder.decode = decode  # type: ignore[method-assign]
    streaming._decode_pooled = pooled  # type: ignore[method-assign]
    pieces: list[tuple[int, np.ndarray, bool]] = []
    consumer = threading.Thread(target=lambda: pieces.extend(streaming.stream(sentences)))
    second = f"window {pieces_of_first[1][0]}"
    try:
        consumer.start()
        assert started.wait(30)
        # The other piece of the first window runs beside it; the rest of the first sentence
        # and the next two fronts are queued, held until both pieces are done.
        wait_until(lambda: f"{second} done" in log, what="the first window's other piece")
        wait_until(lambda: len(pool._held) == rest + 2, what="the stream's other jobs to be held")
        assert sorted(log) == sorted(["window 0", second, f"{second} done"])
    finally:
        release.set()
        consumer.join(60)
        vocoder.decode = real_decode  # type: ignore[method-assign]
        del streaming._decode_pooled
    assert log.index("window 0 done") == 3
    assert [i for i, _, last in pieces if last] == [0, 1, 2]
    assert pieces[0][1].size == windowed.FIRST_FRAMES * 256


@pytest.mark.parametrize(("idle", "pieces"), [(0, 1), (1, 1), (2, 2), (8, 2), (None, 2)])
def test_the_first_window_is_cut_for_the_cores_idle_now(
        streaming: PiperVoice, monkeypatch: pytest.MonkeyPatch, idle: int | None, pieces: int) -> None:
    monkeypatch.setattr(piper, "idle_cores", lambda: idle)
    decoded: list[tuple[int, int]] = []
    assert streaming._vocoder is not None
    real = streaming._vocoder.decode
    monkeypatch.setattr(streaming._vocoder, "decode",
                        lambda z, start=0, end=None: decoded.append((start, end)) or real(z, start, end))
    stream = streaming.stream(streaming.sentences(LONG))
    first = next(stream)[1]
    stream.close()
    assert first.size == windowed.FIRST_FRAMES * 256
    assert sorted(decoded)[:pieces] == windowed.split_window(0, windowed.FIRST_FRAMES, pieces)
    assert len([d for d in decoded if d[1] <= windowed.FIRST_FRAMES]) == pieces


def test_a_stream_phonemizes_a_sentence_only_when_its_look_ahead_reaches_it(
        streaming: PiperVoice, monkeypatch: pytest.MonkeyPatch) -> None:
    """espeak's ~0.5 ms a sentence is not paid for a whole text before its first audio."""
    sentences = [f"Announcement number {n} is here." for n in range(10)]
    phonemized: list[str] = []
    real = streaming.phoneme_ids
    monkeypatch.setattr(streaming, "phoneme_ids", lambda s: phonemized.append(s) or real(s))
    stream = streaming.stream(sentences)
    first = next(stream)
    assert phonemized == sentences[:1 + piper.LOOKAHEAD]
    pieces = [first, *stream]
    assert phonemized == sentences and [i for i, _, last in pieces if last] == list(range(10))


@given(st.integers(0, 200), st.integers(0, 100), st.integers(1, 8))
def test_a_first_window_is_cut_into_pieces_that_cover_it_in_order(start: int, length: int,
                                                                   parts: int) -> None:
    pieces = windowed.split_window(start, start + length, parts)
    assert pieces[0][0] == start and pieces[-1][1] == start + length
    assert all(b == c for (_, b), (c, _) in itertools.pairwise(pieces))
    assert len(pieces) <= parts
    if len(pieces) > 1:
        assert all(b - a >= windowed.FIRST_PIECE_FRAMES for a, b in pieces)


def test_the_first_front_takes_every_core_without_spinning(streaming: PiperVoice) -> None:
    """Threads spinning between ops doubled the front's CPU time and slowed it on shared cores."""
    options = streaming._session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_an_unwritable_cache_costs_the_split_not_the_voice(model: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "cache"
    blocked.write_text("a file where the cache directory should be")  # fails for root too
    voice = PiperVoice.load(VOICE, model, threads=1, prepared_dir=blocked / "prepared" / "joe")
    try:
        assert not voice.streaming
        assert sum(s.size for _, s, _ in voice.stream(["Hello."])) > 0
    finally:
        voice.close()


def test_the_cpu_optimized_copy_is_made_once_and_one_made_for_another_cpu_is_left_alone(
        prepared: vits.Prepared) -> None:
    directory = prepared.directory
    for old in directory.glob("cpu-*"):
        shutil.rmtree(old)
    (directory / "cpu-ort0.0-other-000000000000").mkdir()
    optimized = vits.prepare_cpu(prepared)
    assert optimized is not None and optimized.directory.name == f"cpu-{cpu_fingerprint()}"
    assert sorted(p.name for p in directory.glob("cpu-*")) == sorted(
        [optimized.directory.name, "cpu-ort0.0-other-000000000000"])  # another version may be using it
    made = optimized.front.stat().st_mtime_ns
    again = vits.prepare_cpu(prepared)
    assert again == optimized and optimized.front.stat().st_mtime_ns == made
    # It loads without optimising again, and its weights are still shared through the index.
    session = make_session(optimized.front, 1, weights=load_weights(optimized.front), optimized=True)
    assert {i.name for i in session.get_inputs()} >= {"input", "input_lengths", "scales"}


def test_a_one_sentence_stream_never_makes_the_pooled_front(model: Path, prepared: vits.Prepared) -> None:
    voice = PiperVoice.load(VOICE, model, threads=2, prepared_dir=prepared.directory.parent)
    try:
        list(voice.stream(["Hello."]))
        assert voice._front is None
        list(voice.stream(["Hello.", "Goodbye."]))
        assert voice._front is not None and voice._front is not voice._session
    finally:
        voice.close()


def test_a_sentence_that_expands_beyond_one_model_call_is_cut_at_word_boundaries(whole: PiperVoice) -> None:
    """Raw digits (a server's text is not normalised) expand 5x: one call would cost memory
    quadratic in its length; now each call stays within MAX_IDS and nothing is dropped."""
    from edge_agent.tts.phonemes import espeak_phonemes
    from edge_agent.tts.piper import MAX_IDS

    sentence = " ".join(["12345"] * 50)
    calls = whole.phoneme_ids(sentence)
    assert len(calls) >= 3 and all(len(ids) <= MAX_IDS for ids in calls)
    phonemes = sum(len(p) for p in espeak_phonemes(sentence, whole.config.espeak_voice))
    assert sum((len(ids) - 2) // 2 for ids in calls) >= phonemes - len(calls)  # only cut spaces dropped
