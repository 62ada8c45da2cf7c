"""Injections that start on /mutate and finish on /validate (webhook/inject/early.py), as the API server
calls the two: /mutate's patch tags the job with its admission id and the creations begin; /validate
gets the object with that patch applied and answers once they are done. The servers, injectors and
HTTP calls are real; the Kubernetes API is the in-memory stand-in of tests/support/memoryapi.py.
"""
from __future__ import annotations

import copy
import time
import uuid

import pytest
import yaml

from tests.support.objects import example_job
from trainjob_admission.webhook.decisionlog import DecisionLogError
from trainjob_admission.webhook.inject.early import admission_id

from .conftest import decode_patch, mutated, record_of, stored

pytestmark = pytest.mark.server
NS, JOB = "team-a", "resnet-allreduce"
SECRET, POLICY = f"{JOB}-mpi-ssh-auth", f"{JOB}-mpi-isolation"
ANNOTATION = "trainjob-admission.io/admission-id"
CREATES = [f"POST /api/v1/namespaces/{NS}/secrets", f"POST /apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"]
READS = [f"GET /api/v1/namespaces/{NS}/secrets/{SECRET}", f"GET /apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/{POLICY}"]


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
    # nothing is created twice; /validate reads them back (still this submission's?)
    assert sorted(memory_api.requests) == sorted(CREATES + READS)


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


def test_a_generated_name_is_injected_for_on_validate(injecting_server, memory_api):
    """The API server gives a `generateName` job its name only after the mutating webhooks: /mutate
    starts nothing, and /validate makes the objects for the name the job gets."""
    running = injecting_server()
    obj = example_job("allowed.yaml")
    obj["metadata"]["generateName"] = obj["metadata"].pop("name") + "-"
    _, job = mutated(running, obj)
    assert ANNOTATION not in job["metadata"].get("annotations", {})
    time.sleep(0.3)
    assert memory_api.requests == []
    job = stored(job)
    job["metadata"]["name"] = f"{JOB}-x7k2p"
    assert running.review(job)["allowed"] is True
    assert sorted(key[2] for key in memory_api.objects) == [f"{JOB}-x7k2p-mpi-isolation", f"{JOB}-x7k2p-mpi-ssh-auth"]


def test_an_admission_id_is_only_its_own_submissions(injecting_server, memory_api):
    """A job /mutate refuses loses the id its submitter wrote; and a /validate of another job or user
    that carries an id anyway (a fail-open /mutate, a forged review) neither finishes nor withdraws
    the submission it names."""
    running = injecting_server()
    _, victim = mutated(running, example_job("allowed.yaml"))
    tag = victim["metadata"]["annotations"][ANNOTATION]  # readable on the victim's NetworkPolicy
    wait_for_objects(memory_api, 2)
    evil = example_job("allowed.yaml")
    evil["metadata"].update(name="evil", annotations={ANNOTATION: tag})
    evil["spec"]["trainer"]["numNodes"] = 500  # refused by the bundle
    response, stripped = mutated(running, evil)
    assert ANNOTATION not in stripped["metadata"]["annotations"], decode_patch(response)
    # reaching /validate with the victim's id anyway: refused, and nothing of the victim's withdrawn
    assert running.review(stored(evil))["allowed"] is False
    # the victim's job as another user: not the submission /mutate started, so not finished for them
    assert running.review(stored(victim), userInfo={"username": "mallory", "groups": ["team-a"]})["allowed"] is True
    assert running.server.reviewer.injections._started, "the victim's started creations were claimed by another"
    time.sleep(0.3)
    made = dict(memory_api.objects)
    assert len(made) == 2
    validated = running.review(stored(victim))
    assert validated["allowed"] is True and {i["status"] for i in record_of(running, validated)["injections"]} == {
        "created"}
    assert memory_api.objects == made and not running.server.reviewer.injections._started


def test_an_object_of_the_same_admission_id_that_a_job_owns_is_not_taken(injecting_server, memory_api):
    """The id stays on the stored job; a later job of its name that arrives with it (its /mutate did
    not tag it) is not handed the objects the first job owns."""
    running = injecting_server()
    _, first = mutated(running, example_job("allowed.yaml"))
    assert running.review(stored(first))["allowed"] is True
    for key in (("secrets", NS, SECRET), ("networkpolicies", NS, POLICY)):
        memory_api.objects[key]["metadata"]["ownerReferences"] = [{"kind": "TrainJob", "name": JOB, "uid": "old"}]
    response = running.review(stored(first))
    assert response["allowed"] is False and "belongs to TrainJob resnet-allreduce" in response["status"]["message"]


def test_nothing_starts_when_the_mutate_record_cannot_be_written(injecting_server, memory_api):
    """The decision log refusing /mutate's record makes the answer 'allowed, unpatched': no id on the
    job, so no creation may have begun for one."""
    running = injecting_server()
    log = running.server.decision_log
    append = log.append

    def failing(record, *, required=True):
        if record.get("endpoint") == "mutate" and required:
            raise DecisionLogError("disk full", record)
        return append(record, required=required)
    log.append = failing
    response, job = mutated(running, example_job("allowed.yaml"))
    assert not response.get("patch")
    time.sleep(0.3)
    assert memory_api.requests == [] and not running.server.reviewer.injections._started


def test_objects_started_under_a_bundle_changed_before_validate_are_made_again(injecting_server, memory_api):
    """/mutate made the default NetworkPolicy; the bundle asks for the restricted one by the time
    /validate judges the job: the job gets the restricted one."""
    running = injecting_server()
    _, job = mutated(running, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 2)
    assert "ports" not in memory_api.objects[("networkpolicies", NS, POLICY)]["spec"]["ingress"][0]
    bundle_path = running.log_path.parent / "bundle.yaml"
    bundle = yaml.safe_load(bundle_path.read_text())
    bundle["spec"]["injections"]["networkPolicy"]["template"] = "restricted"
    reloads = running.server.registry.reloads
    bundle_path.write_text(yaml.safe_dump(bundle))
    deadline = time.monotonic() + 10
    while running.server.registry.reloads == reloads:
        assert time.monotonic() < deadline, "the bundle was not reloaded"
        time.sleep(0.05)
    assert running.review(stored(job))["allowed"] is True
    assert "ports" in memory_api.objects[("networkpolicies", NS, POLICY)]["spec"]["ingress"][0]


def wait_for_requests(memory_api, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(memory_api.requests) < count:
        assert time.monotonic() < deadline, memory_api.requests
        time.sleep(0.01)


@pytest.mark.parametrize("second_refused_by_policy", [False, True])
def test_a_second_submission_of_the_same_name_neither_replaces_nor_withdraws_the_firsts(
        injecting_server, memory_api, second_refused_by_policy):
    """Issue 30, defect 2: two CREATEs of one name in flight at once, on two replicas. The second's
    /mutate finds the first's objects unowned but young: it leaves them, and its /validate refuses
    it with when to retry; the first is admitted with its own objects, which the second's
    withdrawal does not touch."""
    first, second = injecting_server(), injecting_server()
    _, job_a = mutated(first, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 2)
    tag_a = job_a["metadata"]["annotations"][ANNOTATION]
    made = copy.deepcopy(memory_api.objects)
    _, job_b = mutated(second, example_job("allowed.yaml"))
    wait_for_requests(memory_api, 6)  # the second's two creations refused (409), its two reads
    if second_refused_by_policy:
        job_b["spec"]["trainer"]["numNodes"] = 500
    refused = second.review(stored(job_b))
    assert refused["allowed"] is False
    if not second_refused_by_policy:
        message = refused["status"]["message"]
        assert "for another submission of TrainJob resnet-allreduce that is still being admitted" in message, message
        assert "retry in" in message, message
    validated = first.review(stored(job_a))
    assert validated["allowed"] is True
    assert {i["status"] for i in record_of(first, validated)["injections"]} == {"created"}
    time.sleep(0.5)  # the second's withdrawal runs in the background
    assert memory_api.objects == made, "the first submission's objects were replaced or deleted"
    for key in (("secrets", NS, SECRET), ("networkpolicies", NS, POLICY)):
        assert memory_api.objects[key]["metadata"]["annotations"][ANNOTATION] == tag_a


def test_validate_makes_again_what_was_deleted_since_mutate(injecting_server, memory_api):
    """/validate reports 'created' only for objects that are still there as its submission's: one
    deleted after /mutate made it is made again, so the job is not stored without it."""
    running = injecting_server()
    _, job = mutated(running, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 2)
    del memory_api.objects[("secrets", NS, SECRET)]
    validated = running.review(stored(job))
    assert validated["allowed"] is True
    assert {i["status"] for i in record_of(running, validated)["injections"]} == {"created"}
    secret = memory_api.objects[("secrets", NS, SECRET)]
    assert secret["metadata"]["annotations"][ANNOTATION] == job["metadata"]["annotations"][ANNOTATION]


def test_another_submissions_objects_past_the_in_flight_window_are_a_leftover_to_replace(injecting_server, memory_api):
    """Unowned objects of another admission id older than any create can run (its job refused after
    our /validate, e.g. by a ResourceQuota) are replaced by a resubmission, as before."""
    first, second = injecting_server(), injecting_server()
    mutated(first, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 2)
    for obj in memory_api.objects.values():
        obj["metadata"]["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 61))
    _, job_b = mutated(second, example_job("allowed.yaml"))
    validated = second.review(stored(job_b))
    assert validated["allowed"] is True
    assert all(i["status"] == "created" and "replaced" in i for i in record_of(second, validated)["injections"])
    assert {o["metadata"]["annotations"][ANNOTATION] for o in memory_api.objects.values()} == {
        job_b["metadata"]["annotations"][ANNOTATION]}
