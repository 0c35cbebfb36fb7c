from edge_agent.announce.message import Announcement
from edge_agent.announce.queue import AnnouncementQueue


def ann(ann_id, priority=5):
    return Announcement(ann_id, "text", priority=priority)


def test_highest_priority_first_then_arrival_order():
    q = AnnouncementQueue()
    for ann_id, prio in (("a", 5), ("b", 9), ("c", 5), ("d", 0), ("e", 9)):
        q.put(ann(ann_id, prio))
    assert [q.get(0).announcement.id for _ in range(5)] == ["b", "e", "a", "c", "d"]
    assert q.get(0.01) is None


def test_an_interrupted_item_keeps_its_place_among_equals():
    q = AnnouncementQueue()
    first = q.put(ann("first"))
    q.put(ann("second"))
    popped = q.get(0)
    assert popped is first
    q.put(popped.announcement, resume=2, seq=popped.seq)
    again = q.get(0)
    assert (again.announcement.id, again.resume) == ("first", 2)


def test_top_priority_reports_the_most_urgent_waiting():
    q = AnnouncementQueue()
    assert q.top_priority() is None
    q.put(ann("a", 3))
    q.put(ann("b", 8))
    assert q.top_priority() == 8
    assert len(q) == 2
