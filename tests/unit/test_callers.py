"""webhook.admission.callers.AddressLimit: a token bucket per address, with its memory bounded."""
from __future__ import annotations

from trainjob_admission.webhook.admission.callers import AddressLimit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_refill_per_address() -> None:
    clock = Clock()
    limit = AddressLimit(rate=2.0, burst=3, clock=clock)
    assert [limit.take("10.0.0.1") for _ in range(4)] == [True, True, True, False]
    assert limit.take("10.0.0.2")  # another address has its own bucket
    clock.now = 0.5  # one token back at 2 a second
    assert limit.take("10.0.0.1") and not limit.take("10.0.0.1")
    clock.now = 100.0  # refills only up to the burst
    assert [limit.take("10.0.0.1") for _ in range(4)] == [True, True, True, False]


def test_refilled_buckets_are_forgotten_beyond_max_addresses() -> None:
    clock = Clock()
    limit = AddressLimit(rate=1.0, burst=1, max_addresses=10, clock=clock)
    for i in range(10):
        limit.take(f"10.0.0.{i}")
    clock.now = 5.0  # all refilled
    limit.take("10.0.1.1")
    assert set(limit._buckets) == {"10.0.1.1"}
    assert not limit.take("10.0.1.1")  # an empty bucket is kept: forgetting it would refill it
