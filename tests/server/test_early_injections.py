"""Injections that start on /mutate and finish on /validate (webhook/inject/early.py), as the API server
calls the two: /mutate's patch tags the job with its admission id and the creation of the SSH key
Secret begins (a key type Trainer does not make: ed25519 here); /validate gets the object with that
patch applied and answers once it is done. The servers, injectors and HTTP calls are real; the
Kubernetes API is the in-memory stand-in of tests/support/memoryapi.py.
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
ISOLATION = "trainjob-admission-trainjob-isolation"  # the namespace's own NetworkPolicy
POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"
CREATES = [f"POST /api/v1/namespaces/{NS}/secrets"]
KEY = "ed25519"  # the service makes the Secret; the default's (Trainer's own) it leaves to Trainer


def wait_for_objects(memory_api, count: int, plural: str = "secrets") -> None:
    deadline = time.monotonic() + 10
    while sum(key[0] == plural for key in memory_api.objects) < count:
        assert time.monotonic() < deadline, memory_api.objects.keys()
        time.sleep(0.01)


def secrets(memory_api) -> dict:
    return {key: obj for key, obj in memory_api.objects.items() if key[0] == "secrets"}


def statuses(record: dict) -> dict[str, str]:
    return {i["name"]: i["status"] for i in record["injections"]}


def test_mutate_starts_the_creations_and_validate_answers_once_they_are_done(injecting_server, memory_api):
    running = injecting_server(key_type=KEY)
    response, job = mutated(running, example_job("allowed.yaml"))
    tag = job["metadata"]["annotations"][ANNOTATION]
    assert tag == response["auditAnnotations"]["decision-id"], "the admission id is /mutate's decision id"
    # under way before /validate is called
    wait_for_objects(memory_api, 1)
    assert sorted(memory_api.requests) == CREATES
    assert memory_api.objects[("secrets", NS, SECRET)]["metadata"]["annotations"][ANNOTATION] == tag
    started = record_of(running, response)
    assert statuses(started) == {SECRET: "started"}
    validated = running.review(stored(job))
    assert validated["allowed"] is True
    assert statuses(record_of(running, validated)) == {SECRET: "created", POLICY: "deferred", ISOLATION: "created"}
    assert sorted(memory_api.requests) == sorted(CREATES + [f"GET /api/v1/namespaces/{NS}/secrets/{SECRET}",
                                                            f"POST {POLICIES}"]), \
        "nothing is created twice; /validate confirms the Secret is still this submission's"


def test_trainers_key_type_starts_nothing_on_mutate(injecting_server, memory_api):
    """The default bundle's key is Trainer's own: /mutate neither tags the job nor starts anything."""
    running = injecting_server()
    response, job = mutated(running, example_job("allowed.yaml"))
    assert ANNOTATION not in (job["metadata"].get("annotations") or {})
    assert record_of(running, response)["injections"] == []
    time.sleep(0.3)
    assert memory_api.requests == [] and not running.server.reviewer.injections._started


def test_another_replicas_validate_takes_the_objects_of_the_same_submission(injecting_server, memory_api):
    """The API server may send /mutate and /validate to different replicas: the second finds the
    objects the first made for this admission id, and uses them as they are."""
    first, second = injecting_server(key_type=KEY), injecting_server(key_type=KEY)
    _, job = mutated(first, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 1)
    made = copy.deepcopy(secrets(memory_api))
    response = second.review(stored(job))
    assert response["allowed"] is True and "warnings" not in response
    record = record_of(second, response)
    assert statuses(record)[SECRET] == "created"
    assert secrets(memory_api) == made, "neither replaced nor duplicated"
    secret = next(i for i in record["injections"] if i["kind"] == "Secret")
    assert secret["fingerprint"] == made[("secrets", NS, SECRET)]["metadata"]["annotations"][
        "trainjob-admission.io/ssh-key-fingerprint"]


def test_a_job_validate_refuses_has_its_new_objects_deleted(injecting_server, memory_api):
    """/mutate admitted what it saw and started; the object /validate judges asks for more GPUs
    than the bundle allows (as if a later webhook had changed it): refused, and what /mutate
    created for it goes at once instead of waiting for the reconciler's grace period."""
    running = injecting_server(key_type=KEY)
    _, job = mutated(running, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 1)
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
    running = injecting_server(key_type=KEY)
    _, first = mutated(running, example_job("allowed.yaml"))
    assert running.review(stored(first))["allowed"] is True
    memory_api.put("trainjobs", stored(first))
    owned = copy.deepcopy(memory_api.objects[("secrets", NS, SECRET)])
    owned["metadata"]["ownerReferences"] = [{"kind": "TrainJob", "name": JOB, "uid": "u-1"}]
    memory_api.put("secrets", owned)
    kept = copy.deepcopy(memory_api.objects)
    _, second = mutated(running, example_job("allowed.yaml"))
    second["spec"]["trainer"]["numNodes"] = 500
    assert running.review(stored(second))["allowed"] is False
    time.sleep(0.5)
    assert memory_api.objects == kept


def test_two_submissions_of_one_name_in_flight_keep_the_first_ones_objects(injecting_server, memory_api):
    """Issue 30, defect 2: two CREATEs of the same job name at once. The second's /mutate finds the
    first's Secret, unowned and made for another admission id a moment ago: that submission may
    still be admitted, so it is not replaced, and the second is refused saying so. The first is
    admitted with its own Secret, reported created because it still carries its id; the second's
    refusal withdraws nothing of the first's."""
    running = injecting_server(key_type=KEY)
    _, first = mutated(running, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 1)
    ours = copy.deepcopy(memory_api.objects[("secrets", NS, SECRET)])
    _, second = mutated(running, example_job("allowed.yaml"))
    assert second["metadata"]["annotations"][ANNOTATION] != first["metadata"]["annotations"][ANNOTATION]
    admitted = running.review(stored(first))
    assert admitted["allowed"] is True
    assert statuses(record_of(running, admitted))[SECRET] == "created"
    second["spec"]["trainer"]["numNodes"] = 500  # and the second is refused by the bundle too
    refused = running.review(stored(second))
    assert refused["allowed"] is False
    time.sleep(0.5)  # a withdrawal runs in the background
    assert memory_api.objects[("secrets", NS, SECRET)] == ours, "the first submission's Secret was replaced or deleted"
    # the same race when the second would be admitted: it is refused, naming the other submission
    memory_api.remove("trainjobs", NS, JOB) if ("trainjobs", NS, JOB) in memory_api.objects else None
    _, third = mutated(running, example_job("allowed.yaml"))
    response = running.review(stored(third))
    assert response["allowed"] is False
    assert f"Secret {NS}/{SECRET} was created" in response["status"]["message"]
    assert "for another submission of TrainJob resnet-allreduce that is still being admitted" \
        in response["status"]["message"]
    assert memory_api.objects[("secrets", NS, SECRET)] == ours


def test_validate_makes_again_what_was_deleted_since_mutate(injecting_server, memory_api):
    """/validate reports 'created' only for a Secret still there as its submission's: one deleted
    after /mutate made it is made again, so the job is not stored without it."""
    running = injecting_server(key_type=KEY)
    _, job = mutated(running, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 1)
    memory_api.remove("secrets", NS, SECRET)
    response = running.review(stored(job))
    assert response["allowed"] is True
    assert statuses(record_of(running, response))[SECRET] == "created"
    secret = memory_api.objects[("secrets", NS, SECRET)]
    assert secret["metadata"]["annotations"][ANNOTATION] == job["metadata"]["annotations"][ANNOTATION]


def test_dry_run_starts_nothing_and_a_submitted_admission_id_is_removed(injecting_server, memory_api):
    running = injecting_server(key_type=KEY)
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
    running = injecting_server(creation_burst=1, key_type=KEY)
    _, job = mutated(running, example_job("allowed.yaml"))
    assert ANNOTATION in job["metadata"]["annotations"]
    assert running.review(stored(job))["allowed"] is True
    for key in [k for k in memory_api.objects if k[0] == "secrets"]:
        memory_api.remove(*key)
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
    running = injecting_server(key_type=KEY)
    obj = example_job("allowed.yaml")
    obj["metadata"]["generateName"] = obj["metadata"].pop("name") + "-"
    _, job = mutated(running, obj)
    assert ANNOTATION not in job["metadata"].get("annotations", {})
    time.sleep(0.3)
    assert memory_api.requests == []
    job = stored(job)
    job["metadata"]["name"] = f"{JOB}-x7k2p"
    assert running.review(job)["allowed"] is True
    assert sorted(key[2] for key in memory_api.objects) == [f"{JOB}-x7k2p-mpi-ssh-auth", ISOLATION]


def test_an_admission_id_is_only_its_own_submissions(injecting_server, memory_api):
    """A job /mutate refuses loses the id its submitter wrote; and a /validate of another job or user
    that carries an id anyway (a fail-open /mutate, a forged review) neither finishes nor withdraws
    the submission it names."""
    running = injecting_server(key_type=KEY)
    _, victim = mutated(running, example_job("allowed.yaml"))
    tag = victim["metadata"]["annotations"][ANNOTATION]  # readable on the victim's Secret's metadata
    wait_for_objects(memory_api, 1)
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
    made = secrets(memory_api)
    assert len(made) == 1
    validated = running.review(stored(victim))
    assert validated["allowed"] is True and statuses(record_of(running, validated))[SECRET] == "created"
    assert secrets(memory_api) == made and not running.server.reviewer.injections._started


def test_an_object_of_the_same_admission_id_that_a_job_owns_is_not_taken(injecting_server, memory_api):
    """The id stays on the stored job; a later job of its name that arrives with it (its /mutate did
    not tag it) is not handed the objects the first job owns."""
    running = injecting_server(key_type=KEY)
    _, first = mutated(running, example_job("allowed.yaml"))
    assert running.review(stored(first))["allowed"] is True
    owned = copy.deepcopy(memory_api.objects[("secrets", NS, SECRET)])
    owned["metadata"]["ownerReferences"] = [{"kind": "TrainJob", "name": JOB, "uid": "old"}]
    memory_api.put("secrets", owned)
    response = running.review(stored(first))
    assert response["allowed"] is False and "belongs to TrainJob resnet-allreduce" in response["status"]["message"]


def test_nothing_starts_when_the_mutate_record_cannot_be_written(injecting_server, memory_api):
    """The decision log refusing /mutate's record makes the answer 'allowed, unpatched': no id on the
    job, so no creation may have begun for one."""
    running = injecting_server(key_type=KEY)
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
    """/mutate made an ed25519 key; the bundle asks for RSA-4096 by the time /validate judges the
    job: the job gets an RSA key."""
    running = injecting_server(key_type=KEY)
    _, job = mutated(running, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 1)
    key_type = "trainjob-admission.io/ssh-key-type"
    assert memory_api.objects[("secrets", NS, SECRET)]["metadata"]["annotations"][key_type] == KEY
    bundle_path = running.log_path.parent / "bundle.yaml"
    bundle = yaml.safe_load(bundle_path.read_text())
    bundle["spec"]["injections"]["sshKey"]["type"] = "rsa-4096"
    reloads = running.server.registry.reloads
    bundle_path.write_text(yaml.safe_dump(bundle))
    deadline = time.monotonic() + 10
    while running.server.registry.reloads == reloads:
        assert time.monotonic() < deadline, "the bundle was not reloaded"
        time.sleep(0.05)
    assert running.review(stored(job))["allowed"] is True
    assert memory_api.objects[("secrets", NS, SECRET)]["metadata"]["annotations"][key_type] == "rsa-4096"


def wait_for_requests(memory_api, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(memory_api.requests) < count:
        assert time.monotonic() < deadline, memory_api.requests
        time.sleep(0.01)


@pytest.mark.parametrize("second_refused_by_policy", [False, True])
def test_a_second_submission_of_the_same_name_neither_replaces_nor_withdraws_the_firsts(
        injecting_server, memory_api, second_refused_by_policy):
    """Issue 30, defect 2: two CREATEs of one name in flight at once, on two replicas. The second's
    /mutate finds the first's Secret unowned but young: it leaves it, and its /validate refuses
    it with when to retry; the first is admitted with its own Secret, which the second's
    withdrawal does not touch."""
    first, second = injecting_server(key_type=KEY), injecting_server(key_type=KEY)
    _, job_a = mutated(first, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 1)
    tag_a = job_a["metadata"]["annotations"][ANNOTATION]
    made = copy.deepcopy(memory_api.objects[("secrets", NS, SECRET)])
    _, job_b = mutated(second, example_job("allowed.yaml"))
    wait_for_requests(memory_api, 3)  # the second's creation refused (409), its read
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
    assert statuses(record_of(first, validated))[SECRET] == "created"
    time.sleep(0.5)  # the second's withdrawal runs in the background
    assert memory_api.objects[("secrets", NS, SECRET)] == made, "the first submission's Secret was replaced or deleted"
    assert memory_api.objects[("secrets", NS, SECRET)]["metadata"]["annotations"][ANNOTATION] == tag_a


def test_another_submissions_objects_past_the_in_flight_window_are_a_leftover_to_replace(injecting_server, memory_api):
    """An unowned Secret of another admission id older than any create can run (its job refused after
    our /validate, e.g. by a ResourceQuota) is replaced by a resubmission, as before."""
    first, second = injecting_server(key_type=KEY), injecting_server(key_type=KEY)
    mutated(first, example_job("allowed.yaml"))
    wait_for_objects(memory_api, 1)
    old = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 61))
    memory_api.objects[("secrets", NS, SECRET)]["metadata"]["creationTimestamp"] = old
    _, job_b = mutated(second, example_job("allowed.yaml"))
    validated = second.review(stored(job_b))
    assert validated["allowed"] is True
    (record,) = [i for i in record_of(second, validated)["injections"] if i["name"] == SECRET]
    assert record["status"] == "created" and "replaced" in record
    assert memory_api.objects[("secrets", NS, SECRET)]["metadata"]["annotations"][ANNOTATION] == \
        job_b["metadata"]["annotations"][ANNOTATION]
