"""Benchmarks behind `edge-agent bench`: ours against a reference, side by side in one run."""
