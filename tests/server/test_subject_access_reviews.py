"""webhook/admission/access.py against a real HTTPS listener on loopback standing in for the API server:
one SubjectAccessReview per new question, answers reused, a refusal (403) or silence an AccessError,
never asked from the event loop;
request.userInfo's uid and extra forwarded as ValidatingAdmissionPolicy's authorizer passes them and
part of what an answer is reused for (issue 30: a token OpenShift scoped to user:info passed a rule
requiring create secrets); the checks of callers without a client certificate rate-limited per address."""
from __future__ import annotations

import json
import ssl
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trainjob_admission.policies.cel.authz import AccessCheck, AccessError, extra_of
from tests.support.objects import example_job
from tests.support.serve import send_json
from trainjob_admission.webhook.admission.access import SubjectAccessReviews
from trainjob_admission.webhook.admission.callers import AddressLimit, Caller

from . import test_injection_failures
from .conftest import serving_cert, start_server, stop_server
from .test_injection_failures import api_client

pytestmark = pytest.mark.server
silent_api = test_injection_failures.silent_api  # a listener that never answers
SECRETS = AccessCheck("alice", ("team-a",), "", "create", "", "secrets", "", "team-a", "")


SCOPES = "scopes.authorization.openshift.io"


def openshift_like(spec: dict) -> bool:
    """The stand-in authorizer (OpenShift's scope authorizer cannot run here): RBAC-like, alice and
    every name starting with "user-" may do anything, unless the request's extra carries scopes
    (a scoped token) and none of them is user:full; "user:info" only lets one read who one is."""
    scopes = (spec.get("extra") or {}).get(SCOPES)
    return (spec["user"] == "alice" or spec["user"].startswith("user-")) and (scopes is None or "user:full" in scopes)


@pytest.fixture
def sar_api(tmp_path: Path):
    """(port, reviews posted): answers as :func:`openshift_like`; 403 for user "forbidden"."""
    posted: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            posted.append(review)
            user = review["spec"]["user"]
            status = 403 if user == "forbidden" else 201
            send_json(self, status, {**review, "status": {"allowed": openshift_like(review["spec"]),
                                                          "reason": "RBAC: test"}}
                      if status == 201 else {"kind": "Status", "code": 403, "reason": "Forbidden", "message": "no"})

        def log_message(self, *args: object) -> None:
            pass

    serving_cert(tmp_path / "sar-tls")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "sar-tls" / "tls.crt", tmp_path / "sar-tls" / "tls.key")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], posted
    server.shutdown()
    server.server_close()


def test_each_question_is_asked_once_and_answered(sar_api):
    port, posted = sar_api
    reviews = SubjectAccessReviews(api_client(port))
    assert reviews(SECRETS) == (True, "RBAC: test")
    assert reviews(SECRETS) == (True, "RBAC: test")  # from the cache
    assert reviews(AccessCheck("bob", (), "", "create", resource="secrets", namespace="team-a"))[0] is False
    assert [p["spec"]["user"] for p in posted] == ["alice", "bob"]
    assert posted[0]["spec"]["resourceAttributes"] == {"verb": "create", "resource": "secrets", "namespace": "team-a"}


def test_a_refused_review_is_an_access_error_and_not_cached(sar_api):
    port, posted = sar_api
    reviews = SubjectAccessReviews(api_client(port))
    forbidden = AccessCheck("forbidden", (), "", "create", resource="secrets")
    for _ in range(2):
        with pytest.raises(AccessError, match="the SubjectAccessReview failed: HTTP 403 Forbidden"):
            reviews(forbidden)
    assert len(posted) == 2


def test_an_api_that_does_not_answer_is_an_access_error(silent_api):
    reviews = SubjectAccessReviews(api_client(silent_api), timeout=0.3)
    with pytest.raises(AccessError, match="did not answer within 0.3 s"):
        reviews(SECRETS)


def test_uid_and_extra_are_forwarded_and_part_of_the_question(sar_api):
    port, posted = sar_api
    reviews = SubjectAccessReviews(api_client(port))
    scoped = replace(SECRETS, uid="u-1", extra=extra_of({SCOPES: ["user:info"]}))
    assert reviews(SECRETS)[0] is True
    assert reviews(scoped)[0] is False, "the unscoped answer was reused for the scoped token"
    assert reviews(replace(scoped, extra=extra_of({SCOPES: ["user:full"]})))[0] is True
    assert reviews(scoped)[0] is False  # from the cache, still the scoped token's own answer
    assert len(posted) == 3
    assert posted[1]["spec"] == {"user": "alice", "groups": ["team-a"], "uid": "u-1", "extra": {SCOPES: ["user:info"]},
                                 "resourceAttributes": {"verb": "create", "resource": "secrets", "namespace": "team-a"}}


SECRETS_BUNDLE = """apiVersion: policy.trainjob-admission.io/v1alpha1
kind: PolicyBundle
metadata: {name: may-create-secrets}
spec:
  validations:
    - name: may-create-secrets
      expression: "authorizer.group('').resource('secrets').namespace(object.metadata.namespace).check('create').allowed()"
      message: only members allowed to create Secrets here may submit
"""


@pytest.fixture
def authorizing_server(tmp_path: Path, sar_api):
    """The server with the default bundle and a rule asking the stand-in API server; checks of
    callers without a client certificate limited to bursts of 5 per address, no refill in a test."""
    port, posted = sar_api
    (tmp_path / "secrets.yaml").write_text(SECRETS_BUNDLE)
    access = SubjectAccessReviews(api_client(port), unauthenticated=AddressLimit(1e-6, 5))
    (tmp_path / "server").mkdir()
    running, thread = start_server(tmp_path / "server", ["builtin:default", str(tmp_path / "secrets.yaml")],
                                   access=access)
    yield running, posted
    stop_server(running, thread)


def test_a_scoped_token_is_judged_by_its_scopes(authorizing_server):
    """Before: userInfo.extra was dropped, so a token scoped to user:info passed as its user."""
    running, posted = authorizing_server
    job = example_job("allowed.yaml")
    scoped = {"username": "alice", "uid": "a-1", "groups": ["system:authenticated"],
              "extra": {SCOPES: ["user:info"], "authentication.kubernetes.io/credential-id": ["JTI=1"]}}
    denied = running.review(job, userInfo=scoped)
    assert denied["allowed"] is False and "only members allowed to create Secrets" in denied["status"]["message"]
    assert running.review(job, userInfo={**scoped, "extra": {SCOPES: ["user:full"]}})["allowed"] is True
    assert [p["spec"].get("extra") for p in posted] == [scoped["extra"], {SCOPES: ["user:full"]}]
    assert {p["spec"]["uid"] for p in posted} == {"a-1"}
    malformed = running.review(job, userInfo={**scoped, "extra": {SCOPES: "user:full"}})  # not a list: never coerced
    assert malformed["allowed"] is False and "userInfo.extra is not a map of string lists" in malformed["status"]["message"]


def evaluations(running) -> dict[str, float]:
    """Engine evaluations so far by where they ran: "loop" (the event loop) or "worker" (a worker thread)."""
    registry = running.server.metrics.registry
    return {where: registry.get_sample_value("trainjob_admission_evaluations_total", {"where": where}) or 0
            for where in ("loop", "worker")}


def test_the_event_loop_never_waits_on_a_permission_check(authorizing_server):
    """A small review is decided on the event loop only while every check it needs is answered from
    the cache; one that must ask the API server starts over on a worker thread, asking once."""
    running, posted = authorizing_server
    job = example_job("allowed.yaml")
    assert running.review(job, userInfo={"username": "alice"})["allowed"] is True
    assert evaluations(running) == {"loop": 0, "worker": 1}
    assert running.review(job, userInfo={"username": "alice"})["allowed"] is True  # the answer is cached now
    assert evaluations(running) == {"loop": 1, "worker": 1}
    assert running.review(job, userInfo={"username": "bob"})["allowed"] is False
    assert evaluations(running) == {"loop": 1, "worker": 2}
    assert [p["spec"]["user"] for p in posted] == ["alice", "bob"]


def test_checks_of_callers_without_a_client_certificate_are_rate_limited(authorizing_server):
    """Before: a forged review naming a new user each time made the service send up to 16
    SubjectAccessReviews per request, without limit."""
    running, posted = authorizing_server
    job = example_job("allowed.yaml")
    answers = [running.review(job, userInfo={"username": f"user-{i}"}) for i in range(12)]
    assert len(posted) == 5, "more SubjectAccessReviews than the address's burst"
    assert [a["allowed"] for a in answers] == [True] * 5 + [False] * 7  # past it the rule fails closed
    assert "more permission checks for requests from 127.0.0.1" in answers[-1]["status"]["message"]
    assert running.review(job, userInfo={"username": "user-0"})["allowed"] is True  # a cached answer is free
    assert len(posted) == 5


def test_an_authenticated_caller_and_other_addresses_have_their_own_budget(sar_api):
    port, posted = sar_api
    reviews = SubjectAccessReviews(api_client(port), unauthenticated=AddressLimit(1e-6, 1))
    forged, other = reviews.for_caller(Caller("10.0.0.9")), reviews.for_caller(Caller("10.0.0.10"))
    assert forged(replace(SECRETS, user="user-1"))[0] is True
    with pytest.raises(AccessError, match="more permission checks for requests from 10.0.0.9"):
        forged(replace(SECRETS, user="user-2"))
    assert other(replace(SECRETS, user="user-2"))[0] is True
    api_server = reviews.for_caller(Caller("10.0.0.9", authenticated=True, subject="kube-apiserver"))
    assert all(api_server(replace(SECRETS, user=f"user-{i}"))[0] for i in range(3, 8))
    assert len(posted) == 7
