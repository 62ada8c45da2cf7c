"""Duration limits through the real server: /mutate sets the default deadline, /validate refuses
a job over the maximum with the numbers, and an exception set by an allowed user is admitted
with the grant, and who made it, in the decision log; an MPIJob gets the cleanPodPolicy that
stops its workers at the deadline."""
from __future__ import annotations

import jsonpatch
import pytest
import yaml

from trainjob_admission.policies.checks.duration import ANNOTATION
from tests.support.objects import example_job, undated

from .conftest import decode_patch, start_server, stop_server

pytestmark = pytest.mark.server
DAY = 86400
BUNDLE = {"apiVersion": "policy.trainjob-admission.io/v1alpha1", "kind": "PolicyBundle",
          "metadata": {"name": "durations"},
          "spec": {"checks": {"duration": {"defaultSeconds": DAY, "maxSeconds": 7 * DAY,
                                           "exceptions": {"groups": ["platform-admins"]}}}}}


@pytest.fixture
def server(tmp_path):
    bundle = tmp_path / "durations.yaml"
    bundle.write_text(yaml.safe_dump(BUNDLE))
    running, thread = start_server(tmp_path, ["builtin:default", str(bundle)])
    yield running
    stop_server(running, thread)


def long_job(annotate: bool = False) -> dict:
    obj = example_job("allowed.yaml")
    obj["spec"]["activeDeadlineSeconds"] = 14 * DAY
    if annotate:
        obj["metadata"]["annotations"] = {ANNOTATION: str(14 * DAY)}
    return obj


def test_mutate_sets_the_default_and_validate_admits_the_result(server):
    obj = undated(example_job("allowed.yaml"))
    mutated = server.review(obj, "mutate")
    assert {"op": "add", "path": "/spec/activeDeadlineSeconds", "value": DAY} in decode_patch(mutated)
    stored = jsonpatch.apply_patch(obj, decode_patch(mutated))
    assert server.review(stored, "validate")["allowed"] is True


def test_over_the_maximum_is_refused_with_the_numbers(server):
    response = server.review(long_job())
    assert response["allowed"] is False
    assert ("spec.activeDeadlineSeconds is 1209600 (14 d); the maximum is 604800 (7 d): lower "
            "spec.activeDeadlineSeconds to 604800 or less, or ask a member of platform-admins") in response["status"]["message"]


def test_an_exception_by_an_admin_is_admitted_and_logged_with_its_grantor(server):
    refused = server.review(long_job(annotate=True))  # the default submitter, alice, may not grant it
    assert refused["allowed"] is False and "set by alice, who may not grant" in refused["status"]["message"]
    admitted = server.review(long_job(annotate=True), userInfo={"username": "carol", "groups": ["platform-admins"]})
    assert admitted["allowed"] is True
    assert any("duration exception granted by carol (group platform-admins)" in w for w in admitted["warnings"])
    record = server.records()[-1]
    assert record["user"] == "carol" and record["decision"] == "warn"
    (grant,) = [r for r in record["rules"] if r["rule"] == "duration" and r["effect"] == "warn"]
    assert grant["messages"][0].startswith("duration exception granted by carol (group platform-admins): "
                                           "spec.activeDeadlineSeconds is 1209600 (14 d)")


def test_an_mpijob_gets_a_clean_pod_policy_that_stops_its_workers_at_the_deadline(server):
    obj = undated(example_job("legacy-mpijob.yaml"))
    mutated = server.review(obj, "mutate")
    stored = jsonpatch.apply_patch(obj, decode_patch(mutated))
    assert stored["spec"]["runPolicy"] == {"activeDeadlineSeconds": DAY, "cleanPodPolicy": "Running"}
    assert server.review(stored, "validate")["allowed"] is True
    stored["spec"]["runPolicy"]["cleanPodPolicy"] = "None"
    refused = server.review(stored, "validate")
    assert refused["allowed"] is False
    assert ("the other nodes (Worker replicas) keep running and holding their GPUs: set spec.runPolicy.cleanPodPolicy to Running (or All)"
            in refused["status"]["message"])
