import random

from edge_agent.offload.client.breaker import Backoff, BreakerState, CircuitBreaker


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_breaker_opens_after_consecutive_failures_only():
    clock = Clock()
    breaker = CircuitBreaker(failures=3, open_s=10, clock=clock)
    breaker.failure("a")
    breaker.failure("b")
    breaker.success()  # resets the count
    breaker.failure("c")
    breaker.failure("d")
    assert breaker.state is BreakerState.CLOSED and breaker.allow()
    breaker.failure("e")
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()
    assert breaker.last_failure == "e"


def test_open_breaker_lets_one_probe_through_after_the_cool_down():
    clock = Clock()
    breaker = CircuitBreaker(failures=1, open_s=10, clock=clock)
    breaker.failure()
    clock.now += 9.9
    assert not breaker.allow()
    clock.now += 0.2
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow()
    assert not breaker.allow()  # only one probe at a time
    breaker.success()
    assert breaker.state is BreakerState.CLOSED and breaker.allow()


def test_failed_probe_reopens_the_breaker():
    clock = Clock()
    breaker = CircuitBreaker(failures=2, open_s=5, clock=clock)
    breaker.failure()
    breaker.failure()
    clock.now += 5
    assert breaker.allow()
    breaker.failure("probe failed")
    assert breaker.state is BreakerState.OPEN
    clock.now += 4.9
    assert not breaker.allow()


def test_a_ping_during_the_cool_down_does_not_close_the_breaker():
    clock = Clock()
    breaker = CircuitBreaker(failures=1, open_s=10, clock=clock)
    breaker.failure()
    clock.now += 1
    breaker.success()
    assert breaker.state is BreakerState.OPEN
    clock.now += 10
    breaker.success()
    assert breaker.state is BreakerState.CLOSED


def test_failures_while_open_extend_the_outage():
    clock = Clock()
    breaker = CircuitBreaker(failures=1, open_s=10, clock=clock)
    breaker.failure()
    clock.now += 8
    breaker.failure("reconnect refused")
    clock.now += 8
    assert breaker.state is BreakerState.OPEN


def test_backoff_grows_exponentially_with_jitter_and_resets():
    backoff = Backoff(0.5, 8.0, random.Random(1))
    delays = [backoff.next() for _ in range(10)]
    caps = [min(8.0, 0.5 * 2**i) for i in range(10)]
    assert all(0.5 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    assert len({round(d, 6) for d in delays[3:]}) > 3  # jittered, not a fixed ladder
    assert max(delays) > 2.0
    backoff.reset()
    assert backoff.next() == 0.5


def test_many_clients_do_not_reconnect_in_lockstep():
    firsts = [Backoff(0.5, 30, random.Random(seed)) for seed in range(50)]
    for b in firsts:
        for _ in range(5):
            b.next()
    sixth = sorted(b.next() for b in firsts)
    assert sixth[-1] - sixth[0] > 5
