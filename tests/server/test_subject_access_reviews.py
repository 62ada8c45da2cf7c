"""webhook/admission/access.py against a real HTTPS listener on loopback standing in for the API server:
one SubjectAccessReview per new question, answers reused, a refusal (403) or silence an AccessError."""
from __future__ import annotations

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trainjob_admission.policies.cel.authz import AccessCheck, AccessError
from tests.support.serve import send_json
from trainjob_admission.webhook.admission.access import SubjectAccessReviews

from . import test_injection_failures
from .conftest import serving_cert
from .test_injection_failures import api_client

pytestmark = pytest.mark.server
silent_api = test_injection_failures.silent_api  # a listener that never answers
SECRETS = AccessCheck("alice", ("team-a",), "", "create", "", "secrets", "", "team-a", "")


@pytest.fixture
def sar_api(tmp_path: Path):
    """(port, reviews posted): allows alice, refuses everyone else; 403 for user "forbidden"."""
    posted: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            posted.append(review)
            user = review["spec"]["user"]
            status = 403 if user == "forbidden" else 201
            send_json(self, status, {**review, "status": {"allowed": user == "alice", "reason": "RBAC: test"}}
                      if status == 201 else {"kind": "Status", "code": 403, "reason": "Forbidden", "message": "no"})

        def log_message(self, *args: object) -> None:
            pass

    serving_cert(tmp_path / "tls")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls" / "tls.crt", tmp_path / "tls" / "tls.key")
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
