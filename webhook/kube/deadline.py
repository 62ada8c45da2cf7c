"""One deadline per AdmissionReview, shared by its evaluation and every API call it makes.

The API server gives up on a webhook after the configuration's ``timeoutSeconds`` (10 s in
manifests/base/webhooks.yaml) and applies its failurePolicy. Work that goes on after that is
worse than wasted: objects created for a job the API server has already refused, and a decision
record saying "allow" for a job that was denied. So the reviewer starts one deadline per request
(timeoutSeconds minus :data:`MARGIN` for the network and the log write), evaluation is bounded by
what is left of it, and :meth:`Calls._bounded <webhook.kube.calls.Calls>` sends no API call once
it has passed. It lives in a context variable, so the injector's concurrent calls (each in its
own task, which copies the context) see the request's deadline without passing it along.
"""
from __future__ import annotations

import contextvars
import time
from .. import ServiceError

MARGIN = 2.0  # seconds kept back from the webhook's timeoutSeconds to answer and log in time

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("request_deadline", default=None)


class DeadlineExceeded(ServiceError, TimeoutError):
    """The request's deadline passed before a call could be sent: nothing was sent."""


def start(seconds: float) -> None:
    """This request (the current task and those it starts) must be done ``seconds`` from now."""
    _deadline.set(time.monotonic() + seconds)


def remaining() -> float | None:
    """Seconds left, or None outside a request (the reconciler's calls have only their own timeout)."""
    deadline = _deadline.get()
    return None if deadline is None else deadline - time.monotonic()


def bound(timeout: float) -> float:
    """``timeout`` cut to what is left of the request; raises :class:`DeadlineExceeded` when
    nothing is left, so the caller never starts work the API server will not wait for."""
    left = remaining()
    if left is None:
        return timeout
    if left <= 0:
        raise DeadlineExceeded("the request's deadline had passed; the call was not sent")
    return min(timeout, left)
