"""The variant tables of export directories, as Markdown (for the README and the terminal)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporters.manifest import wer_scale


def variant_table(manifest: dict[str, Any]) -> str:
    """WERs as fractions whatever unit the manifest recorded them in (older ones: percent)."""
    ref = manifest["reference"]
    scale = wer_scale(manifest)
    columns = ["size MB", "load s", "RTF", "RTF (clip + tail)", "max logit diff", "WER vs PyTorch",
               "WER vs text", "drift"]
    reference = f"| PyTorch (reference) | | | {ref['rtf']:.3f} | | | | {ref['wer_truth'] * scale:.3f} | |"

    def cells(v: dict[str, Any]) -> str:
        return (f"{v['size_bytes'] / 1e6:.1f} | {v['load_s']:.2f} | {v['rtf']:.3f} | "
                f"{v['trimmed']['rtf']:.3f} | {v['max_logit_diff']:.2g} | {v['wer'] * scale:.3f} | "
                f"{v['wer_truth'] * scale:.3f} | {v['wer_drift'] * scale:+.3f}")

    if "sweep" not in ref:  # exports before the default was chosen on the sweep
        return _table(manifest, columns, [reference], cells)
    sweep = ref["sweep"]
    columns = [*columns, f"sweep WER ({sweep['clips']} clips)", "sweep drift", "drift bound (95 %)"]
    return _table(manifest, columns, [f"{reference} {sweep['wer']:.3f} | | |"],
                  lambda v: f"{cells(v)} | {v['sweep']['wer']:.3f} | {v['sweep']['drift']:+.3f} | "
                            f"{v['sweep']['drift_bound']:+.3f}")


def vocoder_table(manifest: dict[str, Any]) -> str:
    ref = manifest["reference"]
    return _table(
        manifest, ["size MB", "load s", "RTF (windowed)", "RTF (whole)", "max diff", "windowed diff",
                   "mel distance", "round-trip WER", "drift"],
        [f"| original clips | | | | | | | | {manifest['clips_wer_truth']:.3f} | |",
         f"| PyTorch (reference) | | | {ref['rtf']:.3f} | | | | {ref['mel_distance']:.3f} | "
         f"{ref['wer_truth']:.3f} | |"],
        lambda v: f"{v['size_bytes'] / 1e6:.1f} | {v['load_s']:.2f} | {v['rtf']:.3f} | "
                  f"{v['rtf_whole']:.3f} | {v['max_abs_diff']:.2g} | {v['window_diff']:.2g} | "
                  f"{v['mel_distance']:.3f} | {v['wer_truth']:.3f} | {v['wer_drift']:+.3f}")


def _table(manifest: dict[str, Any], columns: list[str], references: list[str],
           cells: Callable[[dict[str, Any]], str]) -> str:
    """A row per variant after the `references` rows: its `cells`, or why it failed; the default marked."""
    lines = ["| variant | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns), *references]
    for name, v in manifest["variants"].items():
        if "error" in v:
            lines.append(f"| {name} | failed: {v['error']} |" + " |" * (len(columns) - 1))
            continue
        mark = " (default)" if name == manifest["default_variant"] else ""
        lines.append(f"| {name}{mark} | {cells(v)} |")
    return "\n".join(lines)
