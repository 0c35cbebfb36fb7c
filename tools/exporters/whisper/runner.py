"""Run an exported encoder/decoder pair with onnxruntime: greedy decoding and teacher forcing.

This is the exporter's own measuring stick (parity, WER, RTF), written against the
format in FORMAT.md with nothing but numpy and onnxruntime.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_agent.asr.features import Features
from edge_agent.runtime.sessions import make_session


@dataclass(frozen=True)
class DecodeConfig:
    """What greedy decoding needs from the manifest."""

    eot: int
    sot_sequence: tuple[int, ...]
    suppress_tokens: tuple[int, ...]
    begin_suppress_tokens: tuple[int, ...]
    n_text_layer: int
    n_text_state: int
    max_tokens: int

    @staticmethod
    def from_manifest(manifest: dict[str, Any], max_tokens: int | None = None) -> DecodeConfig:
        dims, tokens = manifest["dims"], manifest["special_tokens"]
        return DecodeConfig(
            eot=tokens["eot"], sot_sequence=tuple(tokens["sot_sequence"]),
            suppress_tokens=tuple(manifest["suppress_tokens"]),
            begin_suppress_tokens=tuple(manifest["begin_suppress_tokens"]),
            n_text_layer=dims["n_text_layer"], n_text_state=dims["n_text_state"],
            max_tokens=max_tokens or dims["n_text_ctx"] // 2,
        )


class OnnxWhisper:
    """An encoder and a decoder session; `threads` intra-op threads each."""

    def __init__(self, encoder: Path, decoder: Path, config: DecodeConfig, threads: int = 2) -> None:
        started = time.perf_counter()
        self.encoder = make_session(encoder, threads)
        self.decoder = make_session(decoder, threads)
        self.load_s = time.perf_counter() - started
        self.config = config
        self.record: list[dict[str, npt.NDArray[Any]]] | None = None
        """When a list, every decoder feed is appended to it (calibration data)."""

    def encode(self, mel: Features) -> tuple[Features, Features]:
        """Cross-attention K and V for mel [n_mels, n_frames]."""
        k, v = self.encoder.run(None, {"mel": mel[None].astype(np.float32)})
        return k, v

    def _empty_cache(self) -> tuple[Features, Features]:
        c = self.config
        empty = np.zeros((c.n_text_layer, 1, 0, c.n_text_state), dtype=np.float32)
        return empty, empty

    def _step(self, tokens: list[int], cache: tuple[Features, Features], cross: tuple[Features, Features],
              ) -> tuple[Features, tuple[Features, Features]]:
        feed: dict[str, npt.NDArray[Any]] = {
            "tokens": np.array([tokens], dtype=np.int64),
            "self_k_in": cache[0], "self_v_in": cache[1],
            "cross_k": cross[0], "cross_v": cross[1],
            "offset": np.array(cache[0].shape[2], dtype=np.int64),
        }
        if self.record is not None:
            self.record.append(feed)
        logits, k, v = self.decoder.run(None, feed)
        return logits[0], (k, v)

    def decode(self, mel: Features, max_tokens: int | None = None) -> list[int]:
        """Greedy text tokens, with Whisper's default token suppression; at most `max_tokens`
        (default: the config's)."""
        c = self.config
        cross = self.encode(mel)
        suppress = np.array(c.suppress_tokens, dtype=np.int64)
        begin = np.array(c.begin_suppress_tokens, dtype=np.int64)
        logits, cache = self._step(list(c.sot_sequence), self._empty_cache(), cross)
        out: list[int] = []
        for step in range(max_tokens or c.max_tokens):
            last = logits[-1].copy()
            last[suppress] = -np.inf
            if step == 0:
                last[begin] = -np.inf
            token = int(last.argmax())
            if token == c.eot:
                break
            out.append(token)
            logits, cache = self._step([token], cache, cross)
        return out

    def teacher_forced_logits(self, mel: Features, tokens: list[int]) -> Features:
        """Logits [len(tokens), n_vocab]: the prompt in one call, then one token per call."""
        cross = self.encode(mel)
        n0 = len(self.config.sot_sequence)
        logits, cache = self._step(tokens[:n0], self._empty_cache(), cross)
        rows = [logits]
        for token in tokens[n0:]:
            logits, cache = self._step([token], cache, cross)
            rows.append(logits)
        return np.concatenate(rows)
