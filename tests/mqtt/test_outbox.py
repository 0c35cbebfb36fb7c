import logging

from edge_agent.mqtt.outbox import KEEP, KEEP_LEAST, KEEP_MOST, MESSAGE_OVERHEAD_BYTES, Message, Outbox


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def drain(box):
    out = []
    while (m := box.pop()) is not None:
        out.append(m.payload)
    return out


def status(ann_id, state, rank=KEEP_MOST):
    return Message("s", f"{ann_id}:{state}".encode(), key=ann_id, rank=rank)


def room_for(n, sample):
    """A byte bound that holds exactly `n` messages the size of `sample`."""
    return n * sample.cost


def test_a_burst_of_small_statuses_fits_a_byte_bound_a_message_count_could_not():
    box = Outbox(4 * 1024 * 1024)
    for i in range(2000):
        assert box.put(status(f"flood-{i:04d}", "queued"))
    assert len(box) == 2000 and box.dropped == 0
    assert box.bytes == sum(status(f"flood-{i:04d}", "queued").cost for i in range(2000))
    assert box.bytes < 2000 * (MESSAGE_OVERHEAD_BYTES + 40)


def test_the_latest_heartbeat_replaces_the_waiting_one_and_every_report_is_kept():
    box = Outbox(1 << 20)
    box.put(Message("status", b"online-1", retain=True, coalesce=True))
    box.put(Message("a", b"1"))
    box.put(Message("status", b"online-2", retain=True, coalesce=True))
    box.put(Message("config/status", b"report-1", retain=True))
    box.put(Message("config/status", b"report-2", retain=True))
    assert drain(box) == [b"1", b"online-2", b"report-1", b"report-2"]
    assert box.replaced == 1 and box.dropped == 0 and box.bytes == 0


def test_one_waiting_status_per_id_but_a_first_status_is_only_replaced_by_a_final_one():
    box = Outbox(1 << 20)
    box.put(status("a", "queued"))
    box.put(status("a", "speaking", KEEP))  # says less than the waiting first status: both wait
    box.put(status("a", "done"))  # replaces "speaking", the newest waiting one
    box.put(status("b", "queued"))
    box.put(status("b", "done"))  # replaces b's first status: same id, and it says more
    box.put(status("c", "done"))
    box.put(status("c", "queued", KEEP))  # never replaces a final state with a lesser one
    assert drain(box) == [b"a:queued", b"a:done", b"b:done", b"c:done", b"c:queued"]
    assert box.replaced == 2 and box.dropped == 0


def test_over_the_bound_lower_ranks_go_first_and_no_id_loses_its_first_status_to_another():
    box = Outbox(room_for(4, status("x", "rejected")))
    box.put(Message("s", b"m:metrics", qos=0, coalesce=True, rank=KEEP_LEAST))
    box.put(status("a", "queued"))
    box.put(status("b", "speaking", KEEP))
    box.put(status("c", "rejected"))
    assert box.put(status("d", "rejected"))  # full: the metrics go
    assert box.put(status("e", "rejected"))  # then the intermediate state of b
    assert not box.put(status("f", "rejected"))  # nothing below it waits: f is the one dropped
    assert drain(box) == [b"a:queued", b"c:rejected", b"d:rejected", b"e:rejected"]
    assert (box.dropped, box.dropped_final) == (3, 1)


def test_a_message_waiting_longer_than_the_age_limit_is_dropped_but_retained_state_is_kept():
    clock = Clock()
    box = Outbox(1 << 20, max_age_s=60, clock=clock)
    box.put(Message("status", b"online", retain=True, coalesce=True))
    box.put(Message("transcript", b"turn on the lights"))
    clock.now = 30
    box.put(Message("transcript", b"what time is it"))
    clock.now = 61
    assert drain(box) == [b"online", b"what time is it"]
    assert (box.dropped, box.expired) == (1, 1)


def test_every_drop_is_counted_and_the_rate_limited_log_carries_the_real_count(caplog):
    clock = Clock()
    box = Outbox(room_for(1, status("r000", "rejected")), clock=clock)
    box.put(status("a", "queued"))
    with caplog.at_level(logging.WARNING, logger="edge_agent.mqtt.outbox"):
        for i in range(988):
            assert not box.put(status(f"r{i:03d}", "rejected"))
        box.report()  # less than LOG_EVERY_S later: nothing new to say yet
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and lines[0].startswith("outbound messages dropped: 1 since the last line")
        clock.now = 11
        box.report()
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2 and lines[1].startswith("outbound messages dropped: 987 since the last line")
        assert "(988 dropped in all, 988 of them first or final states" in lines[1]
        assert not box.put(status("r988", "rejected"))
        box.report(final=True)  # shutting down: the count goes out now
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 3 and lines[2].startswith("outbound messages dropped: 1 since the last line")
    assert box.dropped == 989 and drain(box) == [b"a:queued"]


def test_a_message_put_back_keeps_its_place_and_its_age():
    clock = Clock()
    box = Outbox(1 << 20, max_age_s=10, clock=clock)
    box.put(Message("t", b"1"))
    box.put(Message("t", b"2"))
    clock.now = 5
    first = box.pop()
    box.push_front(first)
    clock.now = 11
    assert drain(box) == []  # both older than 10 s, the one put back too
    assert box.expired == 2


def test_an_optional_count_limit_applies_besides_the_bytes():
    box = Outbox(1 << 20, max_count=2)
    assert box.put(status("a", "queued", KEEP))
    assert box.put(status("b", "queued"))
    assert box.put(status("c", "queued"))  # the intermediate state of a goes
    assert not box.put(status("d", "queued"))  # nothing below it: d itself is dropped
    assert drain(box) == [b"b:queued", b"c:queued"] and box.dropped == 2
