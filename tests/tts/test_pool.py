"""The voice's worker pool: most urgent job first, FIFO among equals, clean shutdown."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from edge_agent.tts.pool import PriorityPool, idle_cores
from tests.waiting import wait_until


def test_the_most_urgent_job_runs_first_and_equals_in_order() -> None:
    pool = PriorityPool(1, "test")
    try:
        gate = threading.Event()
        ran: list[str] = []
        blocker = pool.submit(0, gate.wait, 10)  # holds the only worker while the queue fills
        jobs = [pool.submit(priority, ran.append, name)
                for priority, name in [(1, "w1"), (1, "w2"), (0, "front"), (-1, "first"), (1, "w3")]]
        gate.set()
        assert blocker.result(10)
        for job in jobs:
            job.result(10)
        assert ran == ["first", "front", "w1", "w2", "w3"]
    finally:
        pool.shutdown()


def test_a_failing_job_reaches_its_caller_and_the_worker_goes_on() -> None:
    pool = PriorityPool(2, "test")
    try:
        with pytest.raises(ZeroDivisionError):
            pool.submit(0, lambda: 1 / 0).result(10)
        assert pool.submit(0, lambda: 42).result(10) == 42
    finally:
        pool.shutdown()


def test_shutdown_cancels_what_has_not_started_and_refuses_more() -> None:
    pool = PriorityPool(1, "test")
    gate = threading.Event()
    running = pool.submit(0, gate.wait, 10)
    waiting = [pool.submit(1, lambda: None) for _ in range(3)]
    wait_until(running.running, what="the first job running")
    pool.shutdown()
    assert all(job.cancelled() for job in waiting)
    gate.set()
    assert running.result(10) is True  # a running job finishes
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(0, lambda: None)
    pool._executor.shutdown(wait=True)  # the worker threads are gone


def test_a_job_submitted_after_a_gate_takes_no_worker_until_the_gate_is_done() -> None:
    pool = PriorityPool(2, "test")
    try:
        opened = threading.Event()
        gate = pool.submit(1, opened.wait, 10)
        ran: list[str] = []
        held = pool.submit_after(gate, -1, ran.append, "held")  # the most urgent, yet it waits
        pool.submit(1, ran.append, "free").result(10)  # the second worker was free for others
        assert ran == ["free"] and not held.done()
        opened.set()
        held.result(10)
        assert ran == ["free", "held"]
        # A gate already done releases at once.
        assert pool.submit_after(gate, 0, lambda: 7).result(10) == 7
    finally:
        pool.shutdown()


def test_a_held_job_that_is_cancelled_or_shut_down_never_runs() -> None:
    pool = PriorityPool(1, "test")
    opened = threading.Event()
    gate = pool.submit(0, opened.wait, 10)
    ran: list[str] = []
    cancelled = pool.submit_after(gate, 0, ran.append, "cancelled")
    assert cancelled.cancel()
    opened.set()
    gate.result(10)
    pool.submit(1, ran.append, "after").result(10)  # the one worker has run what was queued
    assert ran == ["after"]

    blocker = threading.Event()
    second_gate = pool.submit(0, blocker.wait, 10)
    waiting = pool.submit_after(second_gate, 0, ran.append, "never")
    wait_until(second_gate.running, what="the gate to start")
    pool.shutdown()
    assert waiting.cancelled()
    blocker.set()
    assert second_gate.result(10) is True
    assert ran == ["after"]
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit_after(second_gate, 0, ran.append, "refused")


def test_a_process_that_exits_waits_for_running_jobs() -> None:
    """At exit a job is finished, not torn down mid-run (a model under it would abort the process)."""
    code = (
        "import threading, time\n"
        "from edge_agent.tts.pool import PriorityPool\n"
        "pool = PriorityPool(2, 'exit')\n"
        "started = threading.Event()\n"
        "def job():\n"
        "    started.set(); time.sleep(0.5); print('finished', flush=True)\n"
        "pool.submit(0, job)\n"
        "started.wait(10)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "finished"


CPUS = os.cpu_count() or 1


@pytest.mark.parametrize(("runnable", "idle"), [(1, CPUS), (2, CPUS - 1), (500, 0)])
def test_idle_cores_counts_the_threads_runnable_now(tmp_path: Path, runnable: int, idle: int) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text(f"7.50 6.00 4.00 {runnable}/310 4242\n", encoding="ascii")
    assert idle_cores(loadavg) == idle  # the load averages (7.5) do not count: they lag by minutes


def test_idle_cores_is_unknown_without_the_kernels_count(tmp_path: Path) -> None:
    assert idle_cores(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("0.1 0.1\n", encoding="ascii")
    assert idle_cores(tmp_path / "odd") is None
    assert idle_cores() is None or idle_cores() >= 0  # this machine's own
