"""Exporter fixtures: the real test clips, a tiny random Whisper, the real tiny.en export (once per run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from benchmarks.clips import Clip, clip_set, sweep_set
from edge_agent.models import ModelStore, load_catalog
from exporters.progress import Progress


@pytest.fixture(scope="session")
def store(shared_cache: Path) -> ModelStore:
    return ModelStore(shared_cache, load_catalog())


@pytest.fixture(scope="session")
def clips(shared_cache: Path, store: ModelStore) -> list[Clip]:
    return clip_set(store)


def _tiny_whisper(seed: int = 0) -> object:
    from whisper.model import ModelDimensions, Whisper

    torch.manual_seed(seed)
    dims = ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=32, n_audio_head=2, n_audio_layer=2,
                           n_vocab=51864, n_text_ctx=64, n_text_state=32, n_text_head=2, n_text_layer=2)
    model = Whisper(dims).eval()
    with torch.no_grad():  # openai-whisper allocates this one with torch.empty
        model.decoder.positional_embedding.normal_(0, 0.02)
    return model


@pytest.fixture(scope="session")
def tiny_whisper() -> object:
    """Factory: a randomly initialised two-layer Whisper with the real English vocabulary size."""
    return _tiny_whisper


@pytest.fixture(scope="session")
def tiny_en_dir(store: ModelStore) -> Path:
    return store.fetch("whisper-tiny.en").path("model.bin").parent


@pytest.fixture(scope="session")
def tiny_en_model(tiny_en_dir: Path) -> object:
    from exporters.whisper.reference import load_model

    return load_model(tiny_en_dir)


@pytest.fixture(scope="session")
def tiny_en_export(shared_cache: Path, store: ModelStore, clips: list[Clip]) -> Path:
    """The real tiny.en export, made once and reused while the source sha256 is unchanged."""
    from exporters.verify import verify_dir
    from exporters.whisper.pipeline import ExportOptions, export_whisper, resolve_source, up_to_date

    progress = Progress(quiet=True)
    source = resolve_source("whisper-tiny.en", store, progress)
    out = shared_cache / "exported-tests" / f"tiny.en-{source.sha256[:16]}"
    options = ExportOptions(variants=("fp32", "int8", "fp16", "int4"))
    if not (up_to_date(out, source, options) and not verify_dir(out, 2, progress)):
        shutil.rmtree(out, ignore_errors=True)
        export_whisper(source, out, clips, options, progress, choice=sweep_set(store))
    return out


UNIVERSAL_CLIPS = 2
"""Clips in the test run's round trip: the first espeak and Piper commands (the CLI takes them all)."""


@pytest.fixture(scope="session")
def universal_export(shared_cache: Path, store: ModelStore, clips: list[Clip], tiny_en_export: Path) -> Path:
    """The real universal HiFi-GAN export (fp32, fp16), made once and reused while its source is unchanged."""
    from exporters.verify import verify_dir
    from exporters.vocoder.hifigan import load_generator, resolve_source
    from exporters.vocoder.pipeline import ExportOptions, export_vocoder, up_to_date
    from exporters.vocoder.transcriber import asr_for_round_trip

    progress = Progress(quiet=True)
    source = resolve_source("hifigan-universal", store, progress)
    out = shared_cache / "exported-tests" / f"hifigan-universal-{source.sha256[:16]}"
    options = ExportOptions(variants=("fp32", "fp16"), parity_clips=(0,), load_repeats=1, timing_repeats=1)
    if not (up_to_date(out, source, options) and not verify_dir(out, 2, progress)):
        shutil.rmtree(out, ignore_errors=True)
        generator, config = load_generator(source)
        transcribe, asr = asr_for_round_trip(tiny_en_export, 2)
        subset = clips[:UNIVERSAL_CLIPS]
        assert {c.engine for c in subset} == {"espeak", "piper"}
        export_vocoder(source, out, subset, generator=generator, config=config, transcribe=transcribe,
                       asr=asr, options=options, progress=progress)
    return out
