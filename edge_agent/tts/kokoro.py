"""Kokoro-82M (int8 ONNX) voices: espeak-ng phonemes through the model's vocabulary.

The model takes `tokens` [1, n] (ids from `vocab.json`, padded with 0 on both
sides), `style` [1, 256] (row `n` of the voice pack: the style depends on the
utterance length) and `speed` [1]; it returns 24 kHz float audio. Its batch
dimension is fixed at 1, so a server runs sentences concurrently, not batched
(see `edge_agent.offload.server.scheduler`).

Variants: the model's `.onnx` files are its variants, chosen at load by the
providers (`variant_for`): int8 for the CPU, where its integer kernels are
fastest; fp16, then fp32, where CUDA or TensorRT leads the list (onnxruntime's
CUDA provider has no kernel for much of the int8 graph, which then runs on the
CPU one op at a time), falling back to int8 with a warning when the catalog has
no float variant. Runs go through IO binding: outputs are allocated by the
provider that computes them (on a GPU they stay there until read).

Speakers: a voice id `kokoro-82m:<speaker>` picks a style pack; `kokoro-82m` alone is
the configured default speaker. The Japanese packs come with the model
(`voices_ja.npz`), the English ones (`af_heart`, `bm_george`, ...) are the model
`kokoro-82m-voices-en` (one raw float32 510 x 256 file per speaker). Every speaker
of one model shares one onnxruntime session: a speaker costs its 0.5 MB of styles.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_agent.audio.frames import Samples
from edge_agent.errors import ModelError
from edge_agent.runtime.providers import CPU, Accelerator, Profile
from edge_agent.runtime.sessions import make_session
from edge_agent.text.normalize import normalize
from edge_agent.tts.phonemes import cut_at, espeak_phonemes
from edge_agent.tts.sentences import split_sentences

log = logging.getLogger(__name__)

SAMPLE_RATE = 24000
ESPEAK_VOICE = "en-us"
_PAD = 0
ENGLISH_SPEAKERS = "kokoro-82m-voices-en"
"""Catalog id of the English style packs."""
STYLE_DIM = 256


class KokoroVoice:
    """A loaded Kokoro voice with one speaker's style pack."""

    sample_rate = SAMPLE_RATE

    def __init__(self, voice_id: str, session: Any, vocab: dict[str, int],
                 styles: npt.NDArray[np.float32], *, speed: float = 1.0,
                 espeak_voice: str = ESPEAK_VOICE, variant: str = "") -> None:
        self.id = voice_id
        self._session = session
        self.variant = variant
        """The model file this voice runs (`kokoro-v1.0.int8.onnx`)."""
        self.vocab = vocab
        self._styles = styles
        self.max_tokens = styles.shape[0] - 1
        """Longest token sequence (without pads) one model call takes."""
        self._speed = np.array([speed], dtype=np.float32)
        self.espeak_voice = espeak_voice

    @staticmethod
    def load(voice_id: str, model: Path, vocab: Path, styles: npt.NDArray[np.float32], *,
             threads: int = 1, speed: float = 1.0, spin: bool = True,
             accel: Accelerator = CPU) -> KokoroVoice:
        table = load_vocab(vocab)
        longest = styles.shape[0] + 1  # max_tokens and the two pads

        def shapes(tokens: int) -> dict[str, tuple[int, ...]]:
            return {"tokens": (1, tokens), "style": (1, styles.shape[-1]), "speed": (1,)}

        session = make_session(model, threads, spin=spin, accel=accel,
                               profile=Profile(shapes(3), shapes(64), shapes(longest)))
        return KokoroVoice(voice_id, session, table, styles, speed=speed, variant=model.name)

    def with_speaker(self, voice_id: str, styles: npt.NDArray[np.float32]) -> KokoroVoice:
        """The same model (one session) speaking with another style pack."""
        if self._session is None:
            raise ModelError(f"{self.id}: closed")
        return KokoroVoice(voice_id, self._session, self.vocab, styles, speed=float(self._speed[0]),
                           espeak_voice=self.espeak_voice, variant=self.variant)

    def sentences(self, text: str) -> list[str]:
        return split_sentences(normalize(text))

    def phoneme_ids(self, sentence: str) -> list[list[int]]:
        """Token ids per model call (espeak sentences joined up to `max_tokens`)."""
        calls: list[list[int]] = []
        current: list[int] = []
        space = self.vocab.get(" ")
        for phonemes in espeak_phonemes(sentence, self.espeak_voice):
            ids = [self.vocab[p] for p in phonemes if p in self.vocab]
            for piece in cut_at(ids, self.max_tokens, space):
                joined = [*current, space, *piece] if current and space is not None else [*current, *piece]
                if len(joined) <= self.max_tokens:
                    current = joined
                else:
                    calls.append(current)
                    current = piece
        if current:
            calls.append(current)
        return [c for c in calls if c]

    def synthesize_ids(self, ids: list[int]) -> Samples:
        if not 0 < len(ids) <= self.max_tokens:
            raise ValueError(f"{len(ids)} tokens: Kokoro takes 1..{self.max_tokens}")
        session = self._session
        if session is None:
            raise ModelError(f"{self.id}: closed")
        # IO binding: the inputs are bound as they are (host memory, copied once to a device
        # where there is one) and the output is allocated by the provider that computes it.
        binding = session.io_binding()
        binding.bind_cpu_input("tokens", np.array([[_PAD, *ids, _PAD]], dtype=np.int64))
        binding.bind_cpu_input("style", np.ascontiguousarray(self._styles[len(ids)]))
        binding.bind_cpu_input("speed", self._speed)
        binding.bind_output(session.get_outputs()[0].name)
        session.run_with_iobinding(binding)
        audio: Samples = binding.copy_outputs_to_cpu()[0].reshape(-1)
        return np.clip(audio, -1.0, 1.0).astype(np.float32, copy=False)

    def sessions(self) -> dict[str, Any]:
        return {"model": self._session}

    def synthesize_sentence(self, sentence: str) -> Iterator[Samples]:
        for ids in self.phoneme_ids(sentence):
            yield self.synthesize_ids(ids)

    def close(self) -> None:
        self._session = None


def load_vocab(path: Path) -> dict[str, int]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        table = doc["vocab"] if isinstance(doc, dict) and "vocab" in doc else doc
        vocab = {str(k): int(v) for k, v in table.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelError(f"{path}: not a Kokoro vocabulary ({exc})") from None
    if not vocab:
        raise ModelError(f"{path}: empty Kokoro vocabulary")
    return vocab


def load_styles(path: Path, speaker: str) -> npt.NDArray[np.float32]:
    try:
        with np.load(path, allow_pickle=False) as pack:
            known = sorted(pack.files)
            if speaker not in known:
                raise ModelError(f"{path}: no speaker {speaker!r} (known: {', '.join(known)})")
            styles = np.asarray(pack[speaker], dtype=np.float32)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: not a Kokoro voice pack ({exc})") from None
    if styles.ndim != 3 or styles.shape[1:] != (1, 256) or styles.shape[0] < 2:
        raise ModelError(f"{path}: speaker {speaker!r} has style shape {styles.shape}, "
                         "expected (n, 1, 256)")
    return styles


def load_style_file(path: Path) -> npt.NDArray[np.float32]:
    """One speaker's style pack as a raw little-endian float32 file of n x 256 values."""
    try:
        raw = np.fromfile(path, dtype="<f4")
    except OSError as exc:
        raise ModelError(f"{path}: cannot read the style pack ({exc})") from None
    if raw.size < 2 * STYLE_DIM or raw.size % STYLE_DIM:
        raise ModelError(f"{path}: {raw.size} values is not a Kokoro style pack (n x {STYLE_DIM})")
    return raw.astype(np.float32).reshape(-1, 1, STYLE_DIM)


def speaker_styles(store: Any, speaker: str, packs: Path) -> npt.NDArray[np.float32]:
    """`speaker`'s styles: an English pack (fetched as its own model) or one of the model's own."""
    english = store.catalog.get(ENGLISH_SPEAKERS) if ENGLISH_SPEAKERS in store.catalog.ids() else None
    if english is not None and f"{speaker}.bin" in {f.name for f in english.files}:
        return load_style_file(store.require(ENGLISH_SPEAKERS).path(f"{speaker}.bin"))
    try:
        return load_styles(packs, speaker)
    except ModelError as exc:
        if english is None or "no speaker" not in str(exc):
            raise
        extra = ", ".join(f.name.removesuffix(".bin") for f in english.files)
        raise ModelError(f"{exc}; English ({ENGLISH_SPEAKERS}): {extra}") from None


FLOAT_VARIANTS = ("fp16", "fp32")
"""Preferred on a GPU, in this order (a file name containing the tag)."""


def variant_for(models: list[str], accel: Accelerator) -> str:
    """The model file (of a model's `.onnx` files) to run on `accel`'s providers: int8 for the CPU,
    a float variant (fp16, then fp32) when CUDA or TensorRT leads, else what there is, warned."""
    if not models:
        raise ModelError("kokoro: the model has no .onnx file")
    gpu = accel.names[0] in ("cuda", "tensorrt")
    preferred = [*FLOAT_VARIANTS, "int8"] if gpu else ["int8", "fp32", "fp16"]
    for tag in preferred:
        for name in models:
            if tag in name:
                if gpu and tag == "int8":
                    log.warning("kokoro: no fp16 or fp32 variant in the catalog; %s runs %s, whose integer "
                                "kernels onnxruntime's %s provider mostly leaves to the CPU", accel.names[0],
                                name, accel.names[0])
                return name
    return models[0]


def loader(store: Any, *, speaker: str, threads: int, spin: bool = True, accel: Accelerator = CPU) -> Any:
    """A `VoiceRegistry` loader for `kokoro-82m` and `kokoro-82m:<speaker>` (`speaker` when none is named).

    The first voice loaded for a model opens its session; later speakers share it.
    """
    sessions: dict[str, KokoroVoice] = {}
    lock = threading.Lock()

    def load(voice_id: str) -> KokoroVoice:
        model_id, _, named = voice_id.partition(":")
        files = store.require(model_id)
        styles = speaker_styles(store, named or speaker, files.path("voices_ja.npz"))
        with lock:
            first = sessions.get(model_id)
            if first is not None and first.sessions()["model"] is not None:
                return first.with_speaker(voice_id, styles)
            model = variant_for([f.name for f in files.entry.files if f.name.endswith(".onnx")], accel)
            log.info("%s: variant %s for providers %s", model_id, model, ", ".join(accel.names))
            voice = KokoroVoice.load(voice_id, files.path(model), files.path("vocab.json"), styles,
                                     threads=threads, spin=spin, accel=accel)
            sessions[model_id] = voice
            return voice

    return load
