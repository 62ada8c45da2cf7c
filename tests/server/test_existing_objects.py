"""A Secret or NetworkPolicy of the planned name that the service did not create for this job
is refused: the job is denied naming the object and the fix, whatever the failure mode, unless
the bundle sets ``adoptExisting``. The server, its injector and the HTTP calls are real; the
Kubernetes API is a small in-memory one on loopback that stores, conflicts and deletes by name.
"""
from __future__ import annotations

import base64
import copy
import uuid

import pytest

from tests.support.objects import example_job
from trainjob_admission.webhook.inject.keys import generate

from .conftest import Running

pytestmark = pytest.mark.server
NS, JOB = "team-a", "resnet-allreduce"
SECRET, POLICY = f"{JOB}-mpi-ssh-auth", f"{JOB}-mpi-isolation"


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


@pytest.mark.parametrize("failure_mode", ["deny", "allow"])
def test_a_planted_secret_denies_the_job_naming_it_and_the_fix(injecting_server, memory_api, failure_mode):
    running = injecting_server(failure_mode=failure_mode)
    planted = planted_secret()
    memory_api.put("secrets", copy.deepcopy(planted))
    response = running.review(job())
    assert response["allowed"] is False, "a planted key must never be mounted, whatever the failure mode"
    message = response["status"]["message"]
    assert message == (f"[trainjob-admission/existing-objects] Secret {NS}/{SECRET} already exists and was not "
                       f"created by trainjob-admission for this job: delete Secret {NS}/{SECRET} or rename the job")
    assert memory_api.objects[("secrets", NS, SECRET)]["data"] == planted["data"], "the planted Secret is left alone"
    record = record_of(running, response)
    assert record["decision"] == "deny" and record["allowed"] is False
    statuses = {i["kind"]: i["status"] for i in record["injections"]}
    assert statuses == {"Secret": "refused", "NetworkPolicy": "created"}


def test_a_forged_copy_of_our_label_and_annotations_is_refused(injecting_server, memory_api):
    """The attacker copies everything a real injected Secret carries (label, job, uid, key type,
    fingerprint and provenance annotations) onto a Secret with their own key."""
    running = injecting_server()
    uid = str(uuid.uuid4())
    assert running.review(job(uid))["allowed"] is True
    real = memory_api.objects.pop(("secrets", NS, SECRET))
    memory_api.objects.pop(("networkpolicies", NS, POLICY))
    forged = copy.deepcopy(real)
    forged["data"] = planted_secret()["data"]
    memory_api.put("secrets", forged)
    response = running.review(job(uid))
    assert response["allowed"] is False and f"Secret {NS}/{SECRET} already exists and was not created" \
        in response["status"]["message"]
    # an allow-all NetworkPolicy with our label and a copied annotation set is refused too
    memory_api.objects.clear()
    assert running.review(job(uid))["allowed"] is True
    policy = memory_api.objects[("networkpolicies", NS, POLICY)]
    policy["spec"] = {"podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"]}
    del memory_api.objects[("secrets", NS, SECRET)]
    response = running.review(job())
    assert response["allowed"] is False
    assert f"delete NetworkPolicy {NS}/{POLICY} or rename the job" in response["status"]["message"]


def test_a_retried_call_for_the_same_submission_is_recognised_as_ours(injecting_server, memory_api):
    running = injecting_server()
    uid = str(uuid.uuid4())
    first = running.review(job(uid))
    created = copy.deepcopy(memory_api.objects)
    again = running.review(job(uid))  # the API server calls /validate again for the same job
    assert first["allowed"] is True and again["allowed"] is True and "warnings" not in again
    assert memory_api.objects == created, "the retry neither replaces nor duplicates our objects"
    assert {i["status"] for i in record_of(running, again)["injections"]} == {"created"}


def test_adopt_existing_uses_the_planted_objects_with_a_warning(injecting_server, memory_api):
    running = injecting_server(adopt=True)
    planted = planted_secret()
    memory_api.put("secrets", copy.deepcopy(planted))
    response = running.review(job())
    assert response["allowed"] is True
    assert (f"Secret {NS}/{SECRET} already exists and was not created by trainjob-admission for this job; "
            "it was left as is and Trainer will use it") in response["warnings"]
    assert memory_api.objects[("secrets", NS, SECRET)]["data"] == planted["data"]
    assert {i["kind"]: i["status"] for i in record_of(running, response)["injections"]}["Secret"] == "kept"
