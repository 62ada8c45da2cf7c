"""The HTTPS server answering real AdmissionReview v1 JSON over real TLS."""
from __future__ import annotations

import json
import socket
import ssl
import time

import pytest

from trainjob_admission.webhook.admission import server as server_module
from trainjob_admission.webhook.decisionlog import verify

from tests.support.objects import example_job

from .conftest import decode_patch, start_server, stop_server

pytestmark = pytest.mark.server


def test_allowed_job_is_mutated_then_validated(webhook_server):
    mutated = webhook_server.review(example_job("allowed.yaml"), "mutate")
    assert mutated["allowed"] is True
    patch = decode_patch(mutated)
    runtime_patch = next(op for op in patch if op["path"] == "/spec/runtimePatches")["value"][0]
    assert runtime_patch["manager"] == "trainjob-admission.io/webhook"
    for replicated in runtime_patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
        meta = replicated["template"]["spec"]["template"]["metadata"]
        assert meta["annotations"]["sidecar.istio.io/inject"] == "false"
    assert {"op": "add", "path": "/metadata/labels", "value": {"kueue.x-k8s.io/queue-name": "default"}} in patch

    validated = webhook_server.review(example_job("allowed.yaml"), "validate")
    assert validated["allowed"] is True
    decision_id = validated["auditAnnotations"]["decision-id"]
    record = next(r for r in webhook_server.records() if r["id"] == decision_id)
    assert record["decision"] == "allow" and record["user"] == "alice" and record["namespace"] == "team-a"
    assert {i["kind"] for i in record["injections"]} == {"Secret", "NetworkPolicy"}


def test_over_quota_denied_with_numbers_and_fix(webhook_server):
    response = webhook_server.review(example_job("over-quota.yaml"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    message = response["status"]["message"]
    assert "job needs 32 nvidia.com/gpu" in message and "24 are in use" in message
    assert "set spec.trainer.numNodes to 2, or ask your admin to raise the quota" in message


def test_privileged_runtime_denied(webhook_server):
    response = webhook_server.review(example_job("privileged.yaml"))
    assert response["allowed"] is False
    assert "securityContext.privileged" in response["status"]["message"]


def test_legacy_mpijob_gets_deprecation_warning(webhook_server):
    response = webhook_server.review(example_job("legacy-mpijob.yaml"))
    assert response["allowed"] is True
    assert any("deprecated" in w for w in response["warnings"])


def test_dry_run_plans_no_injection(webhook_server):
    response = webhook_server.review(example_job("allowed.yaml"), dryRun=True)
    record = next(r for r in webhook_server.records() if r["id"] == response["auditAnnotations"]["decision-id"])
    assert record["dryRun"] is True
    assert all(i.get("status") == "planned" for i in record["injections"])


@pytest.mark.parametrize("body, expected", [
    (b"not json", "not JSON"),
    (b"[]", "not a JSON object"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "uid"),
])
def test_malformed_body_gets_400_and_is_logged(webhook_server, body, expected):
    status, payload = webhook_server.post("/validate", body)
    assert status == 400
    assert expected in payload["error"]
    record = next(r for r in webhook_server.records() if r["id"] == payload["decisionId"])
    assert record["decision"] == "error" and record["allowed"] is False


def test_wrong_api_version_with_uid_is_refused_in_its_own_terms(webhook_server):
    status, payload = webhook_server.post("/validate", {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                                                        "request": {"uid": "u-1"}})
    assert status == 200
    assert payload["response"]["uid"] == "u-1" and payload["response"]["allowed"] is False


def test_deeply_nested_object_is_refused(webhook_server):
    obj = example_job("allowed.yaml")
    nested: dict = {}
    cursor = nested
    for _ in range(500):
        cursor["x"] = {}
        cursor = cursor["x"]
    obj["spec"]["extra"] = nested
    response = webhook_server.review(obj)
    assert response["allowed"] is False and "nested deeper" in response["status"]["message"]


def test_body_over_limit_is_refused_and_logged(webhook_server):
    status, body = webhook_server.post("/validate", b"{" + b" " * (server_module.MAX_BODY_BYTES + 10) + b"}")
    assert status == 413
    (record,) = [r for r in webhook_server.records() if r["id"] == body["decisionId"]]
    assert record["decision"] == "error" and record["httpStatus"] == 413 and record["allowed"] is False


def test_a_caller_gone_mid_body_is_recorded_without_a_traceback(webhook_server, caplog):
    """A client (or an API server timing out) that closes its connection halfway through a body
    leaves a record of what happened, not an aiohttp 'Error handling request' traceback in the log."""
    before = len(webhook_server.records())
    with socket.create_connection(("127.0.0.1", webhook_server.port), timeout=5) as raw:
        with webhook_server.client_context().wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 100000\r\n\r\n{\"apiVersion\": ")
    deadline = time.monotonic() + 10
    while len(webhook_server.records()) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    (record,) = webhook_server.records()[before:]
    assert record["httpStatus"] == 400 and record["allowed"] is False
    assert record["messages"] == ["the connection closed before the request body arrived"]
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br"])
def test_compressed_body_is_refused_unread_and_logged(webhook_server, encoding):
    """A 3.5 KB gzip body that inflates to 3 MB would slip past the size and in-flight bounds,
    which count the bytes sent."""
    import gzip
    import http.client

    body = gzip.compress(json.dumps({"x": "a" * 3_000_000}).encode())
    conn = http.client.HTTPSConnection("localhost", webhook_server.port, context=webhook_server.client_context(),
                                       timeout=10)
    conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json",
                                                          "Content-Encoding": encoding})
    reply = conn.getresponse()
    payload = json.loads(reply.read())
    conn.close()
    assert reply.status == 415 and "send the AdmissionReview uncompressed" in payload["error"]
    (record,) = [r for r in webhook_server.records() if r["id"] == payload["decisionId"]]
    assert record["httpStatus"] == 415 and record["allowed"] is False


def test_tls_1_1_client_is_refused(webhook_server):
    context = webhook_server.client_context()
    context.minimum_version = ssl.TLSVersion.TLSv1
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError):
        with socket.create_connection(("127.0.0.1", webhook_server.port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="localhost"):
                pass


def test_health_ready_and_metrics(webhook_server):
    assert webhook_server.get("/healthz") == (200, "ok")
    assert webhook_server.get("/readyz") == (200, "ok")
    webhook_server.review(example_job("over-quota.yaml"))
    status, text = webhook_server.get("/metrics")
    assert status == 200
    assert ('trainjob_admission_requests_total{decision="deny",endpoint="validate",kind="TrainJob",operation="CREATE"} '
            '1.0') in text
    assert 'trainjob_admission_rule_results_total{bundle="default",effect="deny",rule="quota"} 1.0' in text
    assert "trainjob_admission_certificate_expiry_timestamp_seconds" in text
    assert "trainjob_admission_request_duration_seconds_bucket" in text
    # the decision log's background fsync (default every 0.1 s) reports how long the disk took
    for _ in range(50):
        if "trainjob_admission_decision_log_fsync_seconds_count 0.0" not in text:
            break
        time.sleep(0.05)
        text = webhook_server.get("/metrics")[1]
    assert "trainjob_admission_decision_log_fsync_seconds_count" in text
    assert "trainjob_admission_decision_log_fsync_seconds_count 0.0" not in text, text


BUNDLE = """
apiVersion: policy.trainjob-admission.io/v1alpha1
kind: PolicyBundle
metadata: {{name: gpu-cap}}
spec:
  version: "{version}"
  params: {{maxJobGpus: {cap}}}
  validations:
    - name: cap
      expression: {expression}
      message: too many GPUs
"""


def test_bundle_reload_keeps_last_good_version(tmp_path):
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(BUNDLE.format(version="1", cap=100, expression="job.totals.gpus <= params.maxJobGpus"))
    running, thread = start_server(tmp_path, bundle_specs=[str(bundle)])
    try:
        assert running.review(example_job("allowed.yaml"))["allowed"] is True
        bundle.write_text(BUNDLE.format(version="2", cap=2, expression="job.totals.gpus <= "))  # broken
        deadline = time.monotonic() + 5
        while not running.server.registry.errors and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [b.version for b in running.server.registry.active] == ["1"]
        assert running.review(example_job("allowed.yaml"))["allowed"] is True
        assert "syntax error" in next(iter(running.server.registry.errors.values()))
        bundle.write_text(BUNDLE.format(version="3", cap=2, expression="job.totals.gpus <= params.maxJobGpus"))
        deadline = time.monotonic() + 5
        while [b.version for b in running.server.registry.active] != ["3"] and time.monotonic() < deadline:
            time.sleep(0.1)
        response = running.review(example_job("allowed.yaml"))
        assert response["allowed"] is False and "too many GPUs" in response["status"]["message"]
        _, metrics = running.get("/metrics")
        assert 'trainjob_admission_bundle_reloads_total{result="failure"}' in metrics
    finally:
        stop_server(running, thread)


def test_log_verifies_after_traffic(webhook_server):
    for name in ("allowed.yaml", "over-quota.yaml", "legacy-mpijob.yaml"):
        webhook_server.review(example_job(name), "mutate")
        webhook_server.review(example_job(name), "validate")
    report = verify([webhook_server.log_path])
    assert report.ok, str(report)
    assert len(webhook_server.records()) == 6
    assert "BEGIN" not in webhook_server.log_path.read_text()  # never key material


def test_unparseable_quota_in_state_does_not_crash(webhook_server):
    webhook_server.server.state.upsert({"kind": "ResourceQuota", "metadata": {"name": "junk", "namespace": "team-a"},
                                        "status": {"hard": {"pods": "lots"}}})
    assert webhook_server.review(example_job("allowed.yaml"))["allowed"] is True
    assert json.loads(json.dumps(webhook_server.records()[-1]))["decision"] == "allow"


def test_ill_typed_job_is_denied_with_a_job_model_reason_and_logged(webhook_server):
    bad = example_job("allowed.yaml")
    bad["spec"]["trainer"] = ["not", "a", "mapping"]  # the API server's schema check runs after /mutate
    response = webhook_server.review(bad)
    assert response["allowed"] is False
    assert "is not of the type its schema requires" in response["status"]["message"], response["status"]["message"]
    record = webhook_server.records()[-1]
    assert record["decision"] == "deny" and any(r["rule"] == "job-model" for r in record["rules"])


def test_a_stopping_server_answers_its_open_connections_and_closes_each_after_its_answer(tmp_path):
    """The API server reuses its connection to a replica that has left the endpoints: a request on it
    after SIGTERM is answered (not cut: that would fail an admission with EOF), with Connection:
    close, so the API server dials again; the stop then completes as soon as no connection is left."""
    import asyncio
    import http.client

    from trainjob_admission.webhook.cli.demo import admission_review

    running, thread = start_server(tmp_path)
    conn = http.client.HTTPSConnection("localhost", running.port, context=running.client_context(), timeout=10)
    body = json.dumps(admission_review(example_job("allowed.yaml"))).encode()
    try:
        conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
        first = conn.getresponse()
        first.read()
        assert first.status == 200 and first.getheader("Connection", "").lower() != "close"
        started = time.monotonic()
        stopping = asyncio.run_coroutine_threadsafe(running.server.stop(), running.loop)
        time.sleep(0.5)  # draining: no new connections, the open one still served
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", running.port), timeout=2)
        conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
        second = conn.getresponse()
        assert second.status == 200 and json.loads(second.read())["response"]["allowed"] is True
        assert second.getheader("Connection", "").lower() == "close"
        stopping.result(15)
        assert time.monotonic() - started < server_module.DRAIN_SECONDS, "the stop waited for a connection gone"
    finally:
        conn.close()
        running.loop.call_soon_threadsafe(running.loop.stop)
        thread.join(15)


def test_a_refusal_counts_once_and_a_deletion_is_recorded(webhook_server):
    """Issue 31: /mutate answers a job /validate refuses with allowed (no patch), and says so in its
    record and the metrics, so the refusal is counted once, as submitters saw it; a DELETE (the
    fail-open entry of manifests/base/webhooks.yaml) is recorded with who deleted the job and its state.
    Unpatched: /validate then judges the job as submitted, so a label a bundle would add cannot
    change which bundles match it or how the checks read it (issue 33's review)."""
    job = example_job("over-quota.yaml")
    mutated = webhook_server.review(job, "mutate")
    refused = webhook_server.review(job, "validate")
    assert mutated["allowed"] is True and refused["allowed"] is False
    assert "patch" not in mutated, mutated
    stored = {**example_job("allowed.yaml"), "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    deleted = webhook_server.review(stored, "validate", operation="DELETE", object=None, oldObject=stored,
                                    userInfo={"username": "bob", "groups": ["team-a"]})
    assert deleted["allowed"] is True
    mutate_record, validate_record, deletion = webhook_server.records()[-3:]
    assert (mutate_record["endpoint"], mutate_record["decision"], mutate_record["allowed"]) == ("mutate", "allow", True)
    assert mutate_record["messages"] == [] and validate_record["decision"] == "deny"
    assert (deletion["operation"], deletion["user"], deletion["name"], deletion["jobStatus"]["state"]) == (
        "DELETE", "bob", "resnet-allreduce", "Complete")
    _, text = webhook_server.get("/metrics")
    counts = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(("trainjob_admission_requests_total{", "trainjob_admission_rule_results_total{"))}
    assert counts['trainjob_admission_requests_total{decision="allow",endpoint="mutate",kind="TrainJob",'
                  'operation="CREATE"}'] >= 1
    assert not any('endpoint="mutate"' in key and 'decision="deny"' in key for key in counts)
    assert counts['trainjob_admission_requests_total{decision="allow",endpoint="validate",kind="TrainJob",'
                  'operation="DELETE"}'] == 1
    quota = counts['trainjob_admission_rule_results_total{bundle="default",effect="deny",rule="quota"}']
    denials = sum(v for k, v in counts.items() if 'decision="deny",endpoint="validate"' in k)
    assert quota == denials  # one count per refused submission, not one per webhook call
