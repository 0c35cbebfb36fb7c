"""`edge-agent run` as a process against a real mosquitto: kills, restarts, bad input.

What "broker SIGKILL" means here: mosquitto runs with persistence saved after every
change (see `edge_agent.mqtt.localbroker`), so sessions and queued messages survive,
except a change acknowledged in the instant before the kill. Producers therefore
republish, by id, whatever they cannot confirm; the device's dedupe keeps every id
to one utterance. The tests pin exactly that: each id spoken once, none lost.
"""

import collections
import json
import signal
import time

import pytest

from edge_agent.faults import CRASH_ENV
from tests.mqtt_support import DaemonProcess, Producer, Watcher, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path, broker):
    proc = DaemonProcess(tmp_path, broker.url)
    yield proc
    proc.close()


@pytest.fixture
def watcher(broker):
    w = Watcher(broker.url, client_id="test-watcher")
    yield w
    w.close()


def ann(ann_id, text=None, **kw):
    return {"id": ann_id, "text": text or f"Announcement {ann_id}.", **kw}


def test_an_announcement_is_spoken_to_its_wav_and_sigterm_stops_cleanly(daemon, watcher, broker):
    daemon.start().wait_running()
    watcher.wait("edge/dev1/status", lambda d: d["state"] == "online")
    Producer(broker.url).publish("edge/dev1/announce", ann("hello-1", "Hello. The kettle is on.", chime=True))
    done = watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "hello-1" and d["state"] == "done")
    assert done[0]["engine"] == "local"
    assert watcher.statuses("dev1", "hello-1") == ["queued", "speaking", "done"]
    assert (daemon.out_dir / "hello-1.wav").stat().st_size > 20_000
    metrics = watcher.wait("edge/dev1/metrics", lambda d: d["counters"].get("announcements_spoken") == 1)
    assert metrics[-1]["histograms"]["announce_first_audio_s"]["count"] == 1
    assert daemon.terminate() == 0
    offline = watcher.wait("edge/dev1/status", lambda d: d["state"] == "offline")
    assert offline[-1]["config_version"] == 0
    lines = daemon.log_lines()
    assert all("id" in line for line in lines if "announcement" in str(line.get("msg", "")))


def test_bad_payloads_are_rejected_and_the_daemon_stays_alive(daemon, watcher, broker):
    daemon.start().wait_running()
    producer = Producer(broker.url)
    producer.publish("edge/dev1/announce", b"{this is not json")
    producer.publish("edge/dev1/announce", {"id": "no-text"})
    producer.publish("edge/dev1/announce", {"text": "no id"})
    producer.publish("edge/dev1/announce", {"id": "bad-voice", "text": "x", "voice": "robot"})
    producer.publish("edge/all/announce", b"x" * (10 * 1024 * 1024))
    rejected = watcher.wait("edge/dev1/announce/status", lambda d: d["state"] == "rejected", count=5)
    reasons = [d["error"] for d in rejected]
    assert any("invalid JSON" in r for r in reasons)
    assert any("missing 'text'" in r for r in reasons)
    assert any("missing 'id'" in r for r in reasons)
    assert any("unknown voice 'robot'" in r for r in reasons)
    assert any("payload is 10485760 bytes" in r for r in reasons)
    producer.publish("edge/dev1/announce", ann("after"))
    watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "after" and d["state"] == "done")
    assert daemon.alive


def test_announcements_published_while_the_daemon_is_dead_are_each_spoken_once(daemon, watcher, broker):
    daemon.start().wait_running()
    producer = Producer(broker.url)
    producer.publish("edge/dev1/announce", ann("before"))
    watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "before" and d["state"] == "done")
    daemon.kill()
    watcher.wait("edge/dev1/status", lambda d: d["state"] == "offline")  # the will, from the broker
    ids = [f"down-{i:02d}" for i in range(20)]
    for ann_id in ids:
        producer.publish("edge/dev1/announce", ann(ann_id))
    daemon.start()
    wait_until(lambda: set(ids) <= set(daemon.spoken()), timeout=180, what="all 20 spoken")
    counts = collections.Counter(daemon.spoken())
    assert all(counts[i] == 1 for i in [*ids, "before"]), counts
    assert all((daemon.out_dir / f"{i}.wav").is_file() for i in ids)


def test_a_broker_killed_mid_stream_still_gets_each_announcement_spoken_once(daemon, watcher, broker):
    daemon.start().wait_running()
    producer = Producer(broker.url)
    first = [f"s-{i:02d}" for i in range(10)]
    for ann_id in first:
        producer.publish("edge/dev1/announce", ann(ann_id))
    wait_until(lambda: len(daemon.spoken()) >= 3, what="the stream to be under way")
    broker.kill()
    during = [f"s-{i:02d}" for i in range(10, 15)]
    for ann_id in during:  # paho may queue these and send them itself after reconnecting
        producer.publish("edge/dev1/announce", ann(ann_id), wait=False)
    broker.start()
    wait_until(producer.client.is_connected, what="the producer to reconnect")
    # What the producer cannot confirm as spoken it sends again, by id.
    for ann_id in first + during:
        producer.publish("edge/dev1/announce", ann(ann_id))
    after = [f"s-{i:02d}" for i in range(15, 20)]
    for ann_id in after:
        producer.publish("edge/dev1/announce", ann(ann_id))
    every = first + during + after
    wait_until(lambda: set(every) <= set(daemon.spoken()), timeout=180, what="all 20 spoken")
    counts = collections.Counter(daemon.spoken())
    assert all(counts[i] == 1 for i in every), counts
    assert collections.Counter(daemon.started_speaking()) == collections.Counter(every)
    assert daemon.alive
    # The device's session outlived the broker, and the republished ids were recognised.
    connects = [str(line["msg"]) for line in daemon.log_lines() if "connected to" in str(line.get("msg"))]
    assert len(connects) >= 2 and "session resumed" in connects[-1]
    duplicates = watcher.find("edge/dev1/announce/status", lambda d: d.get("duplicate"))
    assert len(duplicates) >= len(first)


def test_the_daemon_runs_without_a_broker_and_connects_when_one_appears(tmp_path):
    from edge_agent.mqtt.localbroker import LocalBroker, free_port

    late = LocalBroker(tmp_path / "late-broker")
    late.port = free_port()
    daemon = DaemonProcess(tmp_path / "d", f"mqtt://127.0.0.1:{late.port}")
    try:
        daemon.start().wait_running()
        wait_until(lambda: any("unreachable" in str(line.get("msg")) for line in daemon.log_lines()),
                   what="a reconnect attempt")
        late.start()
        watcher = Watcher(late.url)
        try:
            watcher.wait("edge/dev1/status", lambda d: d["state"] == "online")
            Producer(late.url).publish("edge/dev1/announce", ann("late-1"))
            watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "late-1" and d["state"] == "done")
        finally:
            watcher.close()
    finally:
        daemon.close()
        late.kill()


def test_sigterm_mid_announcement_resumes_the_rest_after_a_restart(daemon, watcher, broker):
    daemon.start().wait_running()
    long_text = " ".join(f"This is sentence number {i} of a long announcement." for i in range(1, 9))
    Producer(broker.url).publish("edge/dev1/announce", ann("long", long_text))
    watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "long" and d["state"] == "speaking")
    assert daemon.terminate() == 0
    stopped = watcher.find("edge/dev1/announce/status", lambda d: d["id"] == "long")
    if stopped[-1]["state"] == "done":
        pytest.skip("the machine spoke all 8 sentences before SIGTERM arrived")
    assert stopped[-1]["state"] == "queued" and stopped[-1]["resume"] >= 1
    t0 = time.time()
    daemon.start()
    watcher.wait("edge/dev1/announce/status",
                 lambda d: d["id"] == "long" and d["state"] == "done" and d["ts"] > t0)
    assert daemon.spoken().count("long") == 1


def test_without_a_sound_card_the_daemon_says_so_once_and_uses_the_fallback(tmp_path, broker, watcher):
    from edge_agent.audio.sinks import AudioUnavailable, SoundDeviceSink

    try:
        SoundDeviceSink(22050).abort()
        pytest.skip("this machine has a usable sound card")
    except AudioUnavailable:
        pass
    config = tmp_path / "device.yaml"
    config.write_text(f"audio:\n  output: sounddevice\n  fallback: wav\n  fallback_dir: {tmp_path / 'fb'}\n")
    daemon = DaemonProcess(tmp_path, broker.url, config=config, use_out_dir=False)
    try:
        daemon.start().wait_running()
        producer = Producer(broker.url)
        for ann_id in ("card-1", "card-2"):
            producer.publish("edge/dev1/announce", ann(ann_id))
        watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "card-2" and d["state"] == "done")
        warnings = [line for line in daemon.log_lines() if "falling back" in str(line.get("msg"))]
        assert len(warnings) == 1
        assert len(list((tmp_path / "fb").glob("*card-*.wav"))) == 2
    finally:
        daemon.close()


def test_a_full_state_disk_loses_nothing_and_the_daemon_recovers_by_itself(tmp_path, broker, watcher,
                                                                            small_disk):
    """Nothing acknowledged unless journaled, nothing spoken twice, bounded logs, and no restart
    needed once space returns, even after a restart on the full disk (whose compaction fails)."""
    config = tmp_path / "device.yaml"
    config.write_text(f"announcements:\n  state_dir: {small_disk.path / 'announcements'}\n")
    daemon = DaemonProcess(tmp_path, broker.url, config=config)
    try:
        daemon.start().wait_running()
        producer = Producer(broker.url)
        small_disk.fill()
        flood = [f"full-{i:02d}" for i in range(24)]
        for ann_id in flood:
            producer.publish("edge/dev1/announce", ann(ann_id, f"Disk full test {ann_id}."))
        watcher.wait("edge/dev1/status", lambda d: "No space left" in d.get("journal_error", ""))
        wait_until(lambda: any("could not be stored" in str(line.get("msg")) for line in daemon.log_lines()),
                   what="a refused message")
        daemon.kill()  # an acknowledged announcement that was not journaled would be lost here
        daemon.start().wait_running()  # on the still-full disk: compaction fails, appending goes on
        t_full = time.time()
        watcher.wait("edge/dev1/status",
                     lambda d: d["ts"] > t_full and "No space left" in d.get("journal_error", ""))
        small_disk.free()
        later = [f"later-{i}" for i in range(3)]
        for ann_id in later:
            producer.publish("edge/dev1/announce", ann(ann_id))
        every = flood + later
        wait_until(lambda: set(every) <= set(daemon.spoken()), timeout=180, what="all 27 spoken")
        counts = collections.Counter(daemon.spoken())
        assert all(counts[i] == 1 for i in every), counts
        watcher.wait("edge/dev1/status", lambda d: d["state"] == "online" and d["ts"] > t_full
                     and "journal_error" not in d)
        errors = [line for line in daemon.log_lines() if line.get("level") == "error"]
        assert len(errors) < 40, errors[-5:]
    finally:
        daemon.close()


def test_after_a_kill_mid_announcement_the_failed_status_goes_out_and_no_partial_file_stays(daemon, watcher,
                                                                                           broker):
    daemon.start().wait_running()
    long_text = " ".join(f"This is sentence number {i} of a long announcement." for i in range(1, 13))
    Producer(broker.url).publish("edge/dev1/announce", ann("cut", long_text))
    watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "cut" and d["state"] == "speaking")
    daemon.kill()
    if watcher.find("edge/dev1/announce/status", lambda d: d["id"] == "cut" and d["state"] == "done"):
        pytest.skip("the machine spoke all 12 sentences before SIGKILL arrived")
    partial = list(daemon.out_dir.glob(".cut.wav.*.part"))
    assert partial  # the WAV being written when the process died
    daemon.start().wait_running()
    failed = watcher.wait("edge/dev1/announce/status", lambda d: d["id"] == "cut" and d["state"] == "failed")
    assert "interrupted by a restart" in failed[0]["error"]
    assert not list(daemon.out_dir.glob(".*.part")) and not (daemon.out_dir / "cut.wav").exists()
    assert daemon.started_speaking().count("cut") == 1  # never spoken twice


def test_a_crash_between_a_journaled_batch_and_its_acknowledgements_loses_and_repeats_nothing(
        daemon, watcher, broker):
    """Group commit under SIGKILL: announcements that waited in the broker arrive read ahead and
    are journaled with one write and fsync; the daemon dies right after it (`journal:accepted`),
    before acknowledging any. The broker delivers every one again, the journal answers those it
    has as duplicates, and each id is spoken exactly once."""
    daemon.start().wait_running()
    watcher.wait("edge/dev1/status", lambda d: d["state"] == "online")
    daemon.kill()
    producer = Producer(broker.url)
    ids = [f"batch-{i:02d}" for i in range(20)]
    for ann_id in ids:
        producer.publish("edge/dev1/announce", ann(ann_id))
    daemon.start(extra_env={CRASH_ENV: "journal:accepted"})
    assert daemon.wait_exit() == -signal.SIGKILL
    (journal,) = (daemon.workdir / "state").rglob("journal.jsonl")
    batch = [json.loads(line)["a"]["id"] for line in journal.read_text().splitlines()
             if json.loads(line)["op"] == "accept"]
    assert batch and set(batch) <= set(ids)  # on disk in one write, none acknowledged
    daemon.start()
    wait_until(lambda: set(ids) <= set(daemon.spoken()), timeout=180, what="all 20 spoken")
    counts = collections.Counter(daemon.spoken())
    assert all(counts[i] == 1 for i in ids), counts
    redelivered = watcher.find("edge/dev1/announce/status", lambda d: d.get("duplicate"))
    assert {d["id"] for d in redelivered} == set(batch)  # every journaled one came again: unacknowledged
