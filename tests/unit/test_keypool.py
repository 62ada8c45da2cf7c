"""The SSH key pool: slow key types are pre-generated and each pair is handed out once."""
from __future__ import annotations

import time

from trainjob_admission.webhook.inject.keys import KeyPool


def _wait_ready(pool: KeyPool, key_type: str, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while pool.ready(key_type) < count:
        assert time.monotonic() < deadline, f"pool never reached {count} ready {key_type} pairs"
        time.sleep(0.05)


def test_slow_pairs_are_ready_before_they_are_asked_for_and_never_reused():
    pool = KeyPool(size=2)
    pool.warm("rsa-4096")
    _wait_ready(pool, "rsa-4096", 2)
    started = time.perf_counter()
    first, second = pool.take("rsa-4096"), pool.take("rsa-4096")
    assert time.perf_counter() - started < 0.2  # taken from the pool, not generated (~1 s each)
    assert first.fingerprint != second.fingerprint
    _wait_ready(pool, "rsa-4096", 2)  # refilled in the background
    assert pool.take("rsa-4096").fingerprint not in {first.fingerprint, second.fingerprint}


def test_fast_types_are_generated_on_demand_and_empty_pool_still_answers():
    pool = KeyPool(size=0)
    assert pool.take("rsa-4096").key_type == "rsa-4096"  # no pool: generated on the spot
    fast = KeyPool(size=4)
    pair = fast.take("ecdsa-p521")
    assert pair.key_type == "ecdsa-p521" and fast.ready("ecdsa-p521") == 0
