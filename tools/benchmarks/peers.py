"""The peers' environment: the community servers and piper-tts, in a virtual environment of their own.

wyoming-piper pulls piper-tts, GPL-3.0, which edge-speech never imports: `bench wyoming` runs the
peers as processes of this environment and `bench tts` runs piper-tts's command line from it. It is
built on first use with pip from PyPI, under the bench cache (`<cache>/bench-peers/venv`) unless
`--peers-venv` names another.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from edge_agent.commands.context import Context

# piper-tts pinned: wyoming-piper takes any 1.x, and `bench tts` names the version it compares with.
PEERS = ("wyoming-piper==2.5.2", "piper-tts==1.8.0", "wyoming-faster-whisper==3.8.1")


def peers_python(ctx: Context, args: argparse.Namespace) -> Path:
    """The peers' interpreter, building their virtual environment first if needed."""
    venv = args.peers_venv or ctx.settings.models.cache_dir.parent / "bench-peers" / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"building the peers' environment in {venv} (pip install {' '.join(PEERS)}) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEERS], check=True)
    return python
