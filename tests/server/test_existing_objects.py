"""A Secret or NetworkPolicy of the planned name that the service did not create for this job
is refused: the job is denied naming the object and the fix, whatever the failure mode, unless
the bundle sets ``adoptExisting``. With Trainer's own key type (the default bundle) Trainer makes
the Secret and admission only reads the watch of Secrets' metadata; with another type the service
creates it at admission. The server, its injector, its watches and the HTTP calls are real; the
Kubernetes API is a small in-memory one on loopback that stores, conflicts, deletes and streams
watch events by name (tests/support/memoryapi.py).
"""
from __future__ import annotations

import base64
import copy
import time
import uuid

import pytest

from tests.support.objects import example_job
from trainjob_admission.webhook.inject.keys import generate

from .conftest import Running

pytestmark = pytest.mark.server
NS, JOB = "team-a", "resnet-allreduce"
SECRET, POLICY = f"{JOB}-mpi-ssh-auth", f"{JOB}-mpi-isolation"
ISOLATION = "trainjob-admission-trainjob-isolation"  # the namespace's own NetworkPolicy
SECRETS, POLICIES = f"/api/v1/namespaces/{NS}/secrets", f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"


def job(uid: str = "") -> dict:
    obj = example_job("allowed.yaml")
    obj["metadata"]["uid"] = uid or str(uuid.uuid4())
    return obj


def planted_secret() -> dict:
    """The attacker's own key pair, in the shape Trainer mounts."""
    pair = generate("ed25519")
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
            "metadata": {"name": SECRET, "namespace": NS},
            "data": {"ssh-privatekey": base64.b64encode(pair.private_pem).decode(),
                     "ssh-publickey": base64.b64encode(pair.public_openssh).decode()}}


def record_of(running: Running, response: dict) -> dict:
    return next(r for r in running.records() if r["id"] == response["auditAnnotations"]["decision-id"])


def statuses(record: dict) -> dict[str, str]:
    return {i["name"]: i["status"] for i in record["injections"]}


def seen(running: Running, kind: str, name: str) -> None:
    """Wait until the server's watch shows the object (as the API server's would, ms later)."""
    existing = running.server.reviewer.injections.injector.existing
    deadline = time.monotonic() + 10
    while existing.get(kind, NS, name) is None:
        assert time.monotonic() < deadline, f"the watch never showed {kind} {name}"
        time.sleep(0.01)


def plant(running: Running, memory_api, plural: str, obj: dict) -> None:
    memory_api.put(plural, obj)
    seen(running, obj["kind"], obj["metadata"]["name"])


@pytest.mark.parametrize("key_type", [None, "ed25519"])  # Trainer makes the key; the service makes it
@pytest.mark.parametrize("failure_mode", ["deny", "allow"])
def test_a_planted_secret_denies_the_job_naming_it_and_the_fix(injecting_server, memory_api, failure_mode, key_type):
    running = injecting_server(failure_mode=failure_mode, key_type=key_type)
    planted = planted_secret()
    plant(running, memory_api, "secrets", copy.deepcopy(planted))
    response = running.review(job())
    assert response["allowed"] is False, "a planted key must never be mounted, whatever the failure mode"
    message = response["status"]["message"]
    assert message == (f"[trainjob-admission/existing-objects] Secret {NS}/{SECRET} already exists and was not "
                       f"created by trainjob-admission for this job: delete Secret {NS}/{SECRET} or rename the job")
    assert memory_api.objects[("secrets", NS, SECRET)]["data"] == planted["data"], "the planted Secret is left alone"
    record = record_of(running, response)
    assert record["decision"] == "deny" and record["allowed"] is False
    assert statuses(record) == {SECRET: "refused", POLICY: "deferred", ISOLATION: "created"}


def test_trainers_key_type_makes_no_call_in_the_common_case(injecting_server, memory_api):
    """The default bundle: Trainer makes the Secret, the reconciler the job's NetworkPolicy, and
    admission reads both names from its watches; the one write is the namespace's isolating
    NetworkPolicy, made by the first admission in the namespace and never again."""
    running = injecting_server()
    first = running.review(job())
    assert first["allowed"] is True and "warnings" not in first
    assert statuses(record_of(running, first)) == {SECRET: "left-to-trainer", POLICY: "deferred", ISOLATION: "created"}
    assert memory_api.requests == [f"POST {POLICIES}"]
    isolation = memory_api.objects[("networkpolicies", NS, ISOLATION)]
    assert isolation["spec"] == {"podSelector": {"matchExpressions": [
        {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}, "policyTypes": ["Ingress"]}
    seen(running, "NetworkPolicy", ISOLATION)
    memory_api.requests.clear()
    for _ in range(3):
        other = example_job("allowed.yaml")
        other["metadata"].update(name=f"job-{uuid.uuid4().hex[:6]}", uid=str(uuid.uuid4()))
        response = running.review(other)
        assert response["allowed"] is True
        assert {i["status"] for i in record_of(running, response)["injections"]} == {"left-to-trainer", "deferred"}
    assert memory_api.requests == [], "admission made calls in the common case"


def test_a_forged_copy_of_our_label_and_annotations_is_refused(injecting_server, memory_api):
    """The attacker copies everything a real injected Secret carries (label, job, uid, key type,
    fingerprint and provenance annotations) onto a Secret with their own key."""
    running = injecting_server(key_type="ed25519")
    uid = str(uuid.uuid4())
    assert running.review(job(uid))["allowed"] is True
    real = memory_api.remove("secrets", NS, SECRET)
    forged = copy.deepcopy(real)
    forged["data"] = planted_secret()["data"]
    for field in ("uid", "resourceVersion", "creationTimestamp"):
        del forged["metadata"][field]
    plant(running, memory_api, "secrets", forged)
    response = running.review(job(uid))
    assert response["allowed"] is False and f"Secret {NS}/{SECRET} already exists and was not created" \
        in response["status"]["message"]


def test_a_planted_or_forged_network_policy_is_refused(injecting_server, memory_api):
    """The job's NetworkPolicy is made once the job is stored; one of its name that is there before,
    an allow-all with our label and a made-up provenance annotation, denies the job."""
    running = injecting_server()
    forged = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": POLICY, "namespace": NS,
                           "labels": {"app.kubernetes.io/managed-by": "trainjob-admission"},
                           "annotations": {"trainjob-admission.io/job": f"TrainJob/{JOB}",
                                           "trainjob-admission.io/provenance": "v1:" + "0" * 64}},
              "spec": {"podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"]}}
    plant(running, memory_api, "networkpolicies", forged)
    response = running.review(job())
    assert response["allowed"] is False
    assert f"delete NetworkPolicy {NS}/{POLICY} or rename the job" in response["status"]["message"]
    assert statuses(record_of(running, response))[POLICY] == "refused"


def test_a_retried_call_for_the_same_submission_is_recognised_as_ours(injecting_server, memory_api):
    running = injecting_server(key_type="ed25519")
    uid = str(uuid.uuid4())
    first = running.review(job(uid))
    created = copy.deepcopy(memory_api.objects)
    again = running.review(job(uid))  # the API server calls /validate again for the same job
    assert first["allowed"] is True and again["allowed"] is True and "warnings" not in again
    assert memory_api.objects == created, "the retry neither replaces nor duplicates our objects"
    assert statuses(record_of(running, again)) == {SECRET: "created", POLICY: "deferred"}


@pytest.mark.parametrize("key_type", [None, "ed25519"])
def test_adopt_existing_uses_the_planted_objects_with_a_warning(injecting_server, memory_api, key_type):
    running = injecting_server(adopt=True, key_type=key_type)
    planted = planted_secret()
    plant(running, memory_api, "secrets", copy.deepcopy(planted))
    response = running.review(job())
    assert response["allowed"] is True
    assert (f"Secret {NS}/{SECRET} already exists and was not created by trainjob-admission for this job; "
            "it was left as is and Trainer will use it") in response["warnings"]
    assert memory_api.objects[("secrets", NS, SECRET)]["data"] == planted["data"]
    assert statuses(record_of(running, response))[SECRET] == "kept"
