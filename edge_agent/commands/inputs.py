"""The audio a verb is named on its command line (`listen --input`, `transcribe FILE`): a WAV file's
path, or '-' for raw PCM on standard input, which carries no format and so is read at `--rate` and
`--channels`."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from edge_agent.audio.settings import AudioSettings
from edge_agent.audio.sources import AudioSource, WavFileSource, open_pcm_stdin, open_source
from edge_agent.errors import UsageError


def add_raw_pcm_arguments(parser: argparse.ArgumentParser) -> None:
    """`--rate` and `--channels`: the format raw PCM on standard input is taken for."""
    parser.add_argument("--rate", type=int, default=16000,
                        help="sample rate of raw PCM on stdin (Hz; default 16000: say so for other rates)")
    parser.add_argument("--channels", type=int, default=1, help="channels of raw PCM on stdin (default 1)")


def open_named(name: str, rate: int, channels: int, configured: AudioSettings | None = None) -> AudioSource:
    """`name` opened: '-' raw PCM on standard input at `rate` Hz and `channels`, else a WAV file.

    Bad input fails here, before any model is loaded. With `configured`, the file is opened as the
    configured input is (`audio.sources.open_source`), so its channels meet the device's beamformer.
    """
    if name == "-":
        return open_pcm_stdin(rate, channels)
    path = Path(name)
    if path.is_dir():
        raise UsageError(f"{path}: is a directory")
    if configured is not None:
        return open_source(replace(configured, input_file=path, input_pipe=None, input_command=None))
    return WavFileSource(path)
