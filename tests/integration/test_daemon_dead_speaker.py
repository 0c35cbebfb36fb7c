"""`edge-agent run` as a process with a speaker command that never reads (`sleep`), against a real
mosquitto: every announcement still ends (`failed`, saying why), the next one is tried, and
neither a stall nor SIGTERM leaves the command behind."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from edge_agent.audio.sinks import WRITE_STALL_S
from tests.mqtt_support import DaemonProcess, Producer, Watcher, wait_until

pytestmark = pytest.mark.slow

TEXT = " ".join(f"This is sentence number {i} of an announcement nobody will hear." for i in range(1, 6))
"""About 15 s of speech: several times what the pipe to the command holds."""


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended: where no init reaps orphans, it stays listed)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def speaker_pids(daemon: DaemonProcess) -> list[int]:
    started = (re.search(r"started \(pid (\d+)\)", str(line.get("msg")))
               for line in daemon.log_lines())
    return [int(m.group(1)) for m in started if m]


@pytest.fixture
def watcher(broker: Any) -> Any:
    w = Watcher(broker.url, client_id="test-watcher")
    yield w
    w.close()


def test_a_speaker_command_that_never_reads_fails_each_announcement_and_leaves_nothing_running(
        tmp_path: Path, broker: Any, watcher: Watcher) -> None:
    # Seen: with `sleep 1000` as the speaker, neither of two announcements had a final status
    # after 90 s, SIGTERM took 30.2 s and the `sleep` outlived the daemon.
    config = tmp_path / "device.yaml"
    config.write_text("audio:\n  output_command: sleep 1000\ndaemon:\n  listen: false\n")
    daemon = DaemonProcess(tmp_path, broker.url, config=config, use_out_dir=False)
    try:
        daemon.start().wait_running()
        producer = Producer(broker.url)
        sent = time.monotonic()
        for ann_id in ("dead-1", "dead-2"):
            producer.publish("edge/dev1/announce", {"id": ann_id, "text": TEXT})
        failed = watcher.wait("edge/dev1/announce/status", lambda d: d["state"] == "failed", count=2,
                              timeout=120)
        took = time.monotonic() - sent
        assert sorted(d["id"] for d in failed) == ["dead-1", "dead-2"]
        assert all(f"took no audio for {WRITE_STALL_S:g} s" in d["error"] for d in failed)
        # A generous bound that pins the behaviour: one stall each, not an endless wait.
        assert took < 2 * WRITE_STALL_S + 60
        first_two = speaker_pids(daemon)
        assert len(first_two) == 2
        wait_until(lambda: not any(map(running, first_two)), timeout=10, what="both commands stopped")

        # SIGTERM while a third is stuck in its command: the daemon ends, and the command with it.
        producer.publish("edge/dev1/announce", {"id": "dead-3", "text": TEXT})
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "dead-3" and d["state"] == "speaking")
        wait_until(lambda: len(speaker_pids(daemon)) == 3, what="the third command started")
        third = speaker_pids(daemon)[2]
        assert running(third)
        stopping = time.monotonic()
        assert daemon.terminate(timeout=60) == 0
        assert time.monotonic() - stopping < WRITE_STALL_S + 15
        assert not running(third)
        ended = watcher.find("edge/dev1/announce/status", lambda d: d["id"] == "dead-3")
        assert ended[-1]["state"] == "failed"
    finally:
        daemon.close()
