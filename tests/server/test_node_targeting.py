"""GPU node targeting through the real server: /mutate adds the tolerations and affinity of
examples/bundles/gpu-nodes.yaml, /validate of the mutated job finds nothing missing, and a GPU
product the bundle does not offer is refused with the list and the fix, however it is chosen."""
from __future__ import annotations

import jsonpatch
import pytest

from tests.support.objects import EXAMPLES, example_job

from .conftest import decode_patch, start_server, stop_server

pytestmark = pytest.mark.server
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def gpu_server(tmp_path):
    running, thread = start_server(tmp_path, ["builtin:default", str(EXAMPLES / "bundles" / "gpu-nodes.yaml")])
    yield running
    stop_server(running, thread)


def test_mutate_targets_gpu_pods_and_validate_accepts_the_result(gpu_server):
    obj = example_job("allowed.yaml")
    obj["metadata"]["annotations"] = {"trainjob-admission.io/gpu-product": "NVIDIA-H100-80GB-HBM3"}
    mutated = gpu_server.review(obj, "mutate")
    assert mutated["allowed"] is True
    stored = jsonpatch.apply_patch(obj, decode_patch(mutated))
    (own,) = [p for p in stored["spec"]["runtimePatches"] if p["manager"] == "trainjob-admission.io/webhook"]
    for rjob in own["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:  # both pods train with 1 GPU
        spec = rjob["template"]["spec"]["template"]["spec"]
        assert spec["tolerations"] == [GPU_TOLERATION]
        (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]} in term["matchExpressions"]
    validated = gpu_server.review(stored, "validate")
    assert validated["allowed"] is True, validated


def test_a_product_not_offered_is_refused_with_the_list(gpu_server):
    obj = example_job("allowed.yaml")
    obj["metadata"]["annotations"] = {"trainjob-admission.io/gpu-product": "Tesla-T4"}
    response = gpu_server.review(obj, "validate")
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "[gpu-nodes/gpu-node-targeting]" in message and "offered: NVIDIA-A100-SXM4-40GB, NVIDIA-A100-SXM4-80GB" in message
    assert message.endswith("NVIDIA-L40S): set the annotation to one of those, or remove it to run on any "
                            "nvidia.com/gpu node")


def test_a_node_selector_on_a_product_not_offered_is_refused(gpu_server):
    obj = example_job("allowed.yaml")
    obj["spec"]["runtimePatches"] = [{"manager": "acme.io/me", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4"}}}}}}]}}}}]
    response = gpu_server.review(obj, "validate")
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert "select nvidia.com/gpu.product=Tesla-T4" in message and "offered: NVIDIA-A100-SXM4-40GB" in message
    assert "remove that selection from spec.runtimePatches" in message
