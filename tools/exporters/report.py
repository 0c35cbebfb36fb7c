"""The variant tables of export directories, as Markdown (for the README and the terminal)."""

from __future__ import annotations

from typing import Any

from exporters.manifest import wer_scale


def variant_table(manifest: dict[str, Any]) -> str:
    """WERs as fractions whatever unit the manifest recorded them in (older ones: percent)."""
    ref = manifest["reference"]
    scale = wer_scale(manifest)
    lines = [
        "| variant | size MB | load s | RTF | RTF (clip + tail) | max logit diff | WER vs PyTorch | "
        "WER vs text | drift |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| PyTorch (reference) | | | {ref['rtf']:.3f} | | | | {ref['wer_truth'] * scale:.3f} | |",
    ]
    for name, v in manifest["variants"].items():
        mark = " (default)" if name == manifest["default_variant"] else ""
        if "error" in v:
            lines.append(f"| {name} | failed: {v['error']} | | | | | | | |")
            continue
        lines.append(
            f"| {name}{mark} | {v['size_bytes'] / 1e6:.1f} | {v['load_s']:.2f} | {v['rtf']:.3f} | "
            f"{v['trimmed']['rtf']:.3f} | {v['max_logit_diff']:.2g} | {v['wer'] * scale:.3f} | "
            f"{v['wer_truth'] * scale:.3f} | {v['wer_drift'] * scale:+.3f} |")
    return "\n".join(lines)


def vocoder_table(manifest: dict[str, Any]) -> str:
    ref = manifest["reference"]
    lines = [
        "| variant | size MB | load s | RTF (windowed) | RTF (whole) | max diff | windowed diff | "
        "mel distance | round-trip WER | drift |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| original clips | | | | | | | | {manifest['clips_wer_truth']:.3f} | |",
        f"| PyTorch (reference) | | | {ref['rtf']:.3f} | | | | {ref['mel_distance']:.3f} | "
        f"{ref['wer_truth']:.3f} | |",
    ]
    for name, v in manifest["variants"].items():
        mark = " (default)" if name == manifest["default_variant"] else ""
        if "error" in v:
            lines.append(f"| {name} | failed: {v['error']} | | | | | | | | |")
            continue
        lines.append(
            f"| {name}{mark} | {v['size_bytes'] / 1e6:.1f} | {v['load_s']:.2f} | {v['rtf']:.3f} | "
            f"{v['rtf_whole']:.3f} | {v['max_abs_diff']:.2g} | {v['window_diff']:.2g} | "
            f"{v['mel_distance']:.3f} | {v['wer_truth']:.3f} | {v['wer_drift']:+.3f} |")
    return "\n".join(lines)
