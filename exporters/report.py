"""The variant table of an export directory, as Markdown (for the README and the terminal)."""

from __future__ import annotations

from typing import Any


def variant_table(manifest: dict[str, Any]) -> str:
    ref = manifest["reference"]
    lines = [
        "| variant | size MB | load s | RTF | RTF (clip + tail) | max logit diff | WER vs PyTorch | "
        "WER vs text | drift |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| PyTorch (reference) | | | {ref['rtf']:.3f} | | | | {ref['wer_truth']:.1f} | |",
    ]
    for name, v in manifest["variants"].items():
        mark = " (default)" if name == manifest["default_variant"] else ""
        if "error" in v:
            lines.append(f"| {name} | failed: {v['error']} | | | | | | | |")
            continue
        lines.append(
            f"| {name}{mark} | {v['size_bytes'] / 1e6:.1f} | {v['load_s']:.2f} | {v['rtf']:.3f} | "
            f"{v['trimmed']['rtf']:.3f} | {v['max_logit_diff']:.2g} | {v['wer']:.1f} | "
            f"{v['wer_truth']:.1f} | {v['wer_drift']:+.1f} |")
    return "\n".join(lines)
