"""`serve --client-ca`: /validate and /mutate answer only callers whose client certificate the
client CA signed; everyone else is refused in the TLS handshake, before a byte of HTTP. Probes and
metrics stay reachable without a certificate on the probe port. Real TLS, trustme CAs."""
from __future__ import annotations

import http.client
import json
import os
import ssl
import time
from pathlib import Path

import pytest
import trustme

from trainjob_admission.webhook.cli.demo import admission_review

from tests.support.net import refused_at_tls
from tests.support.objects import example_job

from .conftest import Running, start_server, stop_server

pytestmark = pytest.mark.server


@pytest.fixture
def client_ca(tmp_path: Path) -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def mtls_server(tmp_path: Path, client_ca: trustme.CA):
    ca_file = tmp_path / "client-ca.crt"
    client_ca.cert_pem.write_to_path(str(ca_file))
    running, thread = start_server(tmp_path, client_ca_file=ca_file, probe_port=0)
    yield running
    stop_server(running, thread)


def context(running: Running, issuer: trustme.CA | None, name: str = "kube-apiserver") -> ssl.SSLContext:
    """A client trusting the server, with a client certificate from ``issuer`` (none if None)."""
    ctx = running.client_context()
    if issuer is not None:
        issuer.issue_cert(name, common_name=name).configure_cert(ctx)
    return ctx


def request(port: int, ctx: ssl.SSLContext, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
    try:
        conn.request(method, path, body=json.dumps(body).encode() if body is not None else None,
                     headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


def refused(running: Running, issuer: trustme.CA | None) -> None:
    refused_at_tls(running.port, lambda: context(running, issuer), server_hostname="localhost")


def test_no_client_certificate_is_refused_in_the_handshake(mtls_server: Running):
    refused(mtls_server, None)
    assert mtls_server.records() == []  # refused before HTTP: no request, so no decision


def test_certificate_from_another_ca_is_refused(mtls_server: Running):
    refused(mtls_server, trustme.CA())
    assert mtls_server.records() == []


def test_the_client_cas_certificate_is_answered_and_recorded_as_authenticated(mtls_server: Running,
                                                                              client_ca: trustme.CA):
    status, body = request(mtls_server.port, context(mtls_server, client_ca), "POST", "/validate",
                           admission_review(example_job("allowed.yaml")))
    assert status == 200, body
    response = json.loads(body)["response"]
    assert response["allowed"] is True
    (record,) = mtls_server.records()
    assert record["id"] == response["auditAnnotations"]["decision-id"]
    assert record["caller"] == {"authenticated": True, "subject": "kube-apiserver", "address": "127.0.0.1"}


def test_probes_and_metrics_need_no_certificate_on_the_probe_port(mtls_server: Running):
    probe = mtls_server.server.probe_port
    no_cert = context(mtls_server, None)
    for path in ("/healthz", "/readyz", "/metrics"):
        assert request(probe, no_cert, "GET", path)[0] == 200, path
    # the probe port serves no admission endpoint: a forged review cannot go that way
    status, _ = request(probe, no_cert, "POST", "/validate", admission_review(example_job("allowed.yaml")))
    assert status in (404, 405)
    assert mtls_server.records() == []


def test_a_replaced_client_ca_is_used_for_new_connections(mtls_server: Running, client_ca: trustme.CA,
                                                          tmp_path: Path):
    rotated = trustme.CA()
    ca_file = tmp_path / "client-ca.crt"
    rotated.cert_pem.write_to_path(str(ca_file))
    os.utime(ca_file, ns=(0, 0))  # a new mtime even within the file system's timestamp granularity
    deadline = time.monotonic() + 10
    while True:  # the reload loop polls every 0.2 s here
        try:
            request(mtls_server.port, context(mtls_server, rotated), "GET", "/healthz")
            break
        except (ssl.SSLError, ConnectionError):
            assert time.monotonic() < deadline, "the new client CA was not loaded"
            time.sleep(0.1)
    refused(mtls_server, client_ca)  # the old CA is trusted no more


def test_without_client_ca_records_say_unauthenticated(webhook_server: Running):
    response = webhook_server.review(example_job("allowed.yaml"))
    (record,) = webhook_server.records()
    assert record["id"] == response["auditAnnotations"]["decision-id"]
    assert record["caller"] == {"authenticated": False, "subject": None, "address": "127.0.0.1"}
