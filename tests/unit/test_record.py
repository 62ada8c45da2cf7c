"""webhook.admission.record.DecisionRecord: which keys each kind of record has, and that they are written
as the plain JSON the decision log has always held."""
from __future__ import annotations

import json

import pytest

from trainjob_admission.webhook.admission import protocol
from trainjob_admission.webhook.admission.record import DecisionRecord
from trainjob_admission.webhook.decisionlog import canonical

EVALUATED = {"id", "endpoint", "decision", "allowed", "uid", "operation", "kind", "namespace", "name", "user", "groups"}
# "facts": the default bundle's Kueue check records the queue it judged (here: LocalQueues unknown)
DECIDED = EVALUATED | {"dryRun", "bundles", "rules", "messages", "warnings", "patch", "injections", "job", "facts", "cluster"}


def parsed_review(obj: dict, operation: str = "CREATE", dry_run: bool = False) -> protocol.ParsedReview:
    group, version = obj["apiVersion"].split("/")
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "req-1", "kind": {"group": group, "version": version, "kind": obj["kind"]}, "operation": operation,
        "object": obj, "userInfo": {"username": "alice", "groups": ["team-a"]}, "dryRun": dry_run}}
    return protocol.parse(json.dumps(body).encode())


@pytest.fixture
def over_quota(example_job, example_state, default):
    from trainjob_admission.policies.decide.engine import evaluate

    parsed = parsed_review(example_job("over-quota"))
    return parsed, evaluate(parsed.request, default, example_state)


@pytest.fixture
def allowed(example_job, example_state, default):
    from trainjob_admission.policies.decide.engine import evaluate

    parsed = parsed_review(example_job("allowed"))
    return parsed, evaluate(parsed.request, default, example_state)


def test_refused_and_malformed_have_no_submission():
    assert DecisionRecord.refused("d", "validate", 413, "too large").as_log_fields() == {
        "id": "d", "endpoint": "validate", "decision": "error", "allowed": False, "messages": ["too large"],
        "httpStatus": 413}
    assert DecisionRecord.malformed("d", "mutate", "", "not JSON").as_log_fields() == {
        "id": "d", "endpoint": "mutate", "decision": "error", "allowed": False, "uid": "", "messages": ["not JSON"]}


def test_passthrough_has_uid_and_operation_only():
    parsed = protocol.parse(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                         "request": {"uid": "u", "operation": "DELETE"}}).encode())
    assert DecisionRecord.passthrough("d", "validate", parsed).as_log_fields() == {
        "id": "d", "endpoint": "validate", "decision": "allow", "allowed": True, "uid": "u", "operation": "DELETE"}


def test_failed_names_the_submission_and_the_error(allowed):
    parsed, _ = allowed
    fields = DecisionRecord.failed("d", "validate", parsed, allowed=False, message="could not", error="E: x").as_log_fields()
    assert set(fields) == EVALUATED | {"messages", "error"}
    assert (fields["user"], fields["groups"], fields["namespace"], fields["name"]) == (
        "alice", ["team-a"], "team-a", parsed.request.object["metadata"]["name"])
    assert fields["decision"] == "error" and fields["error"] == "E: x" and fields["messages"] == ["could not"]


def test_decided_on_each_endpoint(allowed):
    parsed, decision = allowed
    mutate = DecisionRecord.mutated("d", parsed, decision, decision.patch, []).as_log_fields()
    validate = DecisionRecord.decided("d", parsed, decision, []).as_log_fields()
    assert set(mutate) == set(validate) == DECIDED
    assert (mutate["endpoint"], validate["endpoint"]) == ("mutate", "validate")
    assert mutate["patch"] == decision.patch and mutate["patch"]  # each op with its value: nothing to redact here
    assert mutate["injections"] == [] and validate["patch"] == []
    assert validate["injections"] == [{**i, "status": "planned"} for i in decision.injections] and validate["injections"]
    created = [{"kind": "Secret", "name": "s", "namespace": "team-a", "status": "created"}]
    assert DecisionRecord.decided("d", parsed, decision, created).as_log_fields()["injections"] == created


def test_the_mutate_record_of_a_denial_says_what_mutate_answered(over_quota):
    """Issue 31: /mutate answers allowed (refusals come from /validate, once); its record said
    deny, allowed false, with the refusal's messages, and auditors counted each refusal twice."""
    parsed, decision = over_quota
    tag = [{"op": "remove", "path": "/metadata/annotations/trainjob-admission.io~1admission-id"}]
    mutate = DecisionRecord.mutated("d", parsed, decision, tag, []).as_log_fields()
    assert (mutate["decision"], mutate["allowed"], mutate["messages"], mutate["warnings"]) == ("allow", True, [], [])
    assert mutate["patch"] == tag  # the patch it gave, not the policy's (none for a refused job)
    assert any(r["rule"] == "quota" and r["result"] == "fail" for r in mutate["rules"])  # what its evaluation found
    validate = DecisionRecord.decided("d", parsed, decision, []).as_log_fields()
    assert (validate["decision"], validate["allowed"]) == ("deny", False) and validate["messages"]


def deletion_review(status: dict | None, kind: str = "TrainJob", group: str = "trainer.kubeflow.org",
                    version: str = "v1alpha1") -> protocol.ParsedReview:
    stored = {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": {"name": "done", "namespace": "team-a"},
              "spec": {}, **({"status": status} if status is not None else {})}
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u", "kind": {"group": group, "version": version, "kind": kind}, "operation": "DELETE",
        "namespace": "team-a", "name": "done", "object": None, "oldObject": stored,
        "userInfo": {"username": "bob", "groups": ["team-a"]}}}
    return protocol.parse(json.dumps(body).encode())


@pytest.mark.parametrize("status, state", [
    (None, "Pending"),
    ({"conditions": [{"type": "Complete", "status": "True"}]}, "Complete"),
    ({"conditions": [{"type": "Failed", "status": "True"}, {"type": "Suspended", "status": "False"}]}, "Failed"),
    ({"conditions": [{"type": "Suspended", "status": "True"}]}, "Suspended"),
    ({"jobsStatus": [{"name": "node", "active": 2, "ready": 2}]}, "Running"),
])
def test_a_deletion_records_who_and_the_jobs_state(status, state):
    parsed = deletion_review(status)
    assert parsed.deletion
    fields = DecisionRecord.deleted("d", "validate", parsed).as_log_fields()
    assert set(fields) == EVALUATED | {"dryRun", "jobStatus"}
    assert (fields["operation"], fields["user"], fields["namespace"], fields["name"], fields["kind"]) == (
        "DELETE", "bob", "team-a", "done", "TrainJob")
    assert fields["jobStatus"]["state"] == state and fields["allowed"] is True


def test_an_mpijob_deletion_reads_its_own_conditions():
    parsed = deletion_review({"conditions": [{"type": "Created", "status": "True"},
                                             {"type": "Succeeded", "status": "True"}]},
                             kind="MPIJob", group="kubeflow.org", version="v2beta1")
    assert DecisionRecord.deleted("d", "validate", parsed).as_log_fields()["jobStatus"] == {
        "state": "Complete", "conditions": ["Created", "Succeeded"]}


def test_decided_denial_is_written_as_plain_json(over_quota):
    parsed, decision = over_quota
    line = json.loads(canonical(DecisionRecord.decided("d", parsed, decision, []).as_log_fields()))
    assert line["decision"] == "deny" and line["allowed"] is False
    assert {"bundle": "default", "rule": "quota", "result": "fail", "effect": "deny",
            "messages": decision.results[0].messages} in line["rules"]
    assert line["messages"] == [m["message"] for m in decision.messages]


def test_job_is_null_not_absent_when_it_could_not_be_built(example_job, default):
    from trainjob_admission.policies.decide.engine import evaluate
    from trainjob_admission.policies.k8s.clusterstate import ClusterState

    parsed = parsed_review(example_job("allowed"))
    decision = evaluate(parsed.request, default, ClusterState())  # no runtime: no effective job
    fields = DecisionRecord.decided("d", parsed, decision, []).as_log_fields()
    assert "job" in fields and fields["job"] is None


def test_injection_failed_has_a_decisions_keys_but_the_patch(allowed):
    parsed, decision = allowed
    failed = [{"kind": "Secret", "name": "s", "namespace": "team-a", "status": "failed", "reason": "timeout"}]
    fields = DecisionRecord.injection_failed("d", "validate", parsed, decision, allowed=True, message="admitted without",
                                             injected=failed).as_log_fields()
    assert set(fields) == DECIDED - {"patch"}
    assert fields["decision"] == "error" and fields["allowed"] is True and fields["injections"] == failed


def test_submitter_strings_are_bounded_in_records(example_job, example_state, default):
    """A forged multi-megabyte username, name or group list must not make records megabytes long
    (about 100 such requests used to rotate the whole on-disk log away)."""
    from trainjob_admission.policies.decide.engine import evaluate

    obj = example_job("allowed")
    obj["metadata"]["name"] = "n" * 100_000
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u" * 100_000, "kind": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": "TrainJob"},
        "operation": "CREATE", "object": obj,
        "userInfo": {"username": "x" * 2_000_000, "groups": [f"g{i}" for i in range(10_000)]}}}
    parsed = protocol.parse(json.dumps(body).encode())
    fields = DecisionRecord.decided("id", parsed, evaluate(parsed.request, default, example_state), []).as_log_fields()
    assert len(canonical(fields)) < 20_000
    assert fields["user"] == "x" * 512 + "...[+1999488 chars]"
    assert fields["name"].endswith("...[+99488 chars]") and len(fields["uid"]) == 128
    assert len(fields["groups"]) == 65 and fields["groups"][-1] == "...[+9936 groups]"


def test_patch_values_are_recorded_redacted_and_bounded(allowed):
    """A /mutate record carries each op's value, but never a credential: env and annotation values
    (the job's, and those the patch itself writes) as in messages, Secret data and private keys as
    anywhere in a record; a value over 4 KiB is kept as its size and digest."""
    import hashlib

    from trainjob_admission.webhook.decisionlog import redact
    from trainjob_admission.webhook.admission.record import MAX_PATCH_VALUE

    parsed, decision = allowed
    submitted = "AKIA-submitted-credential"
    parsed.request.object["spec"]["trainer"]["env"] = [{"name": "AWS_KEY", "value": submitted}]
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\n-----END OPENSSH PRIVATE KEY-----\n"
    large = {"containers": [{"name": f"c{i}", "image": "registry.example/x:1"} for i in range(200)]}
    patch = [
        {"op": "add", "path": "/spec/trainer/command", "value": ["sh", "-c", f"echo {submitted}"]},
        {"op": "add", "path": "/spec/trainer/env/-", "value": {"name": "TOKEN", "value": "set-by-a-mutation"}},
        {"op": "replace", "path": "/spec/trainer/env/0/value", "value": "another-long-value"},
        {"op": "add", "path": "/metadata/annotations/team~1note", "value": "annotation-secret"},
        {"op": "add", "path": "/metadata/annotations/trainjob-admission.io~1gpu", "value": "nvidia-a100-80gb"},
        {"op": "add", "path": "/metadata/labels/tier", "value": "gold"},
        {"op": "add", "path": "/spec/x", "value": {"kind": "Secret", "data": {"id_rsa": "c2VjcmV0"}, "note": pem}},
        {"op": "add", "path": "/spec/podSpecOverrides", "value": large},
        {"op": "remove", "path": "/spec/suspend"},
    ]
    ops = DecisionRecord.mutated("d", parsed, decision, patch, []).as_log_fields()["patch"]
    assert [op.get("value") for op in ops[:7]] == [
        ["sh", "-c", "echo [redacted]"], {"name": "TOKEN", "value": "[redacted]"}, "[redacted]", "[redacted]",
        "nvidia-a100-80gb", "gold",  # this service's own annotations and short or label values are kept
        {"kind": "Secret", "data": "[redacted]", "note": "[redacted]\n"}]
    text = canonical(redact(large)).encode()
    assert len(text) > MAX_PATCH_VALUE
    assert ops[7] == {"op": "add", "path": "/spec/podSpecOverrides", "valueBytes": len(text),
                      "valueSha256": "sha256:" + hashlib.sha256(text).hexdigest()}
    assert ops[8] == {"op": "remove", "path": "/spec/suspend"}
    line = canonical(ops)
    assert not any(secret in line for secret in (submitted, "set-by-a-mutation", "annotation-secret", "c2VjcmV0",
                                                  "b3BlbnNzaC1rZXk="))
