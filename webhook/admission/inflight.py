"""How many admission requests the server holds at once, by count and by body bytes.

A request's memory grows with its body: parsed JSON takes up to ~20 times the bytes, and a
review may wait for an evaluator thread while holding it. Without a bound, 32 concurrent 2.3 MB
reviews took the process past the Deployment's 512 MiB. A request that does not fit is refused
before its body is read (HTTP 429, logged), which the API server answers with the webhook's
failurePolicy. Used from the event loop only, so it needs no lock.

It also tells background API work when admissions pause (:meth:`InFlight.lull`): the reconciler's
adoptions wait for one, so that in a burst their writes do not compete, on the API server and in
this process, with the creations the burst's /validate calls are waiting for.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

MAX_REQUESTS = 128  # admission requests read or reviewed at once (a burst of small jobs fits)
MAX_BYTES = 8 * 1024 * 1024  # their bodies together: under three maximum-size reviews (server.MAX_BODY_BYTES)
MIN_CHARGE = 16 * 1024  # what a tiny body counts for: its parse, record and response are not free


@dataclass
class InFlight:
    max_requests: int = MAX_REQUESTS
    max_bytes: int = MAX_BYTES
    requests: int = 0
    bytes: int = 0
    active_at: float = field(default_factory=time.monotonic)  # when a request last came or went

    def charge(self, content_length: int | None, max_body: int) -> int:
        """What a request of ``content_length`` bytes counts for (unknown length: ``max_body``)."""
        size = max_body if content_length is None else min(content_length, max_body)
        return max(size, MIN_CHARGE)

    def admit(self, charge: int) -> bool:
        if self.requests + 1 > self.max_requests or self.bytes + charge > self.max_bytes:
            return False
        self.requests += 1
        self.bytes += charge
        self.active_at = time.monotonic()
        return True

    def release(self, charge: int) -> None:
        self.requests -= 1
        self.bytes -= charge
        self.active_at = time.monotonic()

    async def lull(self, quiet: float, limit: float) -> None:
        """Return once no request has been in flight for ``quiet`` seconds, or after ``limit``
        seconds whatever the traffic (work that waits for a lull is delayed, never starved)."""
        end = time.monotonic() + limit
        while True:
            now = time.monotonic()
            wait = quiet - (now - self.active_at) if self.requests == 0 else quiet
            if wait <= 0 or now >= end:
                return
            await asyncio.sleep(min(wait, end - now))

    def describe(self) -> str:
        return f"{self.max_requests} requests or {self.max_bytes // (1024 * 1024)} MiB of bodies"
