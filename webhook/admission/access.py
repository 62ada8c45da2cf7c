"""The CEL ``authorizer``'s answers in the server: a SubjectAccessReview per question, asked of the
API server for the submitter (request.userInfo) with a short timeout, and kept a few seconds.

It runs on the evaluation's worker thread (the engine is synchronous), so each check is bounded by
:data:`TIMEOUT` and a request by policies/cel/authz.py MAX_CHECKS. A call that fails (a timeout, a
403 because the service lacks ``create`` on subjectaccessreviews) raises AccessError: the rule
fails closed, saying why. Only answers are cached, never failures.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict

from trainjob_admission.policies.cel.authz import AccessCheck, AccessError

from ..kube.client import KubeApi, call_json, summary
from ..kube.resources import SUBJECT_ACCESS_REVIEWS

TIMEOUT = 1.5  # seconds per check: the evaluation has the request's deadline for all of them
TTL = 10.0  # seconds an answer is reused: a revoked permission stops counting this long after
MAX_ENTRIES = 4096


def review_body(check: AccessCheck) -> dict:
    """The SubjectAccessReview that asks ``check``."""
    spec: dict = {"user": check.user, "groups": list(check.groups)}
    if check.uid:
        spec["uid"] = check.uid
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
    """``reviews(check) -> (allowed, reason)``, the engine's :data:`policies.cel.authz.Access`."""

    def __init__(self, api: KubeApi, timeout: float = TIMEOUT, ttl: float = TTL):
        self.api, self.timeout, self.ttl = api, timeout, ttl
        self._answers: OrderedDict[AccessCheck, tuple[float, bool, str]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, check: AccessCheck) -> tuple[bool, str]:
        now = time.monotonic()
        with self._lock:
            cached = self._answers.get(check)
            if cached is not None and cached[0] > now:
                return cached[1], cached[2]
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
