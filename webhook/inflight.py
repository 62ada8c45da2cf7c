"""How many admission requests the server holds at once, by count and by body bytes.

A request's memory grows with its body: parsed JSON takes up to ~20 times the bytes, and a
review may wait for an evaluator thread while holding it. Without a bound, 32 concurrent 2.3 MB
reviews took the process past the Deployment's 512 MiB. A request that does not fit is refused
before its body is read (HTTP 429, logged), which the API server answers with the webhook's
failurePolicy. Used from the event loop only, so it needs no lock.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_REQUESTS = 128  # admission requests read or reviewed at once (a burst of small jobs fits)
MAX_BYTES = 8 * 1024 * 1024  # their bodies together: under three maximum-size reviews (server.MAX_BODY_BYTES)
MIN_CHARGE = 16 * 1024  # what a tiny body counts for: its parse, record and response are not free


@dataclass
class InFlight:
    max_requests: int = MAX_REQUESTS
    max_bytes: int = MAX_BYTES
    requests: int = 0
    bytes: int = 0

    def charge(self, content_length: int | None, max_body: int) -> int:
        """What a request of ``content_length`` bytes counts for (unknown length: ``max_body``)."""
        size = max_body if content_length is None else min(content_length, max_body)
        return max(size, MIN_CHARGE)

    def admit(self, charge: int) -> bool:
        if self.requests + 1 > self.max_requests or self.bytes + charge > self.max_bytes:
            return False
        self.requests += 1
        self.bytes += charge
        return True

    def release(self, charge: int) -> None:
        self.requests -= 1
        self.bytes -= charge

    def describe(self) -> str:
        return f"{self.max_requests} requests or {self.max_bytes // (1024 * 1024)} MiB of bodies"
