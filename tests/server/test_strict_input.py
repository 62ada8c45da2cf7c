"""Strict input: counts that the CRD's schema may not have checked (a forged review, an offline
file) and objects that are not what the review says they are are refused, never coerced."""
from __future__ import annotations

import pytest

from tests.support.objects import example_job
from trainjob_admission.webhook.cli.demo import admission_review

pytestmark = pytest.mark.server


@pytest.mark.parametrize("value, why", [("4", "got '4' (a string)"), (-5, "from 1 to 2147483647, got -5"),
                                        (0, "got 0"), (True, "got True (a boolean)"), (4.5, "got 4.5 (a number)")])
def test_num_nodes_must_be_a_positive_integer(shared_server, value, why):
    job = example_job("allowed.yaml")
    job["spec"]["trainer"]["numNodes"] = value
    response = shared_server.review(job)
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert "spec.trainer.numNodes must be an integer" in response["status"]["message"]
    assert why in response["status"]["message"]


def test_a_pod_declared_as_a_trainjob_is_refused(shared_server):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"},
           "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]}}
    review = admission_review(example_job("allowed.yaml"))
    review["request"]["object"] = pod  # request.kind and request.resource still say TrainJob
    status, body = shared_server.post("/validate", review)
    assert status == 200 and body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 400
    assert ("request.object is v1 Pod but request.kind is trainer.kubeflow.org/v1alpha1 TrainJob"
            in body["response"]["status"]["message"])


def test_a_resource_that_is_not_the_kinds_is_refused(shared_server):
    review = admission_review(example_job("allowed.yaml"))
    review["request"]["resource"] = {"group": "", "version": "v1", "resource": "pods"}
    status, body = shared_server.post("/mutate", review)
    assert status == 200 and body["response"]["allowed"] is False and "patch" not in body["response"]
    assert "is not trainer.kubeflow.org/v1alpha1 trainjobs" in body["response"]["status"]["message"]
