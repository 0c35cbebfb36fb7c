"""A Hermes say's id becomes its announcement id (deduplicated by the id alone) and comes back out."""

import pytest

from edge_agent.announce.message import ID_PATTERN, SAFE_INTEGER
from edge_agent.hermes.adapter import announcement_id, echoable, parse_announcement_id


@pytest.mark.parametrize("say_id", ["0b7f7a3e-6c1d-4c5e-9d1a-2f3b4c5d6e7f", "say-1", "a" * 120])
def test_a_plain_id_is_the_announcement_id_and_comes_back_out(say_id: str) -> None:
    ann = announcement_id(say_id)
    assert ann == f"hermes:{say_id}" and ID_PATTERN.fullmatch(ann)
    assert parse_announcement_id(ann) == say_id


@pytest.mark.parametrize("say_id", ["say-1\n", "has/slash", "with space", "a:b", "a" * 121, "\ud800",
                                    "x\x00"])
def test_any_other_string_id_is_hashed_to_one_valid_announcement_id(say_id: str) -> None:
    ann = announcement_id(say_id)
    assert ID_PATTERN.fullmatch(ann), ann
    assert ann == announcement_id(say_id)  # the same say again is the same announcement
    assert ann != announcement_id(say_id + "x")
    assert parse_announcement_id(ann) is None  # not recoverable from the id: echoed from memory


def test_a_newline_does_not_make_two_ids_the_same() -> None:
    assert announcement_id("say-1\n") != announcement_id("say-1")


@pytest.mark.parametrize("say_id", [None, ""])
def test_a_say_without_an_id_is_a_new_announcement_each_time(say_id: object) -> None:
    first, second = announcement_id(say_id), announcement_id(say_id)
    assert first != second and ID_PATTERN.fullmatch(first) and parse_announcement_id(first) is None


@pytest.mark.parametrize("say_id", [0, 5, -7, SAFE_INTEGER, -SAFE_INTEGER])
def test_an_integer_id_every_json_reader_holds_is_echoed_and_deduplicated_by_its_digits(say_id: int) -> None:
    assert echoable(say_id)
    assert announcement_id(say_id) == f"hermes:{say_id}" == announcement_id(say_id)


@pytest.mark.parametrize("say_id", [SAFE_INTEGER + 1, -SAFE_INTEGER - 1, float("inf"), float("nan"), 1.5,
                                    True, ["a"], {"a": 1}])
def test_an_id_that_would_not_come_back_as_sent_is_not_echoable(say_id: object) -> None:
    assert not echoable(say_id)


def test_ids_written_by_the_older_format_still_give_their_id() -> None:
    assert parse_announcement_id("hermes:say-1:sess-9") == "say-1"
    assert parse_announcement_id("hermes::sess-2:0123abcd") is None
