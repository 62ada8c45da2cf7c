"""Injections that start on /mutate and finish on /validate (webhook/early.py), as the API server
calls the two: /mutate's patch tags the job with its admission id and the creations begin; /validate
gets the object with that patch applied and answers once they are done. The servers, injectors and
HTTP calls are real; the Kubernetes API is the in-memory stand-in of tests/support/memoryapi.py.
"""
from __future__ import annotations

import copy
import time
import uuid

import jsonpatch
import pytest

from tests.support.objects import example_job
from webhook.early import admission_id

from .conftest import Running, decode_patch

pytestmark = pytest.mark.server
NS, JOB = "team-a", "resnet-allreduce"
SECRET, POLICY = f"{JOB}-mpi-ssh-auth", f"{JOB}-mpi-isolation"
ANNOTATION = "trainjob-admission.io/admission-id"
CREATES = [f"POST /api/v1/namespaces/{NS}/secrets", f"POST /apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"]


def mutated(running: Running, obj: dict, **request) -> tuple[dict, dict]:
    """(the /mutate response, the object with its patch applied, as the API server stores it)."""
    response = running.review(obj, "mutate", **request)
    return response, jsonpatch.apply_patch(obj, decode_patch(response))


def stored(obj: dict) -> dict:
    """The object as /validate sees it on CREATE: the API server has given it a uid by then."""
    obj = copy.deepcopy(obj)
    obj["metadata"]["uid"] = str(uuid.uuid4())
    return obj


def record_of(running: Running, response: dict) -> dict:
    return next(r for r in running.records() if r["id"] == response["auditAnnotations"]["decision-id"])


def wait_for_objects(memory_api, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(memory_api.objects) < count:
        assert time.monotonic() < deadline, memory_api.objects.keys()
        time.sleep(0.01)


def test_mutate_starts_the_creations_and_validate_answers_once_they_are_done(injecting_server, memory_api):
    running = injecting_server()
    response, job = mutated(running, example_job("allowed.yaml"))
    tag = job["metadata"]["annotations"][ANNOTATION]
    assert tag == response["auditAnnotations"]["decision-id"], "the admission id is /mutate's decision id"
    # under way before /validate is called
    wait_for_objects(memory_api, 2)
    assert sorted(memory_api.requests) == CREATES
    for key in (("secrets", NS, SECRET), ("networkpolicies", NS, POLICY)):
        assert memory_api.objects[key]["metadata"]["annotations"][ANNOTATION] == tag
    started = record_of(running, response)
    assert {i["kind"]: i["status"] for i in started["injections"]} == {"Secret": "started", "NetworkPolicy": "started"}
    validated = running.review(stored(job))
    assert validated["allowed"] is True
    assert {i["status"] for i in record_of(running, validated)["injections"]} == {"created"}
    assert sorted(memory_api.requests) == CREATES, "nothing is created twice"


def test_another_replicas_validate_takes_the_objects_of_the_same_submission(injecting_server, memory_api):
    """The API server may send /mutate and /validate to different replicas: the second finds the
    objects the first made for this admission id, and uses them as they are."""
    first, second = injecting_server(), injecting_server()
    _, job = mutated(first, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 2)
    made = copy.deepcopy(memory_api.objects)
    response = second.review(stored(job))
    assert response["allowed"] is True and "warnings" not in response
    record = record_of(second, response)
    assert {i["status"] for i in record["injections"]} == {"created"}
    assert memory_api.objects == made, "neither replaced nor duplicated"
    secret = next(i for i in record["injections"] if i["kind"] == "Secret")
    assert secret["fingerprint"] == made[("secrets", NS, SECRET)]["metadata"]["annotations"][
        "trainjob-admission.io/ssh-key-fingerprint"]


def test_a_job_validate_refuses_has_its_new_objects_deleted(injecting_server, memory_api):
    """/mutate admitted what it saw and started; the object /validate judges asks for more GPUs
    than the bundle allows (as if a later webhook had changed it): refused, and what /mutate
    created for it goes at once instead of waiting for the reconciler's grace period."""
    running = injecting_server()
    _, job = mutated(running, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 2)
    job["spec"]["trainer"]["numNodes"] = 500
    response = running.review(stored(job))
    assert response["allowed"] is False
    deadline = time.monotonic() + 10
    while memory_api.objects and time.monotonic() < deadline:
        time.sleep(0.02)
    assert memory_api.objects == {}, "the refused submission's objects were left behind"


def test_withdrawal_leaves_objects_of_another_submission(injecting_server, memory_api):
    """A refusal deletes only what its own submission created: the objects of an earlier
    submission of the same name (its job stored, its Secret already owned) stay."""
    running = injecting_server()
    _, first = mutated(running, example_job("allowed.yaml"))
    assert running.review(stored(first))["allowed"] is True
    memory_api.put("trainjobs", stored(first))
    memory_api.objects[("secrets", NS, SECRET)]["metadata"]["ownerReferences"] = [
        {"kind": "TrainJob", "name": JOB, "uid": "u-1"}]
    kept = copy.deepcopy(memory_api.objects)
    _, second = mutated(running, example_job("allowed.yaml"))
    second["spec"]["trainer"]["numNodes"] = 500
    assert running.review(stored(second))["allowed"] is False
    time.sleep(0.5)
    assert memory_api.objects == kept


def test_dry_run_starts_nothing_and_a_submitted_admission_id_is_removed(injecting_server, memory_api):
    running = injecting_server()
    obj = example_job("allowed.yaml")
    obj["metadata"].setdefault("annotations", {})[ANNOTATION] = str(uuid.uuid4())
    response, job = mutated(running, obj, dryRun=True)
    assert ANNOTATION not in job["metadata"].get("annotations", {}), decode_patch(response)
    assert running.review(stored(job), dryRun=True)["allowed"] is True
    time.sleep(0.3)
    assert memory_api.requests == []


def test_an_untagged_job_is_named_by_its_uid_and_a_foreign_tag_is_not_read() -> None:
    job = stored(example_job("allowed.yaml"))
    assert admission_id(job) == job["metadata"]["uid"]
    job["metadata"]["annotations"] = {ANNOTATION: "not-an-id"}
    assert admission_id(job) == job["metadata"]["uid"]
    for hostile in ("a string", ["a", "list"], None, 7):  # the API server refuses these; a forged review may not
        assert admission_id({"metadata": {"uid": "u", "annotations": hostile}}) == "u"
    assert admission_id({"metadata": "not a map"}) == ""
    tag = str(uuid.uuid4())
    job["metadata"]["annotations"][ANNOTATION] = tag
    assert admission_id(job) == tag


def test_an_unauthenticated_caller_past_its_budget_starts_nothing_on_mutate(injecting_server, memory_api):
    """Without --client-ca, /mutate's creations count against the caller's budget like /validate's."""
    running = injecting_server(creation_burst=1)
    _, job = mutated(running, example_job("allowed.yaml"))
    assert ANNOTATION in job["metadata"]["annotations"]
    assert running.review(stored(job))["allowed"] is True
    memory_api.objects.clear()
    memory_api.requests.clear()
    response, job = mutated(running, example_job("allowed.yaml"))
    assert ANNOTATION not in job["metadata"].get("annotations", {})
    refused = running.review(stored(job))
    assert refused["allowed"] is False
    assert "more requests that create objects from 127.0.0.1" in refused["status"]["message"]
    assert memory_api.requests == []
