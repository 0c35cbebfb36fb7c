"""Speech synthesis settings (`tts.*`): the voice, threads, speed, idle unloading."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TtsSettings:
    """Local text-to-speech."""

    voice: str = "en_US-joe-medium"
    """Default voice id (see `edge-agent models list`)."""
    threads: int = 2
    """Cores for synthesis: onnxruntime intra-op threads, or as many single-threaded workers
    (a split Piper voice's vocoder windows and next-sentence fronts)."""
    idle_unload_s: float = 600.0
    """Unload a voice after this many seconds unused; 0 keeps voices loaded."""
    sentence_silence_s: float = 0.2
    """Silence inserted between sentences."""
    length_scale: float | None = None
    """Speaking rate override (larger is slower); None uses the voice's own."""
    noise_scale: float | None = None
    """Piper: how much each take of the voice varies (piper's `--noise-scale`); None uses the voice's
    own, 0 (with `noise_w` 0) makes every take of a text the same samples."""
    noise_w: float | None = None
    """Piper: how much phoneme lengths vary between takes (piper's `--noise-w`); None uses the voice's own."""
    stream_vocoder: bool = True
    """Split Piper voices at the latent and decode the vocoder in windows (first audio sooner)."""

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads: must be at least 1, not {self.threads}")
        if self.idle_unload_s < 0 or self.sentence_silence_s < 0:
            raise ValueError("idle_unload_s and sentence_silence_s must not be negative")
        if self.length_scale is not None and not 0.2 <= self.length_scale <= 5.0:
            raise ValueError(f"length_scale: {self.length_scale} is outside 0.2..5")
        for name, scale in (("noise_scale", self.noise_scale), ("noise_w", self.noise_w)):
            if scale is not None and not 0.0 <= scale <= 2.0:
                raise ValueError(f"{name}: {scale} is outside 0..2")
