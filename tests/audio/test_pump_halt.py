"""`Pump.halt` (the mute) closes a recording command at once, even while the stage is busy with a
block (Whisper decoding, say) and the reader is not reading: a real command, a real process group."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from edge_agent.audio.frames import Samples
from edge_agent.audio.pump import Pump
from edge_agent.audio.sources import CommandSource
from tests.waiting import wait_until

RECORDER = '''
import os, signal, sys, time
closed = sys.argv[1]
def bye(*_):
    with open(closed, "w") as fh:
        fh.write(repr(time.monotonic()))
    os._exit(0)
signal.signal(signal.SIGTERM, bye)
while True:
    try:
        os.write(1, bytes(3200))
    except OSError:
        bye()
    time.sleep(0.1)
'''


class BusyStage:
    """Takes its first block and then works on it until `release` (or 30 s)."""

    def __init__(self) -> None:
        self.busy = threading.Event()
        self.release = threading.Event()

    def push(self, block: Samples) -> list[int]:
        self.busy.set()
        self.release.wait(30)
        return []

    def flush(self) -> list[int]:
        return []


def test_a_halt_stops_the_recording_command_while_the_stage_is_still_busy(tmp_path: Path) -> None:
    script, closed = tmp_path / "recorder.py", tmp_path / "closed"
    script.write_text(RECORDER)
    source = CommandSource(f"{sys.executable} {script} {closed}")
    stage = BusyStage()
    pump = Pump(source, stage).start(lambda _: None)
    try:
        assert stage.busy.wait(10), "no block reached the stage"
        halted = time.monotonic()
        pump.halt()
        wait_until(closed.exists, timeout=10, what="the recorder to be stopped")
        took = float(closed.read_text()) - halted
        assert took < 2.0, f"stopped {took:.2f} s after the halt, not at once"
        assert stage.release.is_set() is False  # the stage was still busy when the command stopped
    finally:
        stage.release.set()
        pump.stop()
    assert not pump.running
