"""Whisper on onnxruntime: log-mel in numpy, the exported encoder, greedy decoding with a KV cache.

The encoder accepts any even number of mel frames up to 3000. Whisper itself pads
every input to 30 s; for a 2 s voice command that padding is most of the work.
`Padding` chooses the encoder length per utterance: `full` (30 s, Whisper's own
behaviour) or `bucket` (speech plus a margin of silence, rounded up to a multiple
of `bucket_s`, so a few distinct lengths keep onnxruntime's caches warm).

A short window is not the same input made cheaper: the encoder's self-attention spans
the whole window, so every encoder state (the speech's too) changes with its length,
and Whisper was trained on 30 s windows only. Mostly the transcript is the same; where
the model is unsure it can differ by whole words ("Lock the front door." became "The
Lachma Front Door"). So a bucket result that is degenerate, or whose tokens average a
log-probability below `retry_logprob`, is decoded again in a longer window (`retry_window_s`, 30 s
by default: Whisper's own).

Decoding follows openai-whisper without timestamps: the prompt is the
start-of-transcript sequence plus `<|notimestamps|>`, blank output and
end-of-text are suppressed on the first step, the manifest's `suppress_tokens`
on every step, and the arg-max token is taken until end-of-text (greedy, the
default), or `beam_size` hypotheses are kept (`edge_agent.asr.beam`, its rules), all of
them decoded in one batched decoder call per step.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_agent.asr.beam import Beam
from edge_agent.asr.features import (
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FRAMES,
    SAMPLE_RATE,
    Features,
    log_mel_spectrogram,
)
from edge_agent.asr.manifest import Manifest, load_manifest, verify_files
from edge_agent.asr.settings import AsrSettings
from edge_agent.asr.tokenizer import SPACE_TOKEN, Tokenizer
from edge_agent.audio.frames import Samples
from edge_agent.errors import ModelError, UsageError
from edge_agent.models.settings import ModelSettings
from edge_agent.runtime.providers import CPU, Accelerator, Profile
from edge_agent.runtime.sessions import make_session

log = logging.getLogger(__name__)

EXPORT_SUBDIR = "exported"
"""Exports live in `<models.cache_dir>/exported/<source id>/`."""


@dataclass(frozen=True)
class Padding:
    """How long the encoder input is for a given amount of audio."""

    policy: str = AsrSettings.padding
    bucket_s: float = AsrSettings.bucket_s
    margin_s: float = AsrSettings.margin_s
    retry_logprob: float = AsrSettings.retry_logprob
    """A bucket result less sure than this (mean token log-probability) is decoded again in
    `retry_frames`."""
    retry_window_s: float = AsrSettings.retry_window_s

    @staticmethod
    def from_settings(settings: AsrSettings) -> Padding:
        return Padding(settings.padding, settings.bucket_s, settings.margin_s, settings.retry_logprob,
                       settings.retry_window_s)

    def retry_frames(self, frames: int) -> int:
        """The window (mel frames) a degenerate or unsure decode at `frames` is decoded again in:
        `retry_window_s`, or Whisper's 30 s where the first window was already that long."""
        window = 2 * round(self.retry_window_s * FRAMES_PER_SECOND / 2)
        return window if frames < window <= N_FRAMES else N_FRAMES

    def frames(self, n_samples: int) -> int:
        """Mel frames (even, at most 3000) fed to the encoder for `n_samples` of audio."""
        if self.policy == "full":
            return N_FRAMES
        seconds = n_samples / SAMPLE_RATE + self.margin_s
        bucket = max(1, round(self.bucket_s * FRAMES_PER_SECOND))
        frames = math.ceil(seconds * FRAMES_PER_SECOND / bucket) * bucket
        frames += frames % 2
        return min(N_FRAMES, max(2, frames))


@dataclass
class Timings:
    """Seconds spent in each stage of one recognition."""

    features: float = 0.0
    encoder: float = 0.0
    decoder: float = 0.0

    @property
    def total(self) -> float:
        return self.features + self.encoder + self.decoder


@dataclass(frozen=True)
class Recognition:
    """What Whisper heard in one stretch of audio (at most 30 s)."""

    text: str
    tokens: tuple[int, ...]
    """Sampled token ids, without the prompt and without end-of-text."""
    no_speech_prob: float
    """Probability of `<|nospeech|>` at the start (0 when the model has no such token)."""
    avg_logprob: float
    """Mean log-probability of the sampled tokens, end-of-text included (Whisper's measure)."""
    frames: int
    """Mel frames the encoder saw."""
    timings: Timings = field(default_factory=Timings)
    fallback: bool = False
    """The short window gave a degenerate or unsure result and this one came from the retry window
    (`asr.retry_window_s`)."""


COMPRESSION_RATIO_LIMIT = 2.4
"""Whisper's own threshold: text that gzip shrinks more than this is a repetition loop."""


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def token_budget(seconds: float) -> int:
    """Most tokens plausible for `seconds` of speech (fast speech is about 5 tokens a second)."""
    return 16 + math.ceil(8 * seconds)


REPEAT_WORDS = 3
"""A run of at least this many words said twice in a row is a repetition (`repeats_a_run`)."""


def repeats_a_run(text: str) -> bool:
    """The text says a run of `REPEAT_WORDS` or more words twice in a row ("Open the garage door and
    turn on the porch light. Open the garage door and turn on the porch light."). A short window
    makes tiny.en do that (seen in `bench hear --room`), and gzip misses a single repeat: the doubled
    command above compresses 1.74 times, under Whisper's 2.4. Linear in the words for each run length:
    a run of k words repeats where k words in a row equal the word k further on."""
    words = [w.strip(".,!?;:\"'").lower() for w in text.split()]
    for k in range(REPEAT_WORDS, len(words) // 2 + 1):
        same = 0
        for i in range(len(words) - k):
            same = same + 1 if words[i] == words[i + k] else 0
            if same >= k:
                return True
    return False


def degenerate(result: Recognition, limit: int) -> bool:
    """A repetition loop: decoding used up its budget, or the text repeats itself."""
    return (len(result.tokens) >= limit or compression_ratio(result.text) > COMPRESSION_RATIO_LIMIT
            or repeats_a_run(result.text))


def resolve_export_dir(asr: AsrSettings, models: ModelSettings) -> Path:
    """`asr.model` as a directory if it looks like a path, else the export of that source id."""
    value = asr.model
    if "/" in value or value.startswith((".", "~")):
        return Path(value).expanduser()
    return models.cache_dir / EXPORT_SUBDIR / value


class WhisperOnnx:
    """An exported Whisper model (one variant) ready to transcribe 16 kHz audio."""

    def __init__(self, manifest: Manifest, variant: str, encoder: Any, decoder: Any,
                 tokenizer: Tokenizer) -> None:
        self.manifest = manifest
        self.variant = variant
        self.dims = manifest.dims
        self.tokens = manifest.tokens
        self.tokenizer = tokenizer
        self._encoder = encoder
        self._decoder = decoder
        self._suppress = self._suppressed_ids()
        self._blank = self._blank_ids()
        self._batched = _has_batch_axis(decoder)
        """The decoder takes many sequences per call (exports before the batch axis take one)."""

    @staticmethod
    def load(directory: Path, variant: str | None = None, threads: int = 2,
             *, decoder_threads: int | None = None, verify: bool = True,
             accel: Accelerator = CPU) -> WhisperOnnx:
        """Load `variant` (default: the manifest's) from an export directory.

        `threads` is the encoder's intra-op thread count, `decoder_threads` the
        decoder's (default: the same).
        """
        manifest = load_manifest(directory)
        chosen = manifest.variant(variant or None)
        if manifest.sample_rate != SAMPLE_RATE:
            raise ModelError(f"{directory}: sample rate {manifest.sample_rate}, expected {SAMPLE_RATE}")
        if verify:
            verify_files(manifest, [chosen.encoder, chosen.decoder, "tokenizer.json"])
        started = time.perf_counter()
        # The encoder is fed an even number of mel frames up to Whisper's 30 s window (bucket
        # padding: multiples of asr.bucket_s); the decoder's KV cache grows a token at a time,
        # which TensorRT cannot profile usefully, so it gets no profile. The encoder plans no
        # memory patterns (`shapes_vary`): with them each bucket length got blocks of its own that
        # onnxruntime's arena kept, so a device's memory grew with every length it heard (the 30 s
        # retry after an 8 s bucket: +201 MB instead of +102), at the same speed.
        def mel(frames: int) -> dict[str, tuple[int, ...]]:
            return {"mel": (1, manifest.dims.n_mels, frames)}

        encoder = make_session(directory / chosen.encoder, threads, accel=accel, shapes_vary=True,
                               profile=Profile(mel(2), mel(800), mel(N_FRAMES)))
        decoder = make_session(directory / chosen.decoder, decoder_threads or threads, accel=accel)
        tokenizer = Tokenizer.load(manifest.tokenizer_path)
        _check_io(encoder, {"mel"}, directory / chosen.encoder)
        _check_io(decoder, {"tokens", "self_k_in", "self_v_in", "cross_k", "cross_v", "offset"},
                  directory / chosen.decoder)
        log.info("whisper %s (%s) loaded in %.2f s", directory.name, chosen.name,
                 time.perf_counter() - started)
        return WhisperOnnx(manifest, chosen.name, encoder, decoder, tokenizer)

    @staticmethod
    def from_settings(asr: AsrSettings, models: ModelSettings, accel: Accelerator = CPU) -> WhisperOnnx:
        return WhisperOnnx.load(resolve_export_dir(asr, models), asr.variant or None, asr.threads,
                                decoder_threads=asr.decoder_threads, accel=accel)

    # -- prompt and logit filters ---------------------------------------------------

    def prompt(self, language: str | None = None) -> list[int]:
        """The manifest's start-of-transcript sequence, in `language`, ending in `<|notimestamps|>`."""
        t = self.tokens
        sequence = list(t.sot_sequence) or [t.sot]
        if self.manifest.multilingual and language:
            lang = t.languages.get(language)
            if lang is None:
                raise UsageError(f"asr.language: {language!r} is not a language this model knows")
            known = set(t.languages.values())
            at = next((i for i, tok in enumerate(sequence) if tok in known), None)
            if at is None:
                sequence.insert(1, lang)
            else:
                sequence[at] = lang
        if t.no_timestamps not in sequence:
            sequence.append(t.no_timestamps)
        return sequence

    def _suppressed_ids(self) -> npt.NDArray[np.int64]:
        t = self.tokens
        ids = set(self.manifest.suppress_tokens) | {t.transcribe, t.translate, t.sot}
        if t.no_speech is not None:
            ids.add(t.no_speech)
        return np.array(sorted(i for i in ids if 0 <= i < self.dims.n_vocab), dtype=np.int64)

    def _blank_ids(self) -> npt.NDArray[np.int64]:
        if self.manifest.begin_suppress_tokens:
            return np.array(self.manifest.begin_suppress_tokens, dtype=np.int64)
        ids = [self.tokens.eot]
        with contextlib.suppress(ModelError):  # a vocabulary without a bare space: nothing to suppress
            ids.append(self.tokenizer.token_id(SPACE_TOKEN))
        return np.array(ids, dtype=np.int64)

    # -- stages ----------------------------------------------------------------------

    def features(self, audio: Samples, frames: int) -> Features:
        """Log-mel of `audio` padded with silence (or cut) to exactly `frames` frames."""
        wanted = frames * HOP_LENGTH
        clip = audio[:wanted]
        mel = log_mel_spectrogram(clip, self.dims.n_mels, padding=wanted - clip.size)
        return mel[:, :frames]

    def encode(self, mel: Features) -> tuple[Features, Features]:
        """Cross-attention keys and values for a [n_mels, frames] log-mel."""
        cross_k, cross_v = self._encoder.run(["cross_k", "cross_v"], {"mel": mel[None, :, :]})
        return cross_k, cross_v

    def _run_decoder(self, tokens: npt.NDArray[np.int64], cache: tuple[Features, Features],
                     cross: tuple[Features, Features]) -> tuple[Features, Features, Features]:
        """The decoder over a batch of sequences: logits [batch, n, vocab] and the grown cache.

        An export whose decoder has a batch axis takes them in one call; an older one (batch
        fixed at 1) gets one call per sequence, with the same results.
        """
        if self._batched or tokens.shape[0] == 1:
            return self._decoder_call(tokens, cache, cross)
        parts = [self._decoder_call(tokens[i:i + 1], (cache[0][:, i:i + 1], cache[1][:, i:i + 1]), cross)
                 for i in range(tokens.shape[0])]
        return (np.concatenate([p[0] for p in parts], axis=0), np.concatenate([p[1] for p in parts], axis=1),
                np.concatenate([p[2] for p in parts], axis=1))

    def _decoder_call(self, tokens: npt.NDArray[np.int64], cache: tuple[Features, Features],
                      cross: tuple[Features, Features]) -> tuple[Features, Features, Features]:
        (self_k, self_v), (cross_k, cross_v) = cache, cross
        logits, self_k, self_v = self._decoder.run(
            ["logits", "self_k_out", "self_v_out"],
            {"tokens": tokens, "self_k_in": self_k, "self_v_in": self_v,
             "cross_k": cross_k, "cross_v": cross_v, "offset": np.array(self_k.shape[2], dtype=np.int64)},
        )
        return logits, self_k, self_v

    def _step(self, step: int, tokens: npt.NDArray[np.int64], cache: tuple[Features, Features],
              cross: tuple[Features, Features]) -> tuple[Features, float, tuple[Features, Features]]:
        """One decoder call for a batch of sequences (`tokens` [batch, n]): each one's last-position
        logits [batch, vocab] with the suppressed tokens (and, at the first step, blank) masked,
        the no-speech probability (the first sequence's, meaningful at the first step only), and
        the grown self-attention cache."""
        logits, self_k, self_v = self._run_decoder(tokens, cache, cross)
        no_speech = 0.0
        if step == 0 and self.tokens.no_speech is not None:
            no_speech = float(_softmax(logits[0, 0].astype(np.float64))[self.tokens.no_speech])
        # float32 throughout: a float64 copy of the 51k logits cost more than the rest of the step's numpy
        last: Features = logits[:, -1].copy()
        last[:, self._suppress] = -np.inf
        if step == 0:
            last[:, self._blank] = -np.inf
        return last, no_speech, (self_k, self_v)

    def _empty_cache(self) -> tuple[Features, Features]:
        d = self.dims
        empty = np.zeros((d.n_text_layer, 1, 0, d.n_text_state), dtype=np.float32)
        return empty, empty

    def decode(self, cross_k: Features, cross_v: Features, prompt: list[int],
               max_tokens: int) -> tuple[list[int], float, float]:
        """Greedy decoding: (sampled tokens, no-speech probability, sum of log-probabilities)."""
        eot = self.tokens.eot
        cache = self._empty_cache()
        step_input = np.array([prompt], dtype=np.int64)
        sampled: list[int] = []
        no_speech = 0.0
        sum_logprob = 0.0
        limit = min(max_tokens, self.dims.n_text_ctx - len(prompt))
        for step in range(limit):
            last, step_no_speech, cache = self._step(step, step_input, cache, (cross_k, cross_v))
            if step == 0:
                no_speech = step_no_speech
            token = int(np.argmax(last[0]))
            sum_logprob += float(_log_softmax_at(last[0], token))
            if token == eot:
                break
            sampled.append(token)
            step_input = np.array([[token]], dtype=np.int64)
        return sampled, no_speech, sum_logprob

    def decode_beam(self, cross_k: Features, cross_v: Features, prompt: list[int], max_tokens: int,
                    beam_size: int) -> tuple[list[int], float, float]:
        """Beam search: (best tokens, no-speech probability, their sum of log-probabilities).

        Each step feeds every live hypothesis to the decoder as one batch (their caches
        gathered row by row), so the decoder reads its weights once per step, not once per
        hypothesis; a hypothesis's state is its row of that step's output cache.
        """
        beam = Beam(beam_size, self.tokens.eot, _Row(*self._empty_cache(), 0))
        no_speech = 0.0
        limit = min(max_tokens, self.dims.n_text_ctx - len(prompt))
        for step in range(limit):
            live = beam.live
            fed = [prompt] if step == 0 else [[hyp.tokens[-1]] for hyp in live]
            cache = _gather([hyp.state for hyp in live])
            last, step_no_speech, (k, v) = self._step(step, np.array(fed, dtype=np.int64), cache,
                                                      (cross_k, cross_v))
            if step == 0:
                no_speech = step_no_speech
            beam.advance(list(_log_softmax(last)), [_Row(k, v, i) for i in range(len(live))])
            if beam.done:
                break
        tokens, sum_logprob = beam.best()
        return list(tokens), no_speech, sum_logprob

    def recognize(self, audio: Samples, padding: Padding | None = None, *, max_tokens: int = 224,
                  language: str | None = None, beam_size: int = 1) -> Recognition:
        """Transcribe 16 kHz mono audio; beyond 30 s it goes in consecutive 30 s windows.

        `beam_size` 1 decodes greedily; more keeps that many hypotheses. With bucket
        padding, a degenerate result (a repetition loop: text that compresses too well,
        or decoding that ran out of tokens) or an unsure one (`Padding.retry_logprob`) is
        decoded again in the retry window (`Padding.retry_frames`), and `fallback` says so.
        """
        pad = padding or Padding("full")
        if audio.size > N_FRAMES * HOP_LENGTH:
            return self._recognize_long(audio, pad, max_tokens, language, beam_size)
        frames = pad.frames(audio.size)
        limit = min(max_tokens, token_budget(audio.size / SAMPLE_RATE))
        result = self._recognize_window(audio, frames, limit, language, beam_size)
        if frames < N_FRAMES and (degenerate(result, limit) or result.avg_logprob < pad.retry_logprob):
            retry = pad.retry_frames(frames)
            log.info("decode at %d frames looks degenerate or unsure (%r, logprob %.2f); again at %d frames",
                     frames, result.text[:80], result.avg_logprob, retry)
            full = self._recognize_window(audio, retry, max_tokens, language, beam_size)
            spent = result.timings
            timings = Timings(spent.features + full.timings.features, spent.encoder + full.timings.encoder,
                              spent.decoder + full.timings.decoder)
            return replace(full, timings=timings, fallback=True)
        return result

    def _recognize_window(self, audio: Samples, frames: int, max_tokens: int,
                          language: str | None, beam_size: int) -> Recognition:
        timings = Timings()
        started = time.perf_counter()
        mel = self.features(audio, frames)
        timings.features = time.perf_counter() - started
        started = time.perf_counter()
        cross_k, cross_v = self.encode(mel)
        timings.encoder = time.perf_counter() - started
        started = time.perf_counter()
        prompt = self.prompt(language)
        if beam_size > 1:
            tokens, no_speech, sum_logprob = self.decode_beam(cross_k, cross_v, prompt, max_tokens, beam_size)
        else:
            tokens, no_speech, sum_logprob = self.decode(cross_k, cross_v, prompt, max_tokens)
        timings.decoder = time.perf_counter() - started
        text = self.tokenizer.decode(tokens).strip()
        return Recognition(text, tuple(tokens), no_speech, sum_logprob / (len(tokens) + 1), frames, timings)

    def _recognize_long(self, audio: Samples, pad: Padding, max_tokens: int,
                        language: str | None, beam_size: int) -> Recognition:
        window = N_FRAMES * HOP_LENGTH
        parts = [self.recognize(audio[i:i + window], pad, max_tokens=max_tokens, language=language,
                                beam_size=beam_size)
                 for i in range(0, audio.size, window)]
        timings = Timings(sum(p.timings.features for p in parts), sum(p.timings.encoder for p in parts),
                          sum(p.timings.decoder for p in parts))
        return Recognition(
            text=" ".join(p.text for p in parts if p.text),
            tokens=tuple(t for p in parts for t in p.tokens),
            no_speech_prob=min(p.no_speech_prob for p in parts),
            avg_logprob=float(np.mean([p.avg_logprob for p in parts])),
            frames=sum(p.frames for p in parts),
            timings=timings,
        )

    def sessions(self) -> dict[str, Any]:
        """Its onnxruntime sessions by part."""
        return {"encoder": self._encoder, "decoder": self._decoder}

    def close(self) -> None:
        self._encoder = None
        self._decoder = None


@dataclass(frozen=True)
class _Row:
    """A beam hypothesis's decoder state: row `index` of a batched self-attention cache."""

    k: Features
    v: Features
    index: int


def _gather(rows: list[_Row]) -> tuple[Features, Features]:
    """The caches of `rows` stacked on the batch axis, in order (one source row may repeat)."""
    if all(r.k is rows[0].k for r in rows):
        at = [r.index for r in rows]
        return np.take(rows[0].k, at, axis=1), np.take(rows[0].v, at, axis=1)
    return (np.concatenate([r.k[:, r.index:r.index + 1] for r in rows], axis=1),
            np.concatenate([r.v[:, r.index:r.index + 1] for r in rows], axis=1))


def _has_batch_axis(decoder: Any) -> bool:
    tokens = next((i for i in decoder.get_inputs() if i.name == "tokens"), None)
    return tokens is not None and not isinstance(tokens.shape[0], int)


def _softmax(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    e = np.exp(x - x.max())
    out: npt.NDArray[np.float64] = e / e.sum()
    return out


def _log_softmax(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """log softmax over the last axis in float32, the normaliser summed in float64; -inf entries
    stay -inf."""
    top = x.max(axis=-1, keepdims=True)
    norm = np.log(np.exp(x - top).sum(axis=-1, keepdims=True, dtype=np.float64)).astype(np.float32)
    out: npt.NDArray[np.float32] = x - (top + norm)
    return out


def _log_softmax_at(x: npt.NDArray[np.floating[Any]], index: int) -> float:
    """log softmax(x)[index]; entries of -inf (suppressed tokens) count as probability 0."""
    top = x.max()
    return float(x[index] - top - np.log(np.exp(x - top).sum(dtype=np.float64)))


def _check_io(session: Any, expected: set[str], path: Path) -> None:
    names = {i.name for i in session.get_inputs()}
    if not expected <= names:
        raise ModelError(f"{path}: inputs {sorted(names)} lack {sorted(expected - names)}; "
                         "not an edge-export Whisper model")
