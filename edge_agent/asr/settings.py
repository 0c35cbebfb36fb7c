"""Speech recognition settings (`asr.*`): the Whisper export, decoding, threads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class AsrSettings:
    """Speech recognition: Whisper exported to ONNX by `edge-export whisper`."""

    model: str = "whisper-tiny.en"
    """Source model id (its export lives in `<models.cache_dir>/exported/<id>/`) or an export directory."""
    variant: str = ""
    """Exported variant (fp32, int8, fp16, int4, int8-static); empty uses the manifest's default."""
    threads: int = 2
    """onnxruntime intra-op threads for the encoder."""
    decoder_threads: int = 1
    """onnxruntime intra-op threads for the decoder (one token at a time: a second thread costs more
    in hand-offs than it saves; tiny.en int8, interleaved: 8.3 vs 11.5 ms a token, fp32 15.4 vs 19.8)."""
    language: str = "en"
    """Spoken language for multilingual models (ignored by English-only ones)."""
    max_tokens: int = 96
    """Most tokens decoded per utterance (a 20 s command needs far fewer)."""
    beam_size: int = 5
    """Hypotheses kept while decoding: 5 is Whisper's and faster-whisper's beam search, all of them
    decoded in one batched call per token; 1 is greedy (bench wyoming, 20 commands at a load of
    about 10: WER 0.077 at beam 5 vs 0.100 greedy with int8, at 0.37 vs 0.40 of
    wyoming-faster-whisper's latency)."""
    padding: Literal["bucket", "full"] = "bucket"
    """full: pad every utterance to Whisper's 30 s window; bucket: to speech + margin, rounded up."""
    bucket_s: float = 2.0
    """With `bucket` padding: encoder input lengths are multiples of this."""
    margin_s: float = 5.0
    """With `bucket` padding: silence always added after the speech before rounding up (Whisper
    needs seconds of trailing silence to end cleanly; less makes it repeat itself)."""
    retry_logprob: float = -0.35
    """With `bucket` padding: a result whose tokens average a log-probability below this is decoded
    again in Whisper's own 30 s window, and that result is kept (a short window loses or mishears
    words the model is unsure of). On the exporter's 176 sweep clips (int8, beam 5) -0.6 cost WER
    0.135 against the 30 s window's 0.116, -0.45 0.126, -0.35 0.116, for 29 % more decoding time."""
    retry_window_s: float = 30.0
    """With `bucket` padding: the window a degenerate or unsure result is decoded again in (30 s where
    the utterance's own bucket is already as long), 10..30 s. The encoder's working memory grows with
    the window (tiny.en int8: about 16 MB at 10 s, 31 MB at 20 s, 46 MB at 30 s), and this decode
    sets a listening device's peak memory: 323 MB at 30 s, 305 MB at 20 s (`benchmarks.rss --wake`).
    Shorter than Whisper's own 30 s costs words: on the exporter's 176 sweep clips WER 0.116 at 30 s,
    0.131 at 20 s, 0.128 at 16 s."""
    no_speech_threshold: float = 0.6
    """Drop an utterance whose no-speech probability is above this and whose tokens are unsure."""
    min_avg_logprob: float = -1.5
    """Drop an utterance whose tokens average a log-probability below this (noise Whisper made words of)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: must name a model id or an export directory")
        if self.threads < 1:
            raise ValueError(f"threads: must be at least 1, not {self.threads}")
        if self.decoder_threads < 1:
            raise ValueError(f"decoder_threads: must be at least 1, not {self.decoder_threads}")
        if not 1 <= self.max_tokens <= 224:
            raise ValueError(f"max_tokens: {self.max_tokens} is outside 1..224")
        if not 1 <= self.beam_size <= 16:
            raise ValueError(f"beam_size: {self.beam_size} is outside 1..16")
        if not 0.5 <= self.bucket_s <= 30.0:
            raise ValueError(f"bucket_s: {self.bucket_s} is outside 0.5..30")
        if not 0.0 <= self.margin_s <= 10.0:
            raise ValueError(f"margin_s: {self.margin_s} is outside 0..10")
        if not 10.0 <= self.retry_window_s <= 30.0:
            raise ValueError(f"retry_window_s: {self.retry_window_s} is outside 10..30")
        if self.retry_logprob > 0:
            raise ValueError(f"retry_logprob: {self.retry_logprob} is a log-probability, at most 0")
        if not 0.0 < self.no_speech_threshold <= 1.0:
            raise ValueError(f"no_speech_threshold: {self.no_speech_threshold} is outside 0..1")
        if self.min_avg_logprob > 0:
            raise ValueError(f"min_avg_logprob: {self.min_avg_logprob} is a log-probability, at most 0")
