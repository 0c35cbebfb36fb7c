"""A Hermes say's id and session id travel inside its announcement id and come back out."""

from edge_agent.announce.message import ID_PATTERN
from edge_agent.hermes.adapter import announcement_id, parse_announcement_id


def test_ids_round_trip_and_make_valid_announcement_ids() -> None:
    for say_id, session in [("0b7f7a3e-6c1d-4c5e-9d1a-2f3b4c5d6e7f", "sess-1"), ("say-1", None),
                            (None, "sess-2"), ("has/slash", "ok"), (None, None)]:
        ann = announcement_id(say_id, session)
        assert ID_PATTERN.match(ann), ann
        expected_id = say_id if say_id and "/" not in say_id else None
        assert parse_announcement_id(ann) == (expected_id, session)


def test_a_say_without_an_id_is_a_new_announcement_each_time() -> None:
    assert announcement_id(None, "s") != announcement_id(None, "s")
    assert announcement_id("a", "s") == announcement_id("a", "s")
