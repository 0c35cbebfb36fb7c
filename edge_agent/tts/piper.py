"""Piper-format VITS voices on onnxruntime, phonemized offline by espeak-ng."""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.audio.frames import Samples
from edge_agent.errors import ModelError
from edge_agent.runtime.providers import CPU, Accelerator, Profile
from edge_agent.runtime.sessions import load_weights, make_session
from edge_agent.text.normalize import normalize
from edge_agent.tts import inuse
from edge_agent.tts.phonemes import cut_at, espeak_phonemes
from edge_agent.tts.pool import PriorityPool, idle_cores
from edge_agent.tts.sentences import split_sentences
from edge_agent.tts.vits import prepare, prepare_cpu
from edge_agent.tts.voice import by_sentence
from edge_agent.tts.windowed import UnsupportedGraph, Vocoder, plan_windows, split_window, window_profile

log = logging.getLogger(__name__)

_BOS, _EOS, _PAD = "^", "$", "_"

LOOKAHEAD = 2
"""Model calls after the one being yielded whose fronts may already run."""

MAX_IDS = 1024
"""Phoneme ids of the longest model call a TensorRT profile covers (a long sentence is ~400)."""

MAX_PHONEMES = (MAX_IDS - 2) // 2
"""Phonemes per model call at most (each is an id and a pad, between BOS and EOS), so no call
leaves the profile; a 300-character sentence of plain words is about 330."""

URGENT, FRONT, WINDOW = -1, 0, 1
"""Pool priorities: the window playback starts with, then the next call's front
(it feeds the workers more windows, so the pool does not run dry at a
sentence's end), then the other windows and fronts in order."""


@dataclass(frozen=True)
class PiperConfig:
    """The parts of a Piper `.onnx.json` we use."""

    sample_rate: int
    espeak_voice: str
    phoneme_id_map: dict[str, list[int]]
    noise_scale: float
    length_scale: float
    noise_w: float
    num_speakers: int

    @staticmethod
    def load(path: Path) -> PiperConfig:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            inference = doc.get("inference", {})
            if doc.get("phoneme_type", "espeak") != "espeak":
                raise ModelError(f"{path}: only espeak phonemes are supported")
            return PiperConfig(
                sample_rate=int(doc["audio"]["sample_rate"]),
                espeak_voice=str(doc["espeak"]["voice"]),
                phoneme_id_map={k: list(v) for k, v in doc["phoneme_id_map"].items()},
                noise_scale=float(inference.get("noise_scale", 0.667)),
                length_scale=float(inference.get("length_scale", 1.0)),
                noise_w=float(inference.get("noise_w", 0.8)),
                num_speakers=int(doc.get("num_speakers", 1)),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"{path}: not a usable Piper voice config ({exc})") from None


class PiperVoice:
    """A loaded Piper voice. `stream` yields float32 audio, window by window.

    When the graph could be split (see `edge_agent.tts.vits`), every job is
    single-threaded and runs on a pool of `threads` workers: the vocoder's
    windows, and the fronts of the sentences after the first, so the next
    sentence's front runs beside the current one's windows and no core is ever
    asked to run two threads. Only the first front of a stream, when nothing
    else of ours can run yet, takes every core (`threads` intra-op threads).
    Its threads do not spin between ops: the cores are shared (other
    processes, the wake word engine), and on a loaded 2-core machine a thread
    spinning while its partner waited for a core doubled the front's CPU
    time and made it 1.6-2x slower (spinning only wins on idle cores). Both
    front sessions share one copy of the weights. Otherwise the original
    graph runs whole.
    """

    def __init__(self, voice_id: str, session: Any, config: PiperConfig, length_scale: float | None = None,
                 *, noise_scale: float | None = None, noise_w: float | None = None,
                 vocoder: Vocoder | None = None, front: Callable[[], Any] | None = None, workers: int = 1,
                 weights: Any = None, holds: Sequence[inuse.InUse] = ()) -> None:
        self.id = voice_id
        self._holds = list(holds)
        """The prepared directories the sessions come from, held until `close` (the pooled front
        is made from them later)."""
        self.sample_rate = config.sample_rate
        self.config = config
        self._session = session  # the whole graph, or the front with every core
        # The single-threaded front is made when a stream first needs it: a one-sentence
        # `say` never does, and making it is a good part of a short `say`'s start-up.
        self._make_front = front
        self._front: Any = None if front is not None else session
        self._front_lock = threading.Lock()
        self._weights = weights  # the sessions use these buffers in place: keep them alive
        self._vocoder = vocoder
        self._pool: PriorityPool | None = None
        self._workers = max(1, workers)
        if vocoder is not None:
            self._pool = PriorityPool(self._workers, f"tts-{voice_id}")
        # The graph draws its noise unseeded: with either scale above 0 no two takes are alike.
        self._scales = np.array(
            [config.noise_scale if noise_scale is None else noise_scale, length_scale or config.length_scale,
             config.noise_w if noise_w is None else noise_w],
            dtype=np.float32,
        )

    @staticmethod
    def load(voice_id: str, model: Path, config: Path | None = None, *, threads: int = 2,
             length_scale: float | None = None, noise_scale: float | None = None,
             noise_w: float | None = None, prepared_dir: Path | None = None,
             accel: Accelerator = CPU) -> PiperVoice:
        """Load a voice; with `prepared_dir`, split it there (once) and stream its vocoder.
        A scale left None is the voice's own (its `.onnx.json`)."""
        cfg = PiperConfig.load(config or model.with_name(model.name + ".json"))
        if prepared_dir is not None:
            split = _load_split(model, prepared_dir, threads, accel, cfg)
            if split is not None:
                lead, front, vocoder, weights, holds = split
                return PiperVoice(voice_id, lead, cfg, length_scale, noise_scale=noise_scale, noise_w=noise_w,
                                  vocoder=vocoder, front=front, workers=threads, weights=weights, holds=holds)
        return PiperVoice(voice_id, make_session(model, threads, accel=accel, profile=_front_profile(cfg)),
                          cfg, length_scale, noise_scale=noise_scale, noise_w=noise_w)

    @property
    def noiseless(self) -> bool:
        """True when neither noise scale is above 0: every take of a text is the same samples."""
        return bool(self._scales[0] == 0 and self._scales[2] == 0)

    @property
    def streaming(self) -> bool:
        """True when the vocoder runs in windows (the graph was split)."""
        return self._vocoder is not None

    def sentences(self, text: str) -> list[str]:
        return split_sentences(normalize(text))

    def phoneme_ids(self, sentence: str) -> list[list[int]]:
        """Phoneme ids per model call: per espeak sentence (espeak may split further than we did),
        cut at word boundaries to at most `MAX_PHONEMES` (text the device did not normalise,
        e.g. a server's, can expand 5x: "12345" is 30 phonemes)."""
        id_map = self.config.phoneme_id_map
        result = []
        runs = (piece for phonemes in espeak_phonemes(sentence, self.config.espeak_voice)
                for piece in cut_at(phonemes, MAX_PHONEMES, " "))
        for phonemes in runs:
            ids = list(id_map[_BOS])
            for phoneme in phonemes:
                mapped = id_map.get(phoneme)
                if mapped is None:
                    log.debug("voice %s: phoneme %r has no id", self.id, phoneme)
                    continue
                ids.extend(mapped)
                ids.extend(id_map[_PAD])
            ids.extend(id_map[_EOS])
            if len(ids) > 2:
                result.append(ids)
        return result

    def _inputs(self, ids: list[int]) -> dict[str, Any]:
        inputs = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": self._scales,
        }
        if self.config.num_speakers > 1:
            inputs["sid"] = np.zeros(1, dtype=np.int64)
        return inputs

    def synthesize_ids(self, ids: list[int]) -> Samples:
        """All the audio of one model call."""
        if self._vocoder is None:
            audio: Samples = self._session.run(None, self._inputs(ids))[0].reshape(-1)
        else:
            pieces = [f.result() for f in self._decode(ids, self._session, first=False)]
            audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        return _clip(audio)

    def _decode(self, ids: list[int], session: Any, *, first: bool,
                cancelled: threading.Event | None = None) -> list[Future[Samples]]:
        """Run the front on `session`, then queue the vocoder's windows on the pool; a stream's
        `first` window runs alone (in pieces, one per idle core), the rest of its sentence is queued
        once it is done."""
        assert self._vocoder is not None and self._pool is not None
        pool, decode = self._pool, self._vocoder.decode
        z = session.run(None, self._inputs(ids))[0]
        if cancelled is not None and cancelled.is_set():
            return []
        windows = plan_windows(z.shape[-1], first=first, workers=self._workers)
        if not first or not windows:
            return [pool.submit(WINDOW, decode, z, start, end) for start, end in windows]
        # The first window is all that playback waits for: on cores that are idle its pieces run
        # side by side, one per worker (24 frames took 14 ms on one core, 9 ms as two pieces on
        # two); on busy ones a second piece only adds its overlap and waits its turn.
        idle = idle_cores()
        parts = self._workers if idle is None else max(1, min(self._workers, idle))
        lead = _joined([pool.submit(URGENT, decode, z, start, end)
                        for start, end in split_window(*windows[0], parts)])
        return [lead, *(pool.submit_after(lead, WINDOW, decode, z, start, end) for start, end in windows[1:])]

    def _decode_pooled(self, ids: list[int], cancelled: threading.Event) -> list[Future[Samples]]:
        """`_decode` on the single-threaded front (made on first use), for a pool worker."""
        with self._front_lock:
            if self._front is None and self._make_front is not None:
                self._front = self._make_front()
            front = self._front
        return self._decode(ids, front, first=False, cancelled=cancelled)

    def stream(self, sentences: list[str]) -> Iterator[tuple[int, Samples, bool]]:
        """`(sentence index, samples, last of its sentence)` for each piece of audio, in order.

        Every sentence ends with exactly one `last` piece (empty if espeak found
        nothing to say in it). The first front runs here, on every core; the
        next `LOOKAHEAD` model calls' fronts go to the pool, each on one worker
        (the next one ahead of the windows queued, except the first), so a
        long next sentence never holds back audio that is ready. Until the
        first window is decoded nothing else of the stream runs: on cores
        shared with other work (a loaded machine, the wake word engine) a
        second job of ours beside it would only slow the first audio down,
        and what waits (the rest of the sentence, the next fronts) has the
        first window's playing time to catch up in. Closing the iterator
        early cancels what is queued.
        """
        if self._vocoder is None or self._pool is None:
            yield from by_sentence(self, sentences)
            return
        pool = self._pool
        # Phonemized as the look-ahead reaches each sentence, not all before the first front:
        # espeak takes ~0.5 ms a sentence, which a long text would add to its first audio.
        calls = ((index, ids, n == len(ids_list) - 1)
                 for index, sentence in enumerate(sentences)
                 for ids_list in [self.phoneme_ids(sentence) or [[]]]
                 for n, ids in enumerate(ids_list))
        cancelled = threading.Event()
        queued: deque[tuple[int, bool, Future[list[Future[Samples]]] | None]] = deque()
        current: list[Future[Samples]] = []
        lead = True
        first_window: Future[Samples] | None = None

        def top_up() -> None:
            nonlocal lead, first_window
            while len(queued) < LOOKAHEAD and (call := next(calls, None)) is not None:
                index, ids, last = call
                job: Future[list[Future[Samples]]] | None = None
                if ids and lead:  # nothing else is running yet: this front takes every core
                    lead = False
                    job = Future()
                    windows = self._decode(ids, self._session, first=True)
                    job.set_result(windows)
                    first_window = windows[0] if windows else None
                elif ids:
                    # Only the next call's front jumps the windows already queued: one
                    # further ahead waits its turn, so a slow device is never kept
                    # from the window playback needs next by fronts it needs later.
                    urgent = len(queued) == (1 if lead_queued else 0)
                    priority, pooled = FRONT if urgent else WINDOW, self._decode_pooled
                    job = (pool.submit(priority, pooled, ids, cancelled) if first_window is None
                           else pool.submit_after(first_window, priority, pooled, ids, cancelled))
                queued.append((index, last, job))

        lead_queued = True  # the first call is still in `queued` (not being yielded yet)
        try:
            top_up()
            while queued:
                index, last, job = queued.popleft()
                lead_queued = False
                top_up()
                current = job.result() if job is not None else []
                if not current:
                    yield index, np.zeros(0, dtype=np.float32), last
                for n, window in enumerate(current):
                    yield index, _clip(window.result()), last and n == len(current) - 1
        finally:
            cancelled.set()
            for window in current:
                window.cancel()
            for _, _, job in queued:  # a running front sees `cancelled` and queues nothing
                if job is not None and not job.cancel() and job.done() and job.exception() is None:
                    for window in job.result():
                        window.cancel()

    def synthesize_sentence(self, sentence: str) -> Iterator[Samples]:
        """One piece per model call: for callers that want whole sentences (the server).

        No small first window here: `stream` is the path for first audio soon.
        """
        for ids in self.phoneme_ids(sentence):
            yield self.synthesize_ids(ids)

    def sessions(self) -> dict[str, Any]:
        if self._vocoder is None:
            return {"model": self._session}
        return {"front": self._session, "vocoder": self._vocoder.session}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        with self._front_lock:
            self._session = self._front = self._make_front = self._weights = None
        for held in self._holds:
            held.release()
        self._holds = []


def _joined(parts: list[Future[Samples]]) -> Future[Samples]:
    """One future for the pieces of a window: their samples in order once all are decoded (it
    fails if one fails); cancelling it cancels the pieces not yet started."""
    if len(parts) == 1:
        return parts[0]
    joined: Future[Samples] = Future()
    left = [len(parts)]
    lock = threading.Lock()

    def part_done(_: Future[Samples]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        if not joined.set_running_or_notify_cancel():
            return
        try:
            joined.set_result(np.concatenate([part.result() for part in parts]))
        except BaseException as exc:  # a failed or cancelled piece: the window cannot be had
            joined.set_exception(exc)

    def cancel_parts(future: Future[Samples]) -> None:
        if future.cancelled():
            for part in parts:
                part.cancel()

    joined.add_done_callback(cancel_parts)
    for part in parts:
        part.add_done_callback(part_done)
    return joined


def _clip(audio: Samples) -> Samples:
    return np.clip(audio, -1.0, 1.0).astype(np.float32, copy=False)


def _front_profile(config: PiperConfig) -> Profile:
    """The shapes a front (or the whole graph) is fed: one sentence of 1..`MAX_IDS` phoneme ids."""
    def shapes(ids: int) -> dict[str, tuple[int, ...]]:
        fed = {"input": (1, ids), "input_lengths": (1,), "scales": (3,)}
        return fed | ({"sid": (1,)} if config.num_speakers > 1 else {})

    return Profile(shapes(1), shapes(128), shapes(MAX_IDS))


def _load_split(model: Path, prepared_dir: Path, threads: int, accel: Accelerator, config: PiperConfig
                ) -> tuple[Any, Callable[[], Any] | None, Vocoder, Any, list[inuse.InUse]] | None:
    """`(lead front, maker of the pooled front (None: the lead), vocoder, shared weights, the
    prepared directories held)`, preparing the split if needed.

    None if this graph cannot be split, the split cannot be written, or a copy that does not
    load is in use by another process (so it cannot be made again).
    """
    for attempt in (1, 2, 3):  # a damaged optimized copy, then a damaged split, is made again
        try:
            prepared = prepare(model, prepared_dir)
        except UnsupportedGraph as exc:
            log.info("%s: vocoder runs whole (%s)", model.name, exc)
            return None
        except OSError as exc:  # a read-only or full cache must not cost the voice
            log.warning("%s: cannot prepare the split in %s (%s); the vocoder runs whole",
                        model.name, prepared_dir, exc)
            return None
        holds: list[inuse.InUse] = []
        loading = prepared
        try:
            held = inuse.hold(prepared.directory)
            if held is None:
                raise ModelError(f"{prepared.directory}: removed while loading")
            holds.append(held)
            # The CPU runs a copy optimized for it once; an accelerator's provider optimizes the
            # split itself, and holds its own copy of the weights per session (no sharing).
            cpu = prepare_cpu(prepared) if accel.cpu_only else None
            held = inuse.hold(cpu.directory) if cpu is not None else None
            if cpu is not None and held is not None:
                holds.append(held)
                loading = cpu
            weights = load_weights(loading.front) if accel.cpu_only else None
            front_shapes, window_shapes = _front_profile(config), window_profile(prepared.info)
            common: dict[str, Any] = {"shapes_vary": True, "accel": accel, "optimized": loading is cpu}
            lead = make_session(loading.front, threads, spin=False, weights=weights, profile=front_shapes,
                                **common)
            front = (functools.partial(make_session, loading.front, 1, spin=False, weights=weights,
                                       profile=front_shapes, **common) if threads > 1 else None)
            vocoder = make_session(loading.vocoder, 1, profile=window_shapes, **common)
            return lead, front, Vocoder(vocoder, prepared.info), weights, holds
        except ModelError:
            for held_dir in holds:
                held_dir.release()  # our own hold would keep us from removing it
            if attempt == 3:
                raise
            if not inuse.remove_unheld(loading.directory):
                log.warning("%s: prepared copy does not load, and another process is using it; "
                            "the vocoder runs whole", loading.directory)
                return None
            log.warning("%s: prepared copy does not load; preparing it again", loading.directory)
    return None
