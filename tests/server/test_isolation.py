"""Network isolation without a write per admission (webhook/inject/isolation.py): the job's own
NetworkPolicy is made once the job is stored, owned by it from its creation (no patch follows), by
the replica that admitted it or, failing that, planned again from the stored job; the namespace's
own policy, which isolates every job pod until then, is kept where the bundles want it. The
server, its reconciler and watches and the HTTP calls are real; the Kubernetes API is the
in-memory stand-in of tests/support/memoryapi.py (no garbage collector: a test deletes what the
real one would).
"""
from __future__ import annotations

import copy
import time
import uuid

import pytest

from tests.support.objects import example_job
from trainjob_admission.webhook.inject import isolation as isolation_module

from .conftest import PROVENANCE

pytestmark = pytest.mark.server
NS, JOB = "team-a", "resnet-allreduce"
POLICY, ISOLATION = f"{JOB}-mpi-isolation", "trainjob-admission-trainjob-isolation"
POLICIES = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"


def submitted(name: str = JOB) -> dict:
    obj = example_job("allowed.yaml")
    obj["metadata"].update(name=name, uid=str(uuid.uuid4()))
    return obj


def wait_for(what: str, check, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.02)
    return found


def policy(memory_api, name: str = POLICY) -> dict | None:
    return memory_api.objects.get(("networkpolicies", NS, name))


def test_the_admitting_replica_makes_the_jobs_policy_owned_from_its_creation(injecting_server, memory_api):
    running = injecting_server(reconcile=True)
    job = submitted()
    assert running.review(job)["allowed"] is True
    time.sleep(0.3)
    assert policy(memory_api) is None, "made before the job was stored"
    memory_api.requests.clear()
    memory_api.put("trainjobs", copy.deepcopy(job))  # the API server stores it: the job watch shows it
    made = wait_for("job NetworkPolicy", lambda: policy(memory_api))
    assert made["metadata"]["ownerReferences"] == [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                                    "name": JOB, "uid": job["metadata"]["uid"], "controller": True}]
    selector = {"jobset.sigs.k8s.io/jobset-name": JOB}
    assert made["spec"] == {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"],
                            "ingress": [{"from": [{"podSelector": {"matchLabels": selector}}]}]}
    assert PROVENANCE.verify("NetworkPolicy", made)
    time.sleep(0.5)
    assert memory_api.requests == [f"POST {POLICIES}"], "one write per job: the creation, no adoption patch"


def test_another_replica_plans_it_from_the_stored_job(injecting_server, memory_api, monkeypatch):
    """The job was admitted elsewhere (or before a restart): no plan at hand, so after a moment
    the bundles plan it again from the stored job; in a namespace that does not isolate its jobs'
    pods, none is needed and none is planned."""
    monkeypatch.setattr(isolation_module, "FALLBACK_DELAY", 0.3)
    isolated: dict[str, list[str]] = {}
    injecting_server(reconcile=True, isolated=isolated)
    job = submitted()
    memory_api.put("trainjobs", job)
    time.sleep(1.5)
    assert policy(memory_api) is None and memory_api.requests == []
    isolated[NS] = ["TrainJob"]  # a bundle isolates the namespace now: its own policy comes, then the job's
    made = wait_for("job NetworkPolicy", lambda: policy(memory_api))
    assert policy(memory_api, ISOLATION) is not None
    assert made["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert made["spec"]["podSelector"] == {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": JOB}}


def test_a_deleted_job_policy_is_made_again_while_its_job_lives(injecting_server, memory_api):
    running = injecting_server(reconcile=True)
    job = submitted()
    assert running.review(job)["allowed"] is True
    memory_api.put("trainjobs", copy.deepcopy(job))
    first = wait_for("job NetworkPolicy", lambda: policy(memory_api))
    memory_api.remove("networkpolicies", NS, POLICY)
    again = wait_for("job NetworkPolicy made again", lambda: policy(memory_api))
    assert again["metadata"]["uid"] != first["metadata"]["uid"]
    assert again["metadata"]["ownerReferences"] == first["metadata"]["ownerReferences"]


def test_a_look_alike_owner_is_replaced_by_the_jobs(injecting_server, memory_api):
    """Issue 30's look-alike: the policy's ownerReference rewritten to a TrainJob of the same name in
    another API group, which the garbage collector cannot resolve (so it would keep the policy after
    the job). The policy is made again, owned by the job: delete and create, never a patch."""
    running = injecting_server(reconcile=True)
    job = submitted()
    assert running.review(job)["allowed"] is True
    memory_api.put("trainjobs", copy.deepcopy(job))
    first = wait_for("job NetworkPolicy", lambda: policy(memory_api))
    tampered = copy.deepcopy(first)
    tampered["metadata"]["ownerReferences"] = [{"apiVersion": "example.com/v1", "kind": "TrainJob", "name": JOB,
                                                "uid": "00000000-0000-0000-0000-000000000001", "controller": True}]
    memory_api.requests.clear()
    memory_api.put("networkpolicies", tampered)
    again = wait_for("the job's policy made again", lambda: (p := policy(memory_api)) and p["metadata"]["uid"] != first[
        "metadata"]["uid"] and p)
    assert again["metadata"]["ownerReferences"] == first["metadata"]["ownerReferences"]
    assert not [r for r in memory_api.requests if r.startswith("PATCH")], memory_api.requests


def test_an_earlier_jobs_policy_is_waited_out_and_a_strangers_left_alone(injecting_server, memory_api, caplog):
    """A policy of the name owned by an earlier job of that name is the garbage collector's to
    delete: the new job's comes after it. One that is not ours (made after admission looked) is
    left as it is."""
    running = injecting_server(reconcile=True)
    old, new = submitted(), submitted()
    assert running.review(old)["allowed"] is True
    memory_api.put("trainjobs", copy.deepcopy(old))
    wait_for("the earlier job's policy", lambda: policy(memory_api))
    memory_api.remove("trainjobs", NS, JOB)
    assert running.review(new)["allowed"] is True
    memory_api.put("trainjobs", copy.deepcopy(new))
    time.sleep(1.5)
    assert policy(memory_api)["metadata"]["ownerReferences"][0]["uid"] == old["metadata"]["uid"]
    memory_api.remove("networkpolicies", NS, POLICY)  # the garbage collector, at last
    made = wait_for("the new job's policy", lambda: (p := policy(memory_api)) and p["metadata"]["ownerReferences"][0][
        "uid"] == new["metadata"]["uid"] and p)
    assert made

    stranger = submitted("stranger")
    assert running.review(stranger)["allowed"] is True
    planted = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "stranger-mpi-isolation", "namespace": NS},
               "spec": {"podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"]}}
    memory_api.put("networkpolicies", copy.deepcopy(planted))
    time.sleep(0.3)
    with caplog.at_level("WARNING", logger="trainjob_admission.isolation"):
        memory_api.put("trainjobs", copy.deepcopy(stranger))
        time.sleep(1.0)
    assert policy(memory_api, "stranger-mpi-isolation")["spec"] == planted["spec"]
    assert [r.getMessage() for r in caplog.records if "stranger-mpi-isolation" in r.getMessage()] == [
        f"NetworkPolicy {NS}/stranger-mpi-isolation was not made by the service for TrainJob stranger (uid "
        f"{stranger['metadata']['uid']}): left as it is, so the job's pods are reachable as it allows"]


def test_the_namespaces_own_policy_is_kept_where_bundles_want_it(injecting_server, memory_api):
    isolated: dict[str, list[str]] = {NS: ["TrainJob"]}
    running = injecting_server(reconcile=True, isolated=isolated)
    made = wait_for("the namespace's isolating policy", lambda: policy(memory_api, ISOLATION))
    assert made["spec"]["podSelector"] == {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name",
                                                                 "operator": "Exists"}]}
    assert "ingress" not in made["spec"] and made["spec"]["policyTypes"] == ["Ingress"]
    memory_api.remove("networkpolicies", NS, ISOLATION)  # deleted by someone: made again at once
    wait_for("the isolating policy made again", lambda: policy(memory_api, ISOLATION), timeout=3)
    # a job admitted now finds it: admission writes nothing
    time.sleep(0.3)
    memory_api.requests.clear()
    assert running.review(submitted("quiet"))["allowed"] is True
    assert memory_api.requests == []
    isolated.clear()  # no bundle asks for NetworkPolicies there any more: ours goes
    wait_for("the isolating policy deleted", lambda: policy(memory_api, ISOLATION) is None)
