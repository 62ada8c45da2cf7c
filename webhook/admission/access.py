"""The CEL ``authorizer``'s answers in the server: a SubjectAccessReview per question, asked of the
API server for the submitter (request.userInfo) with a short timeout, and kept a few seconds.

A check that must be asked runs on the evaluation's worker thread (the engine is synchronous; an
evaluation on the event loop gets cached answers only, webhook/admission/reviewer.py), so each check
is bounded by :data:`TIMEOUT` and a request by policies/cel/authz.py MAX_CHECKS. A call that fails (a timeout, a
403 because the service lacks ``create`` on subjectaccessreviews) raises AccessError: the rule
fails closed, saying why. Only answers are cached, never failures; an answer is for the whole
question (request.userInfo with its uid and extra, the resource), so it is only ever reused for
the same one, whoever asks. Without ``serve --client-ca`` anyone who reaches the port can post a
review naming any user, and each may cost up to MAX_CHECKS calls to the API server: the calls of
a caller without a client certificate are rate-limited per address (cached answers are free).
"""
from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict

from trainjob_admission.policies.cel.authz import Access, AccessCheck, AccessError
from trainjob_admission.policies.cel.environment import WouldWait

from ..kube.client import KubeApi, call_json, summary
from ..kube.resources import SUBJECT_ACCESS_REVIEWS
from .callers import AddressLimit, Caller

TIMEOUT = 1.5  # seconds per check: the evaluation has the request's deadline for all of them
TTL = 10.0  # seconds an answer is reused: a revoked permission stops counting this long after
MAX_ENTRIES = 4096
# SubjectAccessReviews per second (and at once) for requests from one address without a client certificate.
UNAUTHENTICATED_RATE, UNAUTHENTICATED_BURST = 20.0, 200


def review_body(check: AccessCheck) -> dict:
    """The SubjectAccessReview that asks ``check``: the attributes ValidatingAdmissionPolicy's
    authorizer gives its authorizer (k8s.io/apiserver/pkg/cel/library/authz.go: the request's
    user.Info whole, a resource check's APIVersion "*"), which the SubjectAccessReview handler
    turns back into the same (pkg/registry/authorization/util/helpers.go AuthorizationAttributesFrom:
    user, groups, uid and extra; an empty version is "*")."""
    spec: dict = {"user": check.user, "groups": list(check.groups)}
    if check.uid:
        spec["uid"] = check.uid
    if check.extra:
        spec["extra"] = {key: list(values) for key, values in check.extra}
    if check.path:
        spec["nonResourceAttributes"] = {"path": check.path, "verb": check.verb}
    else:
        spec["resourceAttributes"] = {key: value for key, value in (
            ("verb", check.verb), ("group", check.group), ("resource", check.resource),
            ("subresource", check.subresource), ("namespace", check.namespace), ("name", check.name)) if value}
        for key, raw in (("fieldSelector", check.field_selector), ("labelSelector", check.label_selector)):
            if raw:
                spec["resourceAttributes"][key] = {"rawSelector": raw}
    return {"apiVersion": SUBJECT_ACCESS_REVIEWS.api_version, "kind": SUBJECT_ACCESS_REVIEWS.kind, "spec": spec}


class SubjectAccessReviews:
    """``reviews(check) -> (allowed, reason)``, the engine's :data:`policies.cel.authz.Access` for an
    authenticated caller; :meth:`for_caller` gives each request's."""

    def __init__(self, api: KubeApi, timeout: float = TIMEOUT, ttl: float = TTL,
                 unauthenticated: AddressLimit | None = None):
        self.api, self.timeout, self.ttl = api, timeout, ttl
        self.unauthenticated = unauthenticated or AddressLimit(UNAUTHENTICATED_RATE, UNAUTHENTICATED_BURST)
        self._answers: OrderedDict[AccessCheck, tuple[float, bool, str]] = OrderedDict()
        self._lock = threading.Lock()

    def for_caller(self, caller: Caller, *, wait: bool = True) -> Access:
        """The checks of a request from ``caller``: those of a caller without a client certificate
        are limited by its address. ``wait=False``: cached answers only, :class:`WouldWait` for any
        other (an evaluation on the event loop must not block it on an API call)."""
        if caller.authenticated and wait:
            return self
        return functools.partial(self._answer, address=None if caller.authenticated else caller.address, wait=wait)

    def __call__(self, check: AccessCheck) -> tuple[bool, str]:
        return self._answer(check)

    def _answer(self, check: AccessCheck, address: str | None = None, wait: bool = True) -> tuple[bool, str]:
        now = time.monotonic()
        with self._lock:
            cached = self._answers.get(check)
            if cached is not None and cached[0] > now:
                return cached[1], cached[2]
            if not wait:
                raise WouldWait("a permission check not answered yet")
            if address is not None and not self.unauthenticated.take(address):
                raise AccessError(f"more permission checks for requests from {address} than "
                                  f"{self.unauthenticated.describe()} (callers without a client certificate are "
                                  "limited; the service runs without --client-ca)")
        try:
            answer = call_json(self.api, "POST", SUBJECT_ACCESS_REVIEWS.path(), body=review_body(check),
                               timeout=(self.timeout, self.timeout))
        except Exception as exc:  # noqa: BLE001 - any failure fails the rule closed, with what it was
            raise AccessError(f"the SubjectAccessReview failed: {summary(exc, self.timeout)}") from None
        status = answer.get("status") or {}
        allowed, reason = status.get("allowed") is True, str(status.get("reason") or "")
        with self._lock:
            self._answers[check] = (now + self.ttl, allowed, reason)
            self._answers.move_to_end(check)
            while len(self._answers) > MAX_ENTRIES:
                self._answers.popitem(last=False)
        return allowed, reason
