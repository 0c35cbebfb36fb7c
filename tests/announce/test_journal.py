import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from edge_agent.announce.journal import INTERRUPTED, Journal
from edge_agent.announce.message import Announcement
from edge_agent.config import AnnouncementSettings
from tests.waiting import wait_until


def ann(ann_id, priority=5, ts=100.0):
    return Announcement(ann_id, f"text of {ann_id}", priority=priority, received_at=ts)


def open_journal(path, clock=None, **settings):
    journal = Journal(path, AnnouncementSettings(**settings), **({"clock": clock} if clock else {}))
    return journal, journal.open()


def test_the_same_id_is_accepted_once_even_after_reopening(tmp_path):
    journal, _ = open_journal(tmp_path)
    assert journal.accept(ann("a"))
    assert not journal.accept(ann("a"))
    journal.start("a")
    journal.finish("a", "done", engine="local")
    journal.close()
    journal, found = open_journal(tmp_path)
    assert not journal.accept(ann("a"))
    assert journal.get("a").state == "done"
    assert journal.get("a").extra == {"engine": "local"}
    assert found.pending == [] and found.interrupted == []


def test_an_unplayed_announcement_is_still_unplayed_after_reopening(tmp_path):
    """A redelivered id is answered with the stored outcome: `played: false` must not turn into a
    plain `done` across a restart, nor after the compaction each opening makes."""
    journal, _ = open_journal(tmp_path)
    journal.accept(ann("a"))
    journal.start("a")
    journal.finish("a", "done", engine="local", played=False, error="not played: audio.output is null")
    journal.close()
    for _ in range(2):  # the replayed `finish` record, then the compacted one
        journal, _ = open_journal(tmp_path)
        assert journal.get("a").extra == {"engine": "local", "played": False,
                                          "error": "not played: audio.output is null"}
        journal.close()


def test_accepted_announcements_survive_and_come_back_pending(tmp_path):
    journal, _ = open_journal(tmp_path)
    for name in ("a", "b", "c"):
        journal.accept(ann(name))
    journal.start("b")
    journal.requeue("b", 2, spent_s=3.25)
    journal.close()
    _, found = open_journal(tmp_path)
    assert [(a.id, resume) for a, resume in found.pending] == [("a", 0), ("b", 2), ("c", 0)]
    assert found.pending[0][0] == ann("a")
    assert found.spent == {"b": 3.25}  # the audio budget already used, across the restart
    # A journal written before `spent_s` was recorded reads as nothing spent.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "journal.jsonl").write_text(
        json.dumps({"op": "accept", "a": ann("d").to_json(), "ts": 1.0}) + "\n"
        + json.dumps({"op": "requeue", "id": "d", "resume": 1, "ts": 2.0}) + "\n")
    _, old = open_journal(tmp_path / "old")
    assert [(a.id, r) for a, r in old.pending] == [("d", 1)] and old.spent == {}


def test_an_announcement_speaking_at_a_crash_is_failed_not_repeated(tmp_path):
    journal, _ = open_journal(tmp_path)
    journal.accept(ann("a"))
    journal.start("a")
    journal.close()
    journal, found = open_journal(tmp_path)
    assert found.interrupted == ["a"] and found.pending == []
    assert journal.get("a").state == "failed"
    assert journal.get("a").extra["error"] == INTERRUPTED


def test_a_record_torn_by_a_crash_is_dropped_and_the_rest_kept(tmp_path):
    journal, _ = open_journal(tmp_path)
    journal.accept(ann("a"))
    journal.close()
    with (tmp_path / "journal.jsonl").open("ab") as fh:
        fh.write(b'{"op":"accept","a":{"id":"b","te')
    journal, found = open_journal(tmp_path)
    assert [a.id for a, _ in found.pending] == ["a"]
    assert journal.accept(ann("b"))  # the torn one was never acknowledged: it may come again
    journal.close()
    _, found = open_journal(tmp_path)
    assert [a.id for a, _ in found.pending] == ["a", "b"]


def test_accept_is_durable_before_it_returns_even_under_sigkill(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from edge_agent.config import AnnouncementSettings
        from edge_agent.announce.message import Announcement
        from edge_agent.announce.journal import Journal
        j = Journal(Path({str(tmp_path)!r}), AnnouncementSettings())
        j.open()
        for i in range(5):
            j.accept(Announcement(f"a{{i}}", "hello"))
        j.start("a0")
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = subprocess.run([sys.executable, "-c", script], check=False)
    assert result.returncode == -signal.SIGKILL
    _, found = open_journal(tmp_path)
    assert [a.id for a, _ in found.pending] == ["a1", "a2", "a3", "a4"]
    assert found.interrupted == ["a0"]


def test_compaction_forgets_the_oldest_finished_ids_beyond_the_limit(tmp_path):
    journal, _ = open_journal(tmp_path, dedupe_max_ids=3)
    for name in ("a", "b", "c", "d"):
        journal.accept(ann(name))
        journal.finish(name, "done")
    journal.accept(ann("pending"))
    journal.close()
    journal, _ = open_journal(tmp_path, dedupe_max_ids=3)
    assert journal.get("a") is None and journal.get("b") is None
    assert journal.get("d").state == "done"
    assert journal.get("pending").state == "queued"  # pending ones are never forgotten


def test_compaction_forgets_finished_ids_older_than_the_age_limit(tmp_path):
    now = [1_000_000.0]
    journal, _ = open_journal(tmp_path, clock=lambda: now[0], dedupe_max_age_days=1)
    journal.accept(ann("old"))
    journal.finish("old", "done")
    now[0] += 2 * 86400
    journal.accept(ann("new"))
    journal.finish("new", "expired")
    journal.close()
    journal, _ = open_journal(tmp_path, clock=lambda: now[0], dedupe_max_age_days=1)
    assert journal.get("old") is None
    assert journal.get("new").state == "expired"


def test_the_file_stays_small_as_records_accumulate(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not what this test is about
    journal, _ = open_journal(tmp_path)
    journal.accept(ann("a"))
    for _ in range(1500):
        journal.start("a")
        journal.requeue("a", 1)
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert len(lines) < 1100
    journal.close()
    _, found = open_journal(tmp_path)
    assert [(a.id, r) for a, r in found.pending] == [("a", 1)]
    assert all(json.loads(line) for line in lines)


def test_finish_needs_a_final_state(tmp_path):
    journal, _ = open_journal(tmp_path)
    journal.accept(ann("a"))
    with pytest.raises(ValueError):
        journal.finish("a", "speaking")
    assert not list(tmp_path.glob(".*.tmp"))
    assert os.path.exists(tmp_path / "journal.jsonl")


# -- a full or failing disk ----------------------------------------------------------------------

from edge_agent.announce import journal as journal_module  # noqa: E402
from edge_agent.announce.journal import JournalError  # noqa: E402
from edge_agent.atomic import AppendFile  # noqa: E402
from tests.conftest import FlakyWrites  # noqa: E402


def flaky_journal(path, disk, errors=None):
    journal = Journal(path, AnnouncementSettings(), on_error=(errors.append if errors is not None else None),
                      open_file=lambda p: AppendFile(p, write=disk))
    return journal, journal.open()


def test_short_writes_still_write_whole_records(tmp_path):
    disk = FlakyWrites()
    disk.short = True
    journal, _ = flaky_journal(tmp_path, disk)
    for name in ("a", "b", "c"):
        assert journal.accept(ann(name))
    journal.close()
    assert disk.calls > 6  # every record took several calls
    _, found = open_journal(tmp_path)
    assert [a.id for a, _ in found.pending] == ["a", "b", "c"]


def test_a_record_torn_by_a_full_disk_is_cut_off_and_not_acknowledged(tmp_path):
    disk = FlakyWrites()
    errors = []
    journal, _ = flaky_journal(tmp_path, disk, errors)
    assert journal.accept(ann("a"))
    size = (tmp_path / "journal.jsonl").stat().st_size
    disk.fail_after = 20  # the next record gets 20 bytes in, then ENOSPC
    with pytest.raises(JournalError):
        journal.accept(ann("b"))
    assert (tmp_path / "journal.jsonl").stat().st_size == size  # the torn bytes are gone
    assert journal.get("b") is None and "No space left" in journal.error
    assert errors == [journal.error]
    disk.fail_after = -1
    assert journal.accept(ann("b"))  # space is back: the redelivery is taken
    assert journal.accept(ann("c"))
    assert journal.error is None and errors[-1] is None
    journal.close()
    _, found = open_journal(tmp_path)
    assert [a.id for a, _ in found.pending] == ["a", "b", "c"]
    assert all(json.loads(line) for line in (tmp_path / "journal.jsonl").read_text().splitlines())


def test_a_start_that_cannot_be_recorded_changes_nothing_and_finish_catches_up(tmp_path):
    disk = FlakyWrites()
    journal, _ = flaky_journal(tmp_path, disk)
    journal.accept(ann("a"))
    journal.accept(ann("b"))
    journal.start("a")
    disk.full = True
    with pytest.raises(JournalError):
        journal.start("b")
    assert journal.get("b").state == "queued"
    journal.finish("a", "done", engine="local")  # happened: kept in memory, written later
    assert journal.get("a").state == "done"
    disk.full = False
    assert journal.retry() and journal.error is None
    journal.close()
    journal, found = open_journal(tmp_path)
    assert journal.get("a").state == "done" and found.interrupted == []
    assert [a.id for a, _ in found.pending] == ["b"]


def test_a_compaction_that_fails_leaves_the_journal_usable(tmp_path, monkeypatch):
    journal, _ = open_journal(tmp_path)
    journal.accept(ann("a"))

    def no_space(path, data, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_module, "atomic_write", no_space)
    monkeypatch.setattr(journal_module, "COMPACT_RETRY_S", 0.0)
    with journal._lock:
        assert journal._compact() is False
    assert journal.error is not None
    assert journal.accept(ann("b"))  # the old file is still open for appends
    assert journal.error is None
    monkeypatch.undo()
    journal.close()
    journal, found = open_journal(tmp_path)
    assert [a.id for a, _ in found.pending] == ["a", "b"]


def test_opening_on_a_full_disk_still_appends_after_cutting_a_torn_tail(tmp_path, monkeypatch):
    journal, _ = open_journal(tmp_path)
    journal.accept(ann("a"))
    journal.start("a")
    journal.close()
    with (tmp_path / "journal.jsonl").open("ab") as fh:
        fh.write(b'{"op":"accept","a":{"id":"torn"')

    def no_space(path, data, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_module, "atomic_write", no_space)
    journal, found = open_journal(tmp_path)
    assert found.interrupted == ["a"] and journal.error is not None
    assert journal.accept(ann("b"))
    monkeypatch.undo()
    journal.close()
    journal, found = open_journal(tmp_path)
    assert [a.id for a, _ in found.pending] == ["b"]
    assert found.interrupted == ["a"]  # still never spoken twice


def test_on_a_real_full_disk_nothing_acknowledged_is_lost(small_disk):
    state = small_disk.path / "announcements"
    journal, _ = open_journal(state)
    small_disk.fill()
    acknowledged = []
    refused = 0
    for i in range(200):
        text = f"announcement number {i} " * 20
        try:
            if journal.accept(Announcement(f"n{i}", text, received_at=100.0)):
                acknowledged.append(f"n{i}")
        except JournalError:
            refused += 1
    assert refused > 0 and journal.error is not None
    journal.close()
    journal, found = open_journal(state)  # compaction may fail here: the disk is still full
    assert [a.id for a, _ in found.pending] == acknowledged
    small_disk.free()
    assert journal.accept(ann("after"))
    assert journal.retry() and journal.error is None
    journal.close()
    _, found = open_journal(state)
    assert [a.id for a, _ in found.pending] == [*acknowledged, "after"]


def test_a_journal_written_before_audio_announcements_still_loads(tmp_path):
    old = {"id": "a", "text": "Hi.", "voice": None, "priority": 5, "expires_at": None, "volume": 1.0,
           "chime": False, "received_at": 100.0, "conversation_id": None, "expect_reply": False}
    (tmp_path / "journal.jsonl").write_text(json.dumps({"op": "accept", "a": old, "ts": 100.0}) + "\n")
    _, found = open_journal(tmp_path)
    assert found.pending == [(Announcement("a", "Hi.", received_at=100.0), 0)]
    assert found.pending[0][0].audio is None


# -- group commit ---------------------------------------------------------------------------------


class CountedFsyncs:
    def __init__(self):
        self.calls = 0

    def __call__(self, fd):
        self.calls += 1
        os.fsync(fd)


def test_a_batch_is_accepted_with_one_write_and_one_fsync(tmp_path):
    fsyncs = CountedFsyncs()
    journal = Journal(tmp_path, AnnouncementSettings(), open_file=lambda p: AppendFile(p, fsync=fsyncs))
    journal.open()
    assert journal.accept(ann("seen"))
    before = fsyncs.calls
    batch = [ann("a"), ann("b"), ann("seen"), ann("a"), ann("c")]
    assert journal.accept_many(batch) == [True, True, False, False, True]  # ids once, the first wins
    assert fsyncs.calls == before + 1
    assert journal.accept_many([ann("a")]) == [False] and fsyncs.calls == before + 1  # nothing to write
    journal.close()
    _, found = open_journal(tmp_path)
    assert [a.id for a, _ in found.pending] == ["seen", "a", "b", "c"]


def test_a_batch_the_disk_refuses_is_none_of_it_accepted(tmp_path):
    disk = FlakyWrites()
    journal, _ = flaky_journal(tmp_path, disk)
    assert journal.accept(ann("a"))
    size = (tmp_path / "journal.jsonl").stat().st_size
    disk.fail_after = 300  # the first record of the batch (209 bytes) fits, the second is torn
    with pytest.raises(JournalError):
        journal.accept_many([ann("b"), ann("c"), ann("d")])
    assert (tmp_path / "journal.jsonl").stat().st_size == size  # the whole batch is cut off
    assert [journal.get(i) for i in "bcd"] == [None, None, None]  # nothing acknowledged may be
    disk.fail_after = -1
    assert journal.accept_many([ann("b"), ann("c"), ann("d")]) == [True, True, True]  # the redelivery
    journal.close()
    _, found = open_journal(tmp_path)
    assert [a.id for a, _ in found.pending] == ["a", "b", "c", "d"]


class HeldFirstFsync:
    """Real fsyncs; the first waits for `release`, so that the test can queue records behind it
    (storage slow to sync); `fail_at` makes that call raise instead (a failing disk)."""

    def __init__(self, fail_at=None):
        self.calls = 0
        self.release = threading.Event()
        self.fail_at = fail_at

    def __call__(self, fd):
        self.calls += 1
        if self.calls == 1:
            assert self.release.wait(30)
        if self.calls == self.fail_at:
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)


def _records_while_one_is_syncing(tmp_path, fsyncs, ids):
    """Accept `ids`, then record `start` for all of them at once: the first thread's write waits in
    its fsync until every other thread has queued its record. Each thread's outcome by id."""
    journal = Journal(tmp_path, AnnouncementSettings(), open_file=lambda p: AppendFile(p, fsync=fsyncs))
    journal.open()
    fsyncs.calls = -1  # the accept's fsync is call 0: the first start's is the held one
    journal.accept_many([ann(i) for i in ids])
    outcome = {}

    def start(ann_id):
        try:
            journal.start(ann_id)
            outcome[ann_id] = "started"
        except JournalError as exc:
            outcome[ann_id] = exc

    first = threading.Thread(target=start, args=(ids[0],))
    first.start()
    wait_until(lambda: journal._writing, what="the first write in its fsync")
    others = [threading.Thread(target=start, args=(i,)) for i in ids[1:]]
    for thread in others:
        thread.start()
    wait_until(lambda: len(journal._waiting) == len(others), what="the others queued behind it")
    fsyncs.release.set()
    for thread in (first, *others):
        thread.join(30)
    return journal, outcome


def test_records_made_while_a_write_is_syncing_share_the_next_write_and_fsync(tmp_path):
    fsyncs = HeldFirstFsync()
    ids = [f"s{i}" for i in range(8)]
    journal, outcome = _records_while_one_is_syncing(tmp_path, fsyncs, ids)
    assert outcome == dict.fromkeys(ids, "started")
    assert fsyncs.calls == 2  # the first start's, then one for the seven queued behind it
    journal.close()
    _, found = open_journal(tmp_path)
    assert sorted(found.interrupted) == ids  # every start was on disk


def test_when_a_shared_write_fails_every_record_in_it_fails_and_nothing_changes(tmp_path):
    fsyncs = HeldFirstFsync(fail_at=2)
    ids = [f"s{i}" for i in range(5)]
    journal, outcome = _records_while_one_is_syncing(tmp_path, fsyncs, ids)
    assert outcome[ids[0]] == "started"
    assert all(isinstance(outcome[i], JournalError) for i in ids[1:]), outcome
    assert [journal.get(i).state for i in ids] == ["speaking"] + ["queued"] * 4
    journal.close()
    _, found = open_journal(tmp_path)
    assert found.interrupted == [ids[0]]
    assert sorted(a.id for a, _ in found.pending) == ids[1:]  # cut off again: not started, still pending
