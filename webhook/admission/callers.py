"""Who called, and how much a caller the service cannot authenticate may cause.

With ``serve --client-ca`` every /validate and /mutate caller holds a certificate from that CA
(the TLS handshake refuses everyone else, certs/clientca.py). Without it anyone who reaches the
port can post an AdmissionReview, so what such a request can cause is bounded per address: the
objects it creates, and the SubjectAccessReviews it makes the service send (webhook/admission/access.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Caller:
    """The peer of one request. ``authenticated``: it presented a client certificate that the
    handshake verified against the client CA; ``subject`` is that certificate's common name."""

    address: str
    authenticated: bool = False
    subject: str | None = None

    def as_record(self) -> dict:
        return {"authenticated": self.authenticated, "subject": self.subject, "address": self.address}


UNKNOWN = Caller("")  # a request whose peer is not known (the reviewer called directly)


@dataclass
class AddressLimit:
    """A token bucket per client address (for requests that would create objects, for API calls a
    request makes): ``rate`` a second, up to ``burst`` at once. Buckets that have refilled are forgotten once there are more
    than ``max_addresses``, so many addresses cannot grow memory without bound."""

    rate: float
    burst: int
    max_addresses: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # address -> (tokens, at)

    def take(self, address: str) -> bool:
        """Spend one token of ``address``'s bucket; False when it is empty."""
        now = self.clock()
        tokens, at = self._buckets.get(address, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        allowed = tokens >= 1.0
        self._buckets[address] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > self.max_addresses:
            self._forget_full(now)
        return allowed

    def _forget_full(self, now: float) -> None:
        self._buckets = {a: (t, at) for a, (t, at) in self._buckets.items()
                         if t + (now - at) * self.rate < self.burst}

    def describe(self) -> str:
        return f"{self.rate:g} per second, bursts of {self.burst}"
