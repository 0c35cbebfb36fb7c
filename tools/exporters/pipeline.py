"""The skeleton every `edge-export MODEL` follows; what differs per model comes in a `Kind`.

Derive each requested variant from fp32, load it and check its parity (a variant that fails
is recorded, not fatal; fp32 failing is), time every variant and PyTorch side by side, report
each, pick the default by measurement, and tell whether an export on disk is still this one.
The model's own steps (export, quantize its parts, load and measure) are the callables each
step is given.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from edge_agent.errors import ModelError, UsageError
from edge_agent.text.wer import UNIT as WER_UNIT
from exporters.manifest import MANIFEST, exporter_info, file_entry, one_line, read_manifest
from exporters.progress import Progress

log = logging.getLogger(__name__)

Loaded = TypeVar("Loaded")
In = TypeVar("In")
Out = TypeVar("Out")


@dataclass(frozen=True)
class Kind:
    """One exported model family: its manifest format, its variants and how one is chosen."""

    format: str
    """The manifest's `format`."""
    format_version: int
    variants: tuple[str, ...]
    """Every variant `--variants` may name."""
    package: Path
    """The model's exporter code, whose hash (with the shared steps') is the export's revision."""
    max_wer_drift: float
    """A variant may be the default only if its WER is at most this much (a fraction) above PyTorch's."""
    wer_name: str
    """What that WER is, in messages: `WER`, `round-trip WER`."""
    details: Callable[[dict[str, Any]], str]
    """A measured variant's own figures, for its report line (after its RTF)."""
    drift_key: str = "wer_drift"
    """The measured field `max_wer_drift` bounds: `wer_drift` (the drift itself) or a bound on it."""

    def parse_variants(self, text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
        unknown = [v for v in names if v not in self.variants]
        if unknown or not names:
            raise UsageError(f"--variants: unknown {', '.join(unknown) or 'empty list'} "
                             f"(choose from {', '.join(self.variants)})")
        return names

    def exporter_info(self) -> dict[str, str]:
        return exporter_info(self.package)

    def up_to_date(self, out_dir: Path, source_sha256: str, variants: Collection[str]) -> bool:
        """True if `out_dir` holds this source's export, with these variants, by this exporter code."""
        try:
            doc = read_manifest(out_dir)
        except ModelError:
            return False
        return (doc.get("format") == self.format and doc.get("format_version") == self.format_version
                and doc.get("source", {}).get("sha256") == source_sha256
                and doc.get("exporter", {}).get("revision") == self.exporter_info()["revision"]
                and set(doc.get("variants", {})) == set(variants))

    @property
    def default_rule(self) -> str:
        return f"lowest rtf among variants with {self.drift_key} <= {self.max_wer_drift}"

    def pick_default(self, variants: dict[str, dict[str, Any]]) -> str:
        """The fastest variant whose WER is at most `max_wer_drift` above PyTorch's (`drift_key`)."""
        usable = {n: v for n, v in variants.items()
                  if "error" not in v and v[self.drift_key] <= self.max_wer_drift}
        if not usable:
            raise ModelError(f"no variant keeps the {self.wer_name} within +{self.max_wer_drift} of "
                             "PyTorch's: see the measurements above")
        return min(usable, key=lambda n: usable[n]["rtf"])

    def report(self, progress: Progress, name: str, v: dict[str, Any]) -> None:
        if "error" in v:
            progress(f"  {name}: FAILED: {v['error']}")
            return
        judged = "" if self.drift_key == "wer_drift" else f", {self.drift_key} {v[self.drift_key]:+.3f}"
        progress(f"  {name}: {v['size_bytes'] / 1e6:.1f} MB, load {v['load_s']:.2f} s, RTF {v['rtf']:.3f}"
                 f"{self.details(v)}, {self.wer_name} {v['wer_truth']:.3f} "
                 f"(drift {v['wer_drift']:+.3f}{judged})")

    def head(self, source: dict[str, Any], **exporter: str) -> dict[str, Any]:
        """The manifest's first fields: format, when, by which code (plus `exporter`), from what."""
        return {"format": self.format, "format_version": self.format_version,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "exporter": {**self.exporter_info(), **exporter}, "source": source}

    def choose(self, stage: Path, variants: dict[str, dict[str, Any]], requested: Collection[str],
               progress: Progress) -> dict[str, Any]:
        """Report every variant, drop fp32 unless it was asked for, and pick the default by
        measurement; the manifest's fields that say so."""
        for name, variant in variants.items():
            self.report(progress, name, variant)
        if "fp32" not in requested:
            for f in variants.pop("fp32")["files"].values():
                (stage / f).unlink()
        default = self.pick_default(variants)
        progress(f"default variant: {default} (fastest with {self.drift_key} <= +{self.max_wer_drift})")
        return {"variants": variants, "default_variant": default, "default_rule": self.default_rule,
                "wer_unit": WER_UNIT}


def build_variants(stage: Path, requested: Sequence[str], *, files: Callable[[str], dict[str, str]],
                   mode: Callable[[str], str], derive: Callable[[str, dict[str, str]], None],
                   prepare: Callable[[str, dict[str, str]], tuple[Loaded, dict[str, Any]]],
                   checking: str, progress: Progress) -> tuple[dict[str, dict[str, Any]], dict[str, Loaded]]:
    """Derive each variant from fp32 (`derive`), load it and measure its parity (`prepare`).

    fp32 comes first, asked for or not: the others derive from it and it is measured as one.
    A variant that fails is recorded with its error and its files removed; fp32 failing is fatal.
    Returns each variant's manifest entry and, for those that load, what `prepare` loaded.
    """
    variants: dict[str, dict[str, Any]] = {}
    loaded: dict[str, Loaded] = {}
    for name in ("fp32", *[v for v in requested if v != "fp32"]):
        names = files(name)
        variants[name] = {"files": names, "mode": mode(name)}
        try:
            if name != "fp32":
                derive(name, names)
            with progress.step(f"loading {name} and checking {checking} parity"):
                loaded[name], measured = prepare(name, names)
            variants[name] |= measured
        except Exception as exc:  # a variant that fails is recorded, not fatal
            log.debug("variant %s failed:\n%s", name, traceback.format_exc())
            variants[name] |= {"files": {}, "error": one_line(exc)}
            for f in names.values():
                (stage / f).unlink(missing_ok=True)
            if name == "fp32":
                raise ModelError(f"fp32 export does not run: {one_line(exc)}") from exc
    return variants, loaded


def time_side_by_side(contenders: dict[str, Callable[[In], Out]], inputs: Sequence[In], repeats: int,
                      once: Collection[str] = ("pytorch",),
                      ) -> tuple[dict[str, list[float]], dict[str, list[Out]]]:
    """The best time of every contender on every input, and its output, interleaved input by input.

    The machine may be shared: interleaving spreads any slowdown over all contenders alike,
    and the best of `repeats` runs per input discards one-off stalls. Those in `once` (PyTorch:
    slow) run in the first pass only.
    """
    best = {name: [float("inf")] * len(inputs) for name in contenders}
    outputs: dict[str, list[Out]] = {name: [] for name in contenders}
    for repeat in range(repeats):
        for i, item in enumerate(inputs):
            for name, run in contenders.items():
                if name in once and repeat > 0:
                    continue
                started = time.perf_counter()
                out = run(item)
                best[name][i] = min(best[name][i], time.perf_counter() - started)
                if repeat == 0:
                    outputs[name].append(out)
                else:
                    outputs[name][i] = out
    return best, outputs


def files_of(stage: Path) -> dict[str, dict[str, Any]]:
    """The manifest's `files`: every file of the export but the manifest itself, hashed."""
    return {p.name: file_entry(p) for p in sorted(stage.iterdir()) if p.name != MANIFEST}
