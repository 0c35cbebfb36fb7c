"""The scheduler's deadlines and order, with work that only records when it ran."""

from __future__ import annotations

import asyncio

import pytest

from edge_agent.offload.server.scheduler import Scheduler, SentenceResult, Ticket
from edge_agent.offload.server.server_metrics import ServerMetrics


def test_a_sentence_is_due_when_the_audio_before_it_has_played() -> None:
    ticket = Ticket([])
    ticket.due = 100.0
    ticket.plan([2.0, 3.0, 4.0])
    assert [ticket.due_of(i) for i in range(3)] == [100.0, 102.0, 105.0]
    ticket.measured(0, 1.5)  # came out shorter than estimated: the later ones are due sooner
    assert [ticket.due_of(i) for i in range(3)] == [100.0, 101.5, 104.5]
    ticket.playing_since = 200.0  # the device's own clock from its first audio on
    assert ticket.due_of(2) == 204.5


def test_the_sentence_due_first_goes_first_whichever_stream_it_belongs_to() -> None:
    ran: list[str] = []

    def work(name: str):
        def run() -> SentenceResult:
            ran.append(name)
            return SentenceResult([], 24000, 1.0, 0.1)
        return run

    async def go() -> None:
        scheduler = Scheduler(1, ServerMetrics())
        relaxed, hurried = Ticket([]), Ticket([])
        # Submitted before the worker starts: what it takes first is the order, not the arrival.
        scheduler.submit(relaxed, [work("relaxed 0"), work("relaxed 1")], ["a" * 10, "b" * 10], budget_s=5.0)
        scheduler.submit(hurried, [work("hurried 0"), work("hurried 1")], ["c" * 10, "d" * 200], budget_s=0.5)
        scheduler.start()
        await asyncio.wait_for(asyncio.gather(*relaxed.futures, *hurried.futures), 10)
        await scheduler.stop()

    asyncio.run(go())
    # hurried 0 (due 0.5 s), hurried 1 (0.5 + 0.65), relaxed 0 (5 s), relaxed 1 (5.65 s)
    assert ran == ["hurried 0", "hurried 1", "relaxed 0", "relaxed 1"]


def test_a_failing_sentence_fails_its_own_future_only() -> None:
    def bad() -> SentenceResult:
        raise RuntimeError("model failed")

    def good() -> SentenceResult:
        return SentenceResult([], 100, 0.5, 0.1)

    async def go() -> tuple[BaseException | None, SentenceResult]:
        scheduler = Scheduler(2, ServerMetrics())
        scheduler.start()
        one, two = Ticket([]), Ticket([])
        scheduler.submit(one, [bad])
        scheduler.submit(two, [good])
        done = await asyncio.wait_for(asyncio.gather(*one.futures, *two.futures, return_exceptions=True), 10)
        await scheduler.stop()
        return done[0], done[1]

    failed, result = asyncio.run(go())
    assert isinstance(failed, RuntimeError)
    assert isinstance(result, SentenceResult) and result.audio_s == 0.5


@pytest.mark.parametrize("workers", [1, 2])
def test_nothing_ahead_means_no_estimate_to_refuse_on(workers: int) -> None:
    async def go() -> float | None:
        scheduler = Scheduler(workers, ServerMetrics())
        scheduler.rtf["v"] = 5.0  # a very slow voice: its own sentence alone is past any deadline
        return scheduler.first_audio_estimate("v", "A long first sentence of the new stream.", 0.1)

    assert asyncio.run(go()) is None
