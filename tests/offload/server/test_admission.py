"""Handshake slots: whom a full budget closes (progress, then the busiest address, then age)."""

from __future__ import annotations

import pytest

from edge_agent.offload.server.admission import HandshakeSlots, source_of


def test_a_connection_that_sent_its_hello_is_never_closed_for_a_newcomer():
    slots: HandshakeSlots[str] = HandshakeSlots(limit=2)
    assert slots.arrive("honest", "10.0.0.1") == []
    assert slots.hello("honest") == []
    closed = [v for n in range(50) for v in slots.arrive(f"silent{n}", "10.0.0.9")]
    assert "honest" not in closed and "honest" in slots
    assert len(closed) == 48 and slots.waiting == 2 and slots.challenged == 1


def test_a_full_stage_closes_the_oldest_of_the_address_holding_the_most():
    slots: HandshakeSlots[str] = HandshakeSlots(limit=4)
    slots.arrive("device", "10.0.0.1")  # the oldest of all, but alone on its address
    for n in range(3):
        slots.arrive(f"flood{n}", "10.0.0.9")
    assert slots.arrive("another device", "10.0.0.2") == ["flood0"]
    assert slots.arrive("flood3", "10.0.0.9") == ["flood1"]
    assert "device" in slots and "another device" in slots


def test_among_equals_the_oldest_goes():
    slots: HandshakeSlots[str] = HandshakeSlots(limit=2)
    slots.arrive("a", "10.0.0.1")
    slots.arrive("b", "10.0.0.1")
    assert slots.arrive("c", "10.0.0.1") == ["a"]


def test_challenged_connections_push_out_only_each_other():
    slots: HandshakeSlots[str] = HandshakeSlots(limit=1)
    slots.arrive("first", "10.0.0.1")
    slots.hello("first")
    slots.arrive("second", "10.0.0.2")
    assert slots.hello("second") == ["first"]  # it has had the longer time to answer the challenge
    assert slots.challenged == 1 and slots.waiting == 0


def test_one_address_over_its_cap_closes_its_own_oldest_whatever_the_total():
    slots: HandshakeSlots[str] = HandshakeSlots(limit=100, per_source=2)
    slots.arrive("device", "10.0.0.1")
    assert slots.arrive("x0", "10.0.0.9") == []
    assert slots.arrive("x1", "10.0.0.9") == []
    assert slots.arrive("x2", "10.0.0.9") == ["x0"]
    assert slots.arrive("x3", "10.0.0.9") == ["x1"]
    assert "device" in slots and len(slots) == 3


def test_leaving_frees_the_slot_and_a_closed_connection_cannot_move_on():
    slots: HandshakeSlots[str] = HandshakeSlots(limit=1)
    slots.arrive("a", "10.0.0.1")
    assert slots.arrive("b", "10.0.0.1") == ["a"]
    assert slots.hello("a") == []  # its handler unwinds later and may still read a HELLO
    assert "a" not in slots and slots.challenged == 0
    slots.leave("b")
    assert len(slots) == 0 and slots.arrive("c", "10.0.0.1") == []


@pytest.mark.parametrize(("host", "source"), [
    ("192.0.2.7", "192.0.2.7"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
    ("", ""),
])
def test_sources_are_ipv4_addresses_or_ipv6_slash_64s(host, source):
    assert source_of(host) == source
