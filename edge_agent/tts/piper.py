"""Piper-format VITS voices on onnxruntime, phonemized offline by espeak-ng."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.errors import ModelError
from edge_agent.runtime import make_session
from edge_agent.tts.normalize import normalize
from edge_agent.tts.sentences import split_sentences
from edge_agent.tts.voice import Samples

log = logging.getLogger(__name__)

_BOS, _EOS, _PAD = "^", "$", "_"


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
    """A loaded Piper voice. `synthesize_sentence` yields float32 audio."""

    def __init__(self, voice_id: str, session: Any, config: PiperConfig,
                 length_scale: float | None = None) -> None:
        self.id = voice_id
        self.sample_rate = config.sample_rate
        self.config = config
        self._session = session
        self._scales = np.array(
            [config.noise_scale, length_scale or config.length_scale, config.noise_w],
            dtype=np.float32,
        )

    @staticmethod
    def load(voice_id: str, model: Path, config: Path | None = None, *, threads: int = 2,
             length_scale: float | None = None) -> PiperVoice:
        cfg = PiperConfig.load(config or model.with_name(model.name + ".json"))
        return PiperVoice(voice_id, make_session(model, threads), cfg, length_scale)

    def sentences(self, text: str) -> list[str]:
        return split_sentences(normalize(text))

    def phoneme_ids(self, sentence: str) -> list[list[int]]:
        """Phoneme ids per espeak sentence (espeak may split further than we did)."""
        from piper_phonemize import phonemize_espeak

        id_map = self.config.phoneme_id_map
        result = []
        for phonemes in phonemize_espeak(sentence, self.config.espeak_voice):
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

    def synthesize_ids(self, ids: list[int]) -> Samples:
        inputs = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": self._scales,
        }
        if self.config.num_speakers > 1:
            inputs["sid"] = np.zeros(1, dtype=np.int64)
        audio: Samples = self._session.run(None, inputs)[0].reshape(-1)
        return np.clip(audio, -1.0, 1.0).astype(np.float32, copy=False)

    def synthesize_sentence(self, sentence: str) -> Iterator[Samples]:
        for ids in self.phoneme_ids(sentence):
            yield self.synthesize_ids(ids)

    def close(self) -> None:
        self._session = None
